"""What the CLI prints: human lines, or (with --json) JSON lines on stdout and every failure as one JSON object on
stderr, so a script reads each stream with `json.loads` per line whatever happened."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

from gatedloop.graph.display import Display


def wants_json(argv: list[str]) -> bool:
    """`--json` among the options, known before parsing so that a usage error is JSON too (after `--` it is an
    argument, as argparse reads it)."""
    return "--json" in (argv[: argv.index("--")] if "--" in argv else argv)


class Output:
    """Human lines, or (with --json) JSON lines only: everything else goes to stderr or nowhere."""

    def __init__(self, as_json: bool, display: Display | None = None):
        self.as_json = as_json
        self.display = display or Display()  # the graph's (Display.for_graph) wherever a call can be printed

    def say(self, text: str) -> None:
        if not self.as_json:
            print(text, flush=True)

    def record(self, kind: str, **fields: Any) -> None:
        if self.as_json:
            print(self.display.json_line({"type": kind, **fields}), flush=True)

    def error(self, message: str, code: int) -> None:
        """A failure on stderr: `gatedloop: MESSAGE`, or `{"type": "error", "error": MESSAGE, "exit": CODE}`."""
        if self.as_json:
            failure = {"type": "error", "error": message, "exit": code}
            print(self.display.json_line(failure), file=sys.stderr, flush=True)
        else:
            print(f"gatedloop: {message}", file=sys.stderr, flush=True)

    def events(self, events: Iterator[tuple[str, Any]], indent: str = "") -> None:
        for mode, chunk in events:
            if mode == "custom":
                if self.as_json:
                    self.record("tool", **chunk) if isinstance(chunk, dict) else self.record("custom", data=chunk)
                elif isinstance(chunk, dict) and chunk.get("event") == "tool_finished":
                    self.say(f"{indent}  … {chunk['tool']} {chunk['outcome']} in {chunk['duration_ms']:.0f} ms")
                continue
            for node, update in chunk.items():
                if node == "__interrupt__":
                    continue  # the pending request is printed once, after the run, with the thread id
                if self.as_json:
                    self.record("step", node=node, update=self.display.shown_update(update))
                else:
                    for line in self.display.step_lines(node, update):
                        self.say(indent + line)


class OneLineFormatter(logging.Formatter):
    """Log records as one line, never a traceback (those need --debug)."""

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().splitlines() or [""]
        return f"gatedloop: {record.levelname.lower()} ({record.name}): {lines[0]}"


class JsonLineFormatter(logging.Formatter):
    """Under --json: a log record as `{"type": "log", ...}`, so stderr stays JSON lines."""

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().splitlines() or [""]
        record_json = {"type": "log", "level": record.levelname.lower(), "logger": record.name, "message": lines[0]}
        return json.dumps(record_json, ensure_ascii=False)


def configure_logging(debug: bool, as_json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if debug:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
        logging.getLogger("gatedloop").setLevel(logging.DEBUG)
        return
    handler.setFormatter(JsonLineFormatter() if as_json else OneLineFormatter())
    logging.basicConfig(level=logging.ERROR, handlers=[handler], force=True)
