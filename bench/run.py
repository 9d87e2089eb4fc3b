"""gatedloop vs LangChain's create_agent + HumanInTheLoopMiddleware, side by side, in one run.

    .venv/bin/python -m bench.run [--quick] [--out bench/out/]

Measures stored checkpoint bytes and orchestration time per turn on long threads (with and without an
approval every turn), fresh-process resume latency, one turn of 8 slow reads, 50 concurrent async threads
on one SQLite file, and peak memory; writes results.json, results.md and stored_bytes.png to --out.
See bench/README.md for what each figure means and how the targets are judged.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

from langgraph.types import Command

from bench.anchor import open_async_system, open_system
from bench.report import judge, markdown
from bench.scenarios import (
    APPROVE,
    SLOW_READ_S,
    SLOW_READS,
    SYSTEMS,
    Kind,
    System,
    arun_turn,
    check_done,
    config,
    run_turn,
    start_paused,
    stored_bytes,
)

ROOT = Path(__file__).resolve().parent.parent
MODES: tuple[Kind, ...] = ("read", "write")


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]
    reps: int
    sample_every: int
    resume_lengths: tuple[int, int]
    resume_trials: int
    read_trials: int
    threads: int
    thread_turns: int
    concurrency_reps: int
    memory_turns: int
    memory_reps: int


FULL = Plan((50, 200, 400), 3, 25, (10, 400), 5, 5, 50, 4, 3, 400, 1)
QUICK = Plan((5, 10, 20), 1, 5, (3, 10), 2, 2, 10, 2, 1, 20, 1)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def window(plan: Plan, length: int) -> int:
    """How many turns before `length` the "at this length" per-turn time averages over."""
    return max(1, min(25, length // 2))


# --- long threads: stored bytes and time per turn -------------------------------------------------


def long_thread(system: System, kind: Kind, path: Path, plan: Plan) -> dict[str, Any]:
    """One thread of max(lengths) turns; per-turn wall times, and stored bytes sampled between turns."""
    last = max(plan.lengths)
    samples: dict[int, dict[str, int]] = {}
    turn_s: list[float] = []
    approvals = 0
    with open_system(system, path) as graph:
        for turn in range(1, last + 1):
            started = time.perf_counter()
            approvals += run_turn(system, graph, "long", turn, kind)
            turn_s.append(time.perf_counter() - started)
            if turn % plan.sample_every == 0 or turn in plan.lengths:
                samples[turn] = asdict(stored_bytes(path))
    expected = last if kind == "write" else 0
    if approvals != expected:
        raise AssertionError(f"{system}/{kind}: {approvals} approvals in {last} turns, expected {expected}")
    return {"turn_s": turn_s, "samples": samples}


def bench_long(plan: Plan, work: Path) -> list[dict[str, Any]]:
    runs = []
    for rep in range(plan.reps):
        for kind in MODES:
            order = SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))
            for system in order:
                path = work / f"long-{system}-{kind}-{rep}.sqlite"
                gc.collect()
                started = time.perf_counter()
                run = long_thread(system, kind, path, plan)
                log(f"long thread {system}/{kind} rep {rep + 1}: {time.perf_counter() - started:.1f}s")
                runs.append({"system": system, "kind": kind, "rep": rep, **run})
                _remove_db(path)
    return runs


def summarize_long(plan: Plan, runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    storage: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    for system in SYSTEMS:
        for kind in MODES:
            mine = [r for r in runs if r["system"] == system and r["kind"] == kind]
            if not mine:
                continue
            storage.setdefault(system, {})[kind] = {str(n): _storage_at(mine, n) for n in plan.lengths}
            timing.setdefault(system, {})[kind] = {str(n): _timing_at(plan, mine, n) for n in plan.lengths}
            turns = sorted(mine[0]["samples"])
            curves.setdefault(system, {})[kind] = [
                {
                    "turn": t,
                    "blob_bytes": median(
                        [r["samples"][t]["checkpoint_blobs"] + r["samples"][t]["write_blobs"] for r in mine]
                    ),
                    "file_bytes": median([r["samples"][t]["file_bytes"] for r in mine]),
                }
                for t in turns
            ]
    return storage, timing, curves


def _storage_at(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    at = [r["samples"][n] for r in runs]
    blob = median([s["checkpoint_blobs"] + s["write_blobs"] for s in at])
    return {
        "blob_bytes": blob,
        "checkpoint_blobs": median([s["checkpoint_blobs"] for s in at]),
        "write_blobs": median([s["write_blobs"] for s in at]),
        "file_bytes": median([s["file_bytes"] for s in at]),
        "blob_bytes_per_turn": blob / n,
        "file_bytes_per_turn": median([s["file_bytes"] for s in at]) / n,
        "checkpoint_rows": median([s["checkpoints"] for s in at]),
        "write_rows": median([s["writes"] for s in at]),
    }


def _timing_at(plan: Plan, runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    w = window(plan, n)
    cumulative = [sum(r["turn_s"][:n]) / n * 1000 for r in runs]
    recent = [sum(r["turn_s"][n - w : n]) / w * 1000 for r in runs]
    return {
        "mean_ms_per_turn": median(cumulative),
        "window_ms_per_turn": median(recent),
        "window_turns": w,
        "runs_mean_ms": [round(x, 3) for x in cumulative],
        "runs_window_ms": [round(x, 3) for x in recent],
    }


# --- resume in a fresh process ---------------------------------------------------------------------


def _copy_db(src: Path, dst: Path) -> None:
    """A consistent copy of a live database (SQLite's backup API), WAL folded in."""
    _remove_db(dst)
    with sqlite3.connect(str(src), timeout=10.0) as source, sqlite3.connect(str(dst)) as target:
        source.backup(target)
    source.close()
    target.close()


def _remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(f"{path}.leases", ignore_errors=True)


def prepare_paused(system: System, work: Path, lengths: tuple[int, ...]) -> dict[int, Path]:
    """One thread of approval turns; at each length its last turn is paused and the file copied."""
    path = work / f"resume-{system}.sqlite"
    copies: dict[int, Path] = {}
    with open_system(system, path) as graph:
        for turn in range(1, max(lengths) + 1):
            if turn not in lengths:
                run_turn(system, graph, "r", turn, "write")
                continue
            start_paused(system, graph, "r", turn)
            copies[turn] = work / f"paused-{system}-{turn}.sqlite"
            _copy_db(path, copies[turn])
            out = graph.invoke(Command(resume=APPROVE), config("r"), durability="sync")
            check_done(system, out, turn)
    _remove_db(path)
    return copies


def probe(args: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "bench.probe", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    wall = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"bench.probe {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_ms"] = round(wall, 3)
    return result


def bench_resume(plan: Plan, work: Path) -> dict[str, Any]:
    templates = {system: prepare_paused(system, work, plan.resume_lengths) for system in SYSTEMS}
    trials: dict[str, dict[str, list[dict[str, Any]]]] = {s: {str(n): [] for n in plan.resume_lengths} for s in SYSTEMS}
    for trial in range(plan.resume_trials):
        for system in SYSTEMS:
            for n in plan.resume_lengths:
                db = work / f"trial-{system}-{n}.sqlite"
                _copy_db(templates[system][n], db)
                result = probe(["resume", "--system", system, "--db", str(db), "--thread", "r", "--turn", str(n)])
                trials[system][str(n)].append(result)
                _remove_db(db)
        log(f"resume trial {trial + 1}/{plan.resume_trials} done")
    summary: dict[str, Any] = {}
    for system, by_length in trials.items():
        summary[system] = {}
        for n, results in by_length.items():
            keys = ("import_ms", "open_ms", "load_ms", "resume_ms", "total_ms", "process_wall_ms")
            summary[system][n] = {k: median([r[k] for r in results]) for k in keys}
            summary[system][n]["messages"] = results[0]["messages"]
            summary[system][n]["runs_total_ms"] = [r["total_ms"] for r in results]
    for system in SYSTEMS:
        for path in templates[system].values():
            _remove_db(path)
    return summary


# --- one turn of 8 slow reads ----------------------------------------------------------------------


def bench_parallel_reads(plan: Plan, work: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in SYSTEMS:
        path = work / f"reads-{system}.sqlite"
        times = []
        with open_system(system, path) as graph:
            run_turn(system, graph, "reads", 1, "read")
            for trial in range(plan.read_trials):
                started = time.perf_counter()
                run_turn(system, graph, "reads", trial + 2, "slow8")
                times.append((time.perf_counter() - started) * 1000)
        _remove_db(path)
        summary[system] = {
            "turn_ms": median(times),
            "runs_ms": [round(t, 3) for t in times],
            "serial_ms": SLOW_READS * SLOW_READ_S * 1000,
        }
        log(f"8 reads {system}: median {summary[system]['turn_ms']:.1f} ms")
    return summary


# --- concurrent async threads on one file ----------------------------------------------------------


def _is_lock_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return "locked" in text or "busy" in text


async def _concurrent_once(system: System, path: Path, plan: Plan) -> dict[str, Any]:
    errors: list[str] = []
    lock_errors = 0
    done_turns = 0

    async with open_async_system(system, path) as graph:

        async def one_thread(index: int) -> None:
            nonlocal lock_errors, done_turns
            for turn in range(1, plan.thread_turns + 1):
                try:
                    await arun_turn(system, graph, f"conc-{index}", turn, "write")
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    lock_errors += _is_lock_error(exc)
                    return
                done_turns += 1

        started = time.perf_counter()
        await asyncio.gather(*(one_thread(i) for i in range(plan.threads)))
        wall = time.perf_counter() - started
    return {
        "wall_s": round(wall, 4),
        "turns": done_turns,
        "turns_per_s": done_turns / wall,
        "errors": len(errors),
        "lock_errors": lock_errors,
        "error_samples": sorted(set(errors))[:5],
    }


def bench_concurrency(plan: Plan, work: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    for rep in range(plan.concurrency_reps):
        for system in SYSTEMS:
            path = work / f"conc-{system}-{rep}.sqlite"
            result = asyncio.run(_concurrent_once(system, path, plan))
            runs[system].append(result)
            log(
                f"{plan.threads} threads {system} rep {rep + 1}: {result['turns_per_s']:.1f} turns/s,"
                f" {result['errors']} errors ({result['lock_errors']} lock)"
            )
            _remove_db(path)
    return {
        system: {
            "threads": plan.threads,
            "turns_per_thread": plan.thread_turns,
            "approvals_per_turn": 1,
            "turns_per_s": median([r["turns_per_s"] for r in results]),
            "wall_s": median([r["wall_s"] for r in results]),
            "errors_total": sum(r["errors"] for r in results),
            "lock_errors_total": sum(r["lock_errors"] for r in results),
            "turns_completed": [r["turns"] for r in results],
            "error_samples": sorted({e for r in results for e in r["error_samples"]})[:5],
            "runs": results,
        }
        for system, results in runs.items()
    }


# --- peak memory -----------------------------------------------------------------------------------


def bench_memory(plan: Plan, work: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in SYSTEMS:
        rss, traced = [], []
        for rep in range(plan.memory_reps):
            for trace in (False, True):
                db = work / f"mem-{system}-{rep}-{int(trace)}.sqlite"
                args = ["memory", "--system", system, "--db", str(db), "--turns", str(plan.memory_turns)]
                result = probe([*args, "--trace"] if trace else args)
                (traced if trace else rss).append(result)
                _remove_db(db)
        summary[system] = {
            "turns": plan.memory_turns,
            "kind": "write",
            "rss_peak_mb": median([r["rss_peak_mb"] for r in rss]),
            "rss_before_mb": median([r["rss_before_mb"] for r in rss]),
            "rss_growth_mb": median([r["rss_peak_mb"] - r["rss_before_mb"] for r in rss]),
            "tracemalloc_peak_mb": median([r["tracemalloc_peak_mb"] for r in traced]),
            "tracemalloc_end_mb": median([r["tracemalloc_end_mb"] for r in traced]),
            "runs": rss + traced,
        }
        mine = summary[system]
        log(f"memory {system}: rss {mine['rss_peak_mb']} MB, traced {mine['tracemalloc_peak_mb']} MB")
    return summary


# --- driver ----------------------------------------------------------------------------------------


def environment(argv: list[str]) -> dict[str, Any]:
    versions = {}
    for name in ("langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite", "langchain", "langchain-core"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return {
        "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *argv]),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
        "git_commit": commit.stdout.strip(),
        "git_dirty": bool(dirty.stdout.strip()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def warm_up(work: Path) -> None:
    """First-use costs (lazy imports, schema compilation) paid once, outside every measurement."""
    for system in SYSTEMS:
        path = work / f"warm-{system}.sqlite"
        with open_system(system, path) as graph:
            for turn, kind in enumerate(("read", "write", "read"), start=1):
                run_turn(system, graph, "warm", turn, kind)
        _remove_db(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (small lengths, one repetition)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out"), help="where results go (default bench/out/)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch SQLite files")
    parser.add_argument(
        "--only", nargs="*", choices=("long", "resume", "reads", "concurrency", "memory"), help="run only these parts"
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    parts = set(args.only or ("long", "resume", "reads", "concurrency", "memory"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gatedloop-bench-"))
    results: dict[str, Any] = {"meta": {**environment(argv), "plan": asdict(plan), "quick": args.quick}}
    started = time.perf_counter()
    try:
        warm_up(work)
        if "long" in parts:
            log(f"long threads: {plan.reps} x {len(MODES)} modes x {len(SYSTEMS)} systems x {max(plan.lengths)} turns")
            runs = bench_long(plan, work)
            results["storage"], results["time"], results["storage_curve"] = summarize_long(plan, runs)
            results["raw_turn_ms"] = {
                f"{r['system']}/{r['kind']}/{r['rep']}": [round(t * 1000, 3) for t in r["turn_s"]] for r in runs
            }
        if "resume" in parts:
            log(f"resume in a fresh process at {plan.resume_lengths} turns, {plan.resume_trials} trials")
            results["resume"] = bench_resume(plan, work)
        if "reads" in parts:
            results["parallel_reads"] = bench_parallel_reads(plan, work)
        if "concurrency" in parts:
            log(f"{plan.threads} concurrent threads x {plan.thread_turns} approval turns, {plan.concurrency_reps} reps")
            results["concurrency"] = bench_concurrency(plan, work)
        if "memory" in parts:
            log(f"peak memory of a {plan.memory_turns}-turn thread (subprocess)")
            results["memory"] = bench_memory(plan, work)
    finally:
        if args.keep:
            log(f"scratch files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    results["ratios"], results["targets"] = judge(plan, results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown(plan, results))
    if "storage_curve" in results:
        from bench.plot import plot

        plot(results, out / "stored_bytes.png")
    log(f"done in {results['meta']['seconds']}s: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
