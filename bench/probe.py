"""Measurements that need a fresh process: resuming an approval, and peak memory of a long thread.

Run by `bench.run` as `python -m bench.probe resume|memory ...`; prints one JSON object on the last line.
Import time is measured separately from the work, since it is the same for every thread length.
"""

from __future__ import annotations

import time

_T_START = time.perf_counter()

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Any  # noqa: E402

from langgraph.types import Command  # noqa: E402

from bench.anchor import open_system  # noqa: E402
from bench.scenarios import APPROVE, SYSTEMS, check_done, config, run_turn  # noqa: E402

_T_IMPORTED = time.perf_counter()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 2)


def resume(system: Any, db: str, thread_id: str, turn: int) -> dict[str, Any]:
    """Open the file, load the paused thread, approve, and run the turn to its answer."""
    started = time.perf_counter()
    with open_system(system, db) as graph:
        opened = time.perf_counter()
        snapshot = graph.get_state(config(thread_id))
        if not snapshot.interrupts:
            raise SystemExit(f"{system}: thread {thread_id} in {db} is not paused")
        loaded = time.perf_counter()
        out = graph.invoke(Command(resume=APPROVE), config(thread_id), durability="sync")
        check_done(system, out, turn)
        resumed = time.perf_counter()
        messages = len(out["messages"])
    return {
        "import_ms": _ms(_T_IMPORTED - _T_START),
        "open_ms": _ms(opened - started),
        "load_ms": _ms(loaded - opened),
        "resume_ms": _ms(resumed - loaded),
        "total_ms": _ms(resumed - started),
        "messages": messages,
    }


def memory(system: Any, db: str, turns: int, kind: Any, trace: bool) -> dict[str, Any]:
    """Run `turns` turns on one thread; report peak RSS and (with --trace) tracemalloc's peak."""
    with open_system(system, db) as graph:
        gc.collect()
        before = _rss_mb()
        if trace:
            tracemalloc.start()
        started = time.perf_counter()
        for turn in range(1, turns + 1):
            run_turn(system, graph, "mem", turn, kind)
        elapsed = time.perf_counter() - started
        result: dict[str, Any] = {"rss_before_mb": before, "rss_peak_mb": _rss_mb(), "seconds": round(elapsed, 3)}
        if trace:
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            result.update(tracemalloc_peak_mb=round(peak / 2**20, 2), tracemalloc_end_mb=round(current / 2**20, 2))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    p_resume = sub.add_parser("resume")
    p_resume.add_argument("--system", choices=SYSTEMS, required=True)
    p_resume.add_argument("--db", required=True)
    p_resume.add_argument("--thread", required=True)
    p_resume.add_argument("--turn", type=int, required=True)
    p_memory = sub.add_parser("memory")
    p_memory.add_argument("--system", choices=SYSTEMS, required=True)
    p_memory.add_argument("--db", required=True)
    p_memory.add_argument("--turns", type=int, required=True)
    p_memory.add_argument("--kind", choices=("read", "write"), default="write")
    p_memory.add_argument("--trace", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "resume":
        result = resume(args.system, args.db, args.thread, args.turn)
    else:
        result = memory(args.system, args.db, args.turns, args.kind, args.trace)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
