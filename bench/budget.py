"""Where an approval turn's CPU goes, by part of the work: what the gate needs beyond the floor, with its cost.

    .venv/bin/python -m bench.budget --turns 50 --reps 3

One thread of `turns` approval turns under `invoke` (the shape of `bench.run`'s "approval every turn" row), for
gatedloop and the anchor, each in a child process on a fresh SQLite file, and the floor (`bench.floor turns`) in
the same run. Each turn's CPU (`process_time`, all threads) is split by the thread-CPU clock around the parts
every tool-calling agent has and the parts only the gate has:

- `model call`: LangChain's `BaseChatModel.invoke` (callbacks, message normalizing, the scripted model itself);
- `tool run`: `BaseTool.invoke` (argument validation, callbacks, the tool);
- `ledger writes` and `ledger reads`: gatedloop's evidence in SQLite (`SqliteLedger`'s write transactions, the
  hash chain included, and its reads); the anchor has none;
- `rest`: everything else, LangGraph's supersteps and checkpoints for the graph, and the gate's checks (or the
  anchor's middleware).

The floor is the same graph as gatedloop's with nodes that do nothing: no model call, no tool, no ledger. Prints a
table, then one JSON object on its last line. The clocks are hand-written wrappers (no library splits CPU by
caller-chosen parts; a sampling profiler's overhead moves the split it measures); the wrapped calls are never
nested in one another, and a part's nested calls of itself are counted once.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.anchor import open_system
from bench.probe import warm_up
from bench.run import child
from bench.scenarios import run_turn

PARTS = ("model call", "tool run", "ledger writes", "ledger reads")


class PartClocks:
    """CPU seconds and calls per part, summed over threads; each wrapped method adds its own thread's time."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._depth = threading.local()

    def wrap(self, owner: type, method: str, part: str) -> None:
        original: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, part, 0)
            setattr(self._depth, part, depth + 1)
            started = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                setattr(self._depth, part, depth)
                if depth == 0:
                    self.seconds[part] += time.thread_time() - started
                    self.calls[part] += 1

        setattr(owner, method, timed)


def install() -> PartClocks:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.tools import BaseTool

    from gatedloop.checkpoints.ledger import SqliteLedger

    clocks = PartClocks()
    clocks.wrap(BaseChatModel, "invoke", "model call")
    clocks.wrap(BaseTool, "invoke", "tool run")
    clocks.wrap(SqliteLedger, "_transaction", "ledger writes")
    clocks.wrap(SqliteLedger, "_write_plain", "ledger writes")
    clocks.wrap(SqliteLedger, "_run", "ledger reads")
    return clocks


def one_system(system: str, turns: int) -> dict[str, Any]:
    """`turns` approval turns on one thread of `system`, warmed up first; CPU per turn, split by part."""
    with tempfile.TemporaryDirectory() as work:
        warm_up(system, f"{work}/warm.sqlite")
        clocks = install()
        with open_system(system, f"{work}/budget.sqlite") as graph:  # type: ignore[arg-type]
            started = time.process_time()
            for turn in range(1, turns + 1):
                run_turn(system, graph, "budget", turn, "write")  # type: ignore[arg-type]
            total = time.process_time() - started
    parts = {part: clocks.seconds[part] * 1000 / turns for part in PARTS}
    return {
        "system": system,
        "turns": turns,
        "cpu_ms_per_turn": total * 1000 / turns,
        "parts_ms_per_turn": parts,
        "calls_per_turn": {part: clocks.calls[part] / turns for part in PARTS},
        "rest_ms_per_turn": total * 1000 / turns - sum(parts.values()),
    }


def compare(turns: int, reps: int) -> dict[str, Any]:
    """Medians over `reps` runs of gatedloop, the anchor and the floor, interleaved so a slow spell hits all."""
    runs: dict[str, list[dict[str, Any]]] = {"gatedloop": [], "anchor": []}
    floor: list[float] = []
    for _ in range(reps):
        for system in runs:
            runs[system].append(child("bench.budget", ["--system", system, "--turns", str(turns)]))
        floor.append(child("bench.floor", ["turns", "--saver", "gated", "--turns", str(turns)])["cpu_ms_per_turn"])

    def median(system: str, pick: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(pick(r) for r in runs[system])

    summary: dict[str, Any] = {"turns": turns, "reps": reps, "floor_cpu_ms_per_turn": statistics.median(floor)}
    for system in runs:
        summary[system] = {
            "cpu_ms_per_turn": median(system, lambda r: r["cpu_ms_per_turn"]),
            "rest_ms_per_turn": median(system, lambda r: r["rest_ms_per_turn"]),
            "parts_ms_per_turn": {p: median(system, lambda r, p=p: r["parts_ms_per_turn"][p]) for p in PARTS},
            "calls_per_turn": {p: median(system, lambda r, p=p: r["calls_per_turn"][p]) for p in PARTS},
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    floor = summary["floor_cpu_ms_per_turn"]
    rows = [
        "| ms of CPU per approval turn | gatedloop | anchor | floor |",
        "| --- | ---: | ---: | ---: |",
    ]
    for part in PARTS:
        cells = []
        for system in ("gatedloop", "anchor"):
            ms, calls = summary[system]["parts_ms_per_turn"][part], summary[system]["calls_per_turn"][part]
            cells.append(f"{ms:.2f} ({calls:.1f} calls)" if calls else "0")
        rows.append(f"| {part} | {' | '.join(cells)} | 0 |")
    rest = [f"{summary[system]['rest_ms_per_turn']:.2f}" for system in ("gatedloop", "anchor")]
    rows.append(f"| rest (LangGraph; gate checks or HITL middleware) | {' | '.join(rest)} | {floor:.2f} |")
    rows.append(
        f"| all | {summary['gatedloop']['cpu_ms_per_turn']:.2f} | {summary['anchor']['cpu_ms_per_turn']:.2f}"
        f" | {floor:.2f} |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--system", choices=("gatedloop", "anchor"), help="one run of one system (a child)")
    args = parser.parse_args(argv)
    if args.system:
        print(json.dumps(one_system(args.system, args.turns)))
        return
    summary = compare(args.turns, args.reps)
    print(table(summary))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
