"""`gatedloop stats [--since T] [--json]`: how approval requests fared, per tool and per reviewer (reviewer
telemetry, docs/observability.md), read from the ledger of `--db` without changing it.

The numbers come from `checkpoints/review_stats.py`; this module only chooses the window and prints them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from gatedloop.checkpoints.review_stats import (
    RUBBER_STAMP_MAX_MEDIAN_S,
    RUBBER_STAMP_MIN_APPROVAL_RATE,
    RUBBER_STAMP_MIN_DECISIONS,
    reviewer_stats,
    since_moment,
    thresholds,
    tool_stats,
)
from gatedloop.cli.app import EXIT_COMPLETED, EXIT_USAGE, CliError, open_saver, shown_db
from gatedloop.cli.output import Output
from gatedloop.graph.display import day_and_clock

FLAG = (
    f"rubber stamp? ({RUBBER_STAMP_MIN_DECISIONS}+ decisions, >= {RUBBER_STAMP_MIN_APPROVAL_RATE:.0%} approved, "
    f"median under {RUBBER_STAMP_MAX_MEDIAN_S:g} s)"
)


def window_start(text: str | None, now: float) -> float | None:
    """--since: a duration back from now (`90m`, `24h`, `7d`), or a time as `audit export` takes it."""
    if text is None:
        return None
    try:
        return since_moment(text, now)
    except ValueError as exc:
        raise CliError(f"--since {text!r}: {exc}", EXIT_USAGE) from None


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict[str, Any]], str]]]) -> list[str]:
    """Left-aligned first column, right-aligned numbers, each as wide as its widest cell."""
    cells = [[name for name, _ in columns]] + [[show(row) for _, show in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    ]


def cmd_stats(args: argparse.Namespace) -> int:
    out = Output(args.json)
    since = window_start(args.since, time.time())
    with open_saver(args.db, read_only=True) as saver:
        history = saver.ledger.review_history(since)
    tools, reviewers = tool_stats(history), reviewer_stats(history)
    out.record("stats", since=since, tools=tools, reviewers=reviewers, thresholds=thresholds())
    out.say(f"approval requests asked since {day_and_clock(since)}" if since is not None else "all approval requests")
    if not tools:
        out.say(f"none in {shown_db(args.db)}")
        return EXIT_COMPLETED
    out.say("")
    decided: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("approved", lambda r: str(r["approved"])),
        ("edited", lambda r: str(r["edited"])),
        ("rejected", lambda r: str(r["rejected"])),
        ("responded", lambda r: str(r["responded"])),
        ("approval rate", lambda r: _rate(r["approval_rate"])),
        ("median", lambda r: _seconds(r["median_s"])),
        ("p90", lambda r: _seconds(r["p90_s"])),
    ]
    for line in _table(
        tools,
        [
            ("tool", lambda r: r["tool"]),
            ("asked", lambda r: str(r["asked"])),
            ("decided", lambda r: str(r["decided"])),
            *decided,
            ("expired", lambda r: str(r["expired"])),
            ("sent back", lambda r: str(r["sent_back"])),
            ("granted", lambda r: str(r["granted"])),
            ("limit refused", lambda r: str(r["limit_refused"])),
        ],
    ):
        out.say(line)
    out.say("")
    lines = _table(
        reviewers, [("reviewer", lambda r: r["reviewer"]), ("decided", lambda r: str(r["decisions"])), *decided]
    )
    out.say(lines[0])
    for line, row in zip(lines[1:], reviewers, strict=True):
        out.say(line + (f"  {FLAG}" if row["rubber_stamp"] else ""))
    return EXIT_COMPLETED


def add_command(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`stats`, on the main parser's `command` factory."""
    stats = command(
        "stats",
        "approval requests per tool and reviewer: asked, decided, approval rate, time to decide; per tool also what"
        " grants and limits did (sent back, granted, limit refused)",
    )
    stats.add_argument(
        "--since", metavar="TIME", help="only requests asked since: 7d, 24h, 90m, an ISO 8601 time or epoch seconds"
    )
    stats.set_defaults(func=cmd_stats)
