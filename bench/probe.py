"""The measurements `bench.run` makes in child processes; each prints one JSON object on its last line.

- `long`: one thread of N turns (per-turn wall times, stored bytes sampled between turns, peak RSS), and
  optionally a copy of the file with the thread paused at an approval at given lengths (for `resume`).
- `growth`: turns 26-50 of one thread and 376-400 of another (one read per turn), one turn of each in turn: the
  long thread's growth with both windows under the same machine conditions.
- `resume`: a fresh process opens a copy, loads the paused thread and approves it.
- `concurrency`: many async threads at once on one file, with a stall watchdog (a hung run is reported,
  not waited on forever: a deadlocked executor thread cannot be stopped, so the child exits hard).
- `memory`: a thread of N turns under tracemalloc (optional; `long` already reports peak RSS).

Import time is measured apart from the work, since it is the same for every thread length.
"""

from __future__ import annotations

import time

_T_START = time.perf_counter()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
import tracemalloc  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from langgraph.types import Command  # noqa: E402

from bench import thread_cpu  # noqa: E402
from bench.anchor import Driver, open_async_system, open_system  # noqa: E402
from bench.scenarios import (  # noqa: E402
    APPROVE,
    SYSTEMS,
    arun_turn,
    check_done,
    config,
    run_turn,
    start_paused,
    stored_bytes,
)

_T_IMPORTED = time.perf_counter()


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 2)


def copy_db(src: str | Path, dst: str | Path) -> None:
    """A consistent copy of a live database (SQLite's backup API), WAL folded in."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    source, target = sqlite3.connect(str(src), timeout=10.0), sqlite3.connect(str(dst))
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def warm_up(system: Any, db: str) -> None:
    """First-use costs (lazy imports, schema building) paid on a scratch file before anything is timed."""
    with open_system(system, db) as graph:
        for turn, kind in enumerate(("read", "write"), start=1):
            run_turn(system, graph, "warm", turn, kind)  # type: ignore[arg-type]
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


def long(
    system: Any, kind: Any, db: str, lengths: list[int], sample_every: int, pause_at: list[int], copy_prefix: str
) -> dict[str, Any]:
    """One thread of max(lengths) turns. A turn paused for a copy is timed without the copy.

    Each turn's wall time and CPU time (`process_time`: all threads of this process) are recorded; CPU
    time is far less sensitive than wall time to other processes competing for the machine.
    """
    last = max(lengths)
    samples: dict[int, dict[str, int]] = {}
    turn_s: list[float] = []
    turn_cpu_s: list[float] = []
    copies: dict[int, str] = {}
    approvals = 0
    warm_up(system, f"{db}.warm")
    with open_system(system, db) as graph:
        gc.collect()
        before = _rss_mb()
        for turn in range(1, last + 1):
            if turn in pause_at:
                started, cpu = time.perf_counter(), time.process_time()
                start_paused(system, graph, "long", turn)
                first, first_cpu = time.perf_counter() - started, time.process_time() - cpu
                copies[turn] = f"{copy_prefix}-{turn}.sqlite"
                copy_db(db, copies[turn])
                started, cpu = time.perf_counter(), time.process_time()
                out = graph.invoke(Command(resume=APPROVE), config("long"), durability="sync")
                check_done(system, out, turn)
                turn_s.append(first + time.perf_counter() - started)
                turn_cpu_s.append(first_cpu + time.process_time() - cpu)
                approvals += 1
            else:
                started, cpu = time.perf_counter(), time.process_time()
                approvals += run_turn(system, graph, "long", turn, kind)
                turn_s.append(time.perf_counter() - started)
                turn_cpu_s.append(time.process_time() - cpu)
            if turn % sample_every == 0 or turn in lengths:
                samples[turn] = asdict(stored_bytes(db))
    expected = last if kind == "write" else len(pause_at)
    if approvals != expected:
        raise AssertionError(f"{system}/{kind}: {approvals} approvals in {last} turns, expected {expected}")
    return {
        "turn_s": turn_s,
        "turn_cpu_s": turn_cpu_s,
        "samples": samples,
        "copies": copies,
        "rss_before_mb": before,
        "rss_peak_mb": _rss_mb(),
    }


def growth(system: Any, db: str, short: int, long_: int, window: int) -> dict[str, Any]:
    """The long thread's growth measured side by side: two threads of one read per turn, brought untimed to
    `short - window` and `long_ - window` turns, then their next `window` turns one of each in turn, so both
    windows run under the same machine conditions (on a shared machine, `long`'s windows, seconds apart, see
    different neighbours). CPU time (`process_time`, all threads) and the main thread's, per turn. A full garbage
    collection first, so that the next one (one in several hundred turns, 80-90 ms whatever the thread's length)
    does not land in one window by chance."""
    timed: dict[str, list[tuple[float, float]]] = {"short": [], "long": []}
    warm_up(system, f"{db}.warm")
    with open_system(system, db) as graph:
        for turn in range(1, long_ - window + 1):
            run_turn(system, graph, "long", turn, "read")
            if turn <= short - window:
                run_turn(system, graph, "short", turn, "read")
        gc.collect()  # a full collection costs the same at either length (the heap hardly grows with the thread)
        for offset in range(window):
            for name, turn in (("short", short - window + 1 + offset), ("long", long_ - window + 1 + offset)):
                cpu, main = time.process_time(), time.thread_time()
                run_turn(system, graph, name, turn, "read")
                timed[name].append((time.process_time() - cpu, time.thread_time() - main))
    mean = {name: [sum(t[i] for t in turns) / window * 1000 for i in (0, 1)] for name, turns in timed.items()}
    return {
        "turns": [short, long_],
        "window": window,
        "cpu_ms_per_turn": [round(mean["short"][0], 3), round(mean["long"][0], 3)],
        "main_thread_cpu_ms_per_turn": [round(mean["short"][1], 3), round(mean["long"][1], 3)],
        "growth": round(mean["long"][0] / mean["short"][0], 3),
        "main_thread_growth": round(mean["long"][1] / mean["short"][1], 3),
        "load_average": round(os.getloadavg()[0], 2),
    }


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


def _is_lock_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return "locked" in text or "busy" in text


async def concurrency(
    system: Any,
    db: str,
    threads: int,
    turns: int,
    stall_s: float,
    pool: int,
    prefix: str = "conc",
    start_at: float = 0.0,
    driver: Driver = "default",
) -> dict[str, Any]:
    """`threads` threads at once, `turns` approval turns each; stops at the first stall of `stall_s` seconds.
    `prefix` names the threads and `start_at` (epoch seconds) holds the start, so that several processes
    (`bench.processes`) share one file with threads of their own and start together."""
    if pool:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(pool, thread_name_prefix="asyncio"))
    errors: list[str] = []
    lock_errors = 0
    done_turns = 0
    async with open_async_system(system, db, driver) as graph:

        async def one_thread(index: int) -> None:
            nonlocal lock_errors, done_turns
            for turn in range(1, turns + 1):
                try:
                    await arun_turn(system, graph, f"{prefix}-{index}", turn, "write")
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    lock_errors += _is_lock_error(exc)
                    return
                done_turns += 1

        await asyncio.sleep(max(0.0, start_at - time.time()))
        started, started_epoch, cpu_before = time.perf_counter(), time.time(), thread_cpu.snapshot()
        work = asyncio.gather(*(one_thread(i) for i in range(threads)))
        seen, quiet_since, hung = -1, time.perf_counter(), False
        while not work.done():
            await asyncio.wait([work], timeout=0.25)
            if done_turns != seen:
                seen, quiet_since = done_turns, time.perf_counter()
            elif time.perf_counter() - quiet_since > stall_s:
                hung = True
                break
        wall = (quiet_since if hung else time.perf_counter()) - started
        cpu_after = thread_cpu.snapshot()
        result = {
            "wall_s": round(wall, 4),
            "started_epoch": started_epoch,
            "ended_epoch": started_epoch + wall,
            "turns": done_turns,
            "turns_expected": threads * turns,
            "turns_per_s": done_turns / wall if wall > 0 else 0.0,
            "errors": len(errors),
            "lock_errors": lock_errors,
            "hung": hung,
            "stall_s": stall_s,
            "default_executor_workers": pool or min(32, (os.cpu_count() or 1) + 4),
            "cpu_ms_per_turn_by_thread": thread_cpu.split(cpu_before, cpu_after, max(done_turns, 1)),
            "switches_per_turn_by_thread": thread_cpu.split_switches(cpu_before, cpu_after, max(done_turns, 1)),
            "error_samples": sorted(set(errors))[:5],
        }
        if hung:
            result["stacks"] = thread_stacks()
            # Executor threads blocked forever cannot be joined; report and leave at once.
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
            os._exit(0)
    return result


def thread_stacks(depth: int = 4) -> list[dict[str, Any]]:
    """Where every thread of this process is, grouped: the innermost `depth` frames and how many threads."""
    import collections
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    groups: collections.Counter[tuple[str, ...]] = collections.Counter()
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)[-depth:]
        where = tuple(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames)
        groups[(names.get(ident, "?").rstrip("0123456789_"), *where)] += 1
    return [{"threads": n, "name": key[0], "stack": list(key[1:])} for key, n in groups.most_common()]


def memory(system: Any, db: str, turns: int, kind: Any) -> dict[str, Any]:
    """Run `turns` turns on one thread under tracemalloc (started after imports and graph build)."""
    with open_system(system, db) as graph:
        gc.collect()
        tracemalloc.start()
        started = time.perf_counter()
        for turn in range(1, turns + 1):
            run_turn(system, graph, "mem", turn, kind)
        elapsed = time.perf_counter() - started
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {
        "tracemalloc_peak_mb": round(peak / 2**20, 2),
        "tracemalloc_end_mb": round(current / 2**20, 2),
        "rss_peak_mb": _rss_mb(),
        "seconds": round(elapsed, 3),
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("long", "growth", "resume", "concurrency", "memory"):
        p = sub.add_parser(name)
        p.add_argument("--system", choices=SYSTEMS, required=True)
        p.add_argument("--db", required=True)
    p = sub.choices["long"]
    p.add_argument("--kind", choices=("read", "write"), required=True)
    p.add_argument("--lengths", type=_ints, required=True)
    p.add_argument("--sample-every", type=int, default=25)
    p.add_argument("--pause-at", type=_ints, default=[])
    p.add_argument("--copy-prefix", default="")
    p = sub.choices["growth"]
    p.add_argument("--short", type=int, default=50, help="the short thread's last timed turn")
    p.add_argument("--long", dest="long_", type=int, default=400, help="the long thread's last timed turn")
    p.add_argument("--window", type=int, default=25, help="timed turns of each")
    p = sub.choices["resume"]
    p.add_argument("--thread", required=True)
    p.add_argument("--turn", type=int, required=True)
    p = sub.choices["concurrency"]
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--turns", type=int, required=True)
    p.add_argument("--stall-s", type=float, default=15.0)
    p.add_argument("--pool", type=int, default=0, help="default executor size (0: asyncio's default)")
    p.add_argument("--prefix", default="conc", help="thread ids are PREFIX-0, PREFIX-1, ...")
    p.add_argument("--start-at", type=float, default=0.0, help="epoch seconds to start at (several processes)")
    p.add_argument(
        "--driver",
        choices=("default", "on-loop", "aiosqlite"),
        default="default",
        help="the async saver's way to SQLite (default: gatedloop on the loop, the anchor through aiosqlite)",
    )
    p = sub.choices["memory"]
    p.add_argument("--turns", type=int, required=True)
    p.add_argument("--kind", choices=("read", "write"), default="write")
    args = parser.parse_args(argv)
    if args.what == "long":
        result = long(args.system, args.kind, args.db, args.lengths, args.sample_every, args.pause_at, args.copy_prefix)
    elif args.what == "growth":
        result = growth(args.system, args.db, args.short, args.long_, args.window)
    elif args.what == "resume":
        result = resume(args.system, args.db, args.thread, args.turn)
    elif args.what == "concurrency":
        result = asyncio.run(
            concurrency(
                args.system,
                args.db,
                args.threads,
                args.turns,
                args.stall_s,
                args.pool,
                args.prefix,
                args.start_at,
                args.driver,
            )
        )
    else:
        result = memory(args.system, args.db, args.turns, args.kind)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
