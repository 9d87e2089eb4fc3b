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

from bench.anchor import open_system
from bench.report import judge, markdown
from bench.scenarios import SLOW_READ_S, SLOW_READS, SYSTEMS, Kind, run_turn

ROOT = Path(__file__).resolve().parent.parent
MODES: tuple[Kind, ...] = ("read", "write")
WORKAROUND_POOL = 64  # a default executor this large avoids the execute-node deadlock (see README)


@dataclass(frozen=True)
class Plan:
    request_rounds: int
    request_reps: int
    lengths: tuple[int, ...]
    reps: int
    sample_every: int
    resume_lengths: tuple[int, int]
    resume_trials: int
    read_trials: int
    threads: int
    thread_turns: int
    concurrency_reps: int
    stall_s: float
    memory_turns: int


FULL = Plan(400, 3, (50, 200, 400), 3, 25, (10, 400), 5, 5, 50, 4, 3, 10.0, 400)
QUICK = Plan(50, 1, (5, 10, 20), 1, 5, (3, 10), 2, 2, 50, 1, 1, 5.0, 20)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def window(length: int) -> int:
    """How many turns just before `length` the "at this length" per-turn time averages over."""
    return max(1, min(25, length // 2))


def _remove_db(path: str | Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(f"{path}.leases", ignore_errors=True)


def child(module: str, args: list[str], timeout: float = 900.0) -> dict[str, Any]:
    """Run `python -m MODULE ARGS` in a fresh process; its last stdout line is the JSON result."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    wall = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_wall_ms"] = round(wall, 3)
    return result


def probe(args: list[str], timeout: float = 900.0) -> dict[str, Any]:
    return child("bench.probe", args, timeout)


# --- the floor: gatedloop's graph with nodes that do nothing (bench/floor.py), one child process per run ---

FLOOR_SAVERS = ("gated", "plain")


def bench_floor(shape: str, plan: Plan, reps: int) -> dict[str, Any]:
    """Median of `reps` runs of one floor shape on each saver: gatedloop's and LangGraph's own."""
    if shape == "request":
        args, key = ["--rounds", str(plan.request_rounds)], "total_s"
    elif shape == "turns":
        args, key = ["--turns", str(min(plan.lengths))], "mean_ms_per_turn"
    else:
        args, key = ["--threads", str(plan.threads), "--turns", str(plan.thread_turns)], "turns_per_s"
    found: dict[str, list[dict[str, Any]]] = {saver: [] for saver in FLOOR_SAVERS}
    for _ in range(reps):
        for saver in FLOOR_SAVERS:
            found[saver].append(child("bench.floor", [shape, "--saver", saver, *args]))
    summary = {
        saver: {key: median([r[key] for r in runs]), "runs": [r[key] for r in runs]} for saver, runs in found.items()
    }
    for saver, runs in found.items():
        if shape == "concurrency":
            summary[saver]["cpu_ms_per_turn_by_thread"] = median_split(runs)
            summary[saver]["switches_per_turn_by_thread"] = median_split(runs, "switches_per_turn_by_thread")
        if shape == "turns":
            summary[saver]["cpu_ms_per_turn"] = median([r["cpu_ms_per_turn"] for r in runs])
    log(f"floor {shape}: " + ", ".join(f"{saver} {s[key]:.3f} {key}" for saver, s in summary.items()))
    return summary


def median_split(results: list[dict[str, Any]], key: str = "cpu_ms_per_turn_by_thread") -> dict[str, float]:
    """The median over runs of each thread role's CPU (or context switches) per turn (`bench.thread_cpu`)."""
    splits = [r.get(key) or {} for r in results]
    roles = sorted({role for split in splits for role in split})
    return {role: median([split.get(role, 0.0) for split in splits]) for role in roles}


# --- one long request: N tool rounds after one user message (one child process per run) ---------------


def bench_request(plan: Plan, work: Path) -> dict[str, Any]:
    """Both systems, `request_reps` times each, interleaved; per-step bytes and time against length."""
    every = max(1, plan.request_rounds // 16)
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    for rep in range(plan.request_reps):
        for system in SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS)):
            db = work / f"request-{system}-{rep}.sqlite"
            args = ["--system", system, "--db", str(db), "--rounds", str(plan.request_rounds)]
            result = child("bench.long_request", [*args, "--sample-every", str(every)])
            result["samples"] = {int(n): v for n, v in result["samples"].items()}
            runs[system].append(result)
            log(f"long request {system} rep {rep + 1}: {result['total_s']:.2f}s for {plan.request_rounds} rounds")
            _remove_db(db)
    return {system: _summarize_request(mine, every) for system, mine in runs.items()}


def _summarize_request(runs: list[dict[str, Any]], every: int) -> dict[str, Any]:
    points = sorted(runs[0]["samples"])
    curve, previous = [], 0
    for n in points:
        blob = median([r["samples"][n]["checkpoint_blobs"] + r["samples"][n]["write_blobs"] for r in runs])
        span = n - previous
        step_ms = median([sum(r["round_s"][n - span : n]) / span * 1000 for r in runs])
        curve.append(
            {
                "round": n,
                "blob_bytes": blob,
                "file_bytes": median([r["samples"][n]["file_bytes"] for r in runs]),
                "mean_bytes_per_step": blob / n,
                "window_ms_per_step": step_ms,
                "mean_ms_per_step": median([sum(r["round_s"][:n]) / n * 1000 for r in runs]),
            }
        )
        previous = n
    for before, point in zip([None, *curve], curve, strict=False):
        base = before or {"round": 0, "blob_bytes": 0}
        point["window_bytes_per_step"] = (point["blob_bytes"] - base["blob_bytes"]) / (point["round"] - base["round"])
    return {
        "rounds": runs[0]["rounds"],
        "sample_every": every,
        "curve": curve,
        "total_s": median([r["total_s"] for r in runs]),
        "runs_total_s": [round(r["total_s"], 3) for r in runs],
        "cpu_s": median([r["cpu_s"] for r in runs]),
        "runs_cpu_s": [round(r["cpu_s"], 3) for r in runs],
    }


# --- long threads: stored bytes, time per turn, peak RSS (one child process per thread) ----------------


def bench_long(plan: Plan, work: Path) -> tuple[list[dict[str, Any]], dict[str, dict[int, str]]]:
    """Every (rep, mode, system) thread; rep 1's approval threads also leave paused copies for `resume`."""
    runs, paused = [], {}
    lengths = ",".join(map(str, plan.lengths))
    for rep in range(plan.reps):
        for kind in MODES:
            order = SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))
            for system in order:
                db = work / f"long-{system}-{kind}-{rep}.sqlite"
                args = ["long", "--system", system, "--db", str(db), "--kind", kind, "--lengths", lengths]
                args += ["--sample-every", str(plan.sample_every)]
                if rep == 0 and kind == "write":
                    args += ["--pause-at", ",".join(map(str, plan.resume_lengths))]
                    args += ["--copy-prefix", str(work / f"paused-{system}")]
                result = probe(args)
                if result["copies"]:
                    paused[system] = {int(n): path for n, path in result["copies"].items()}
                result["samples"] = {int(n): v for n, v in result["samples"].items()}
                runs.append({"system": system, "kind": kind, "rep": rep, **result})
                wall, cpu = sum(result["turn_s"]), sum(result["turn_cpu_s"])
                log(f"long thread {system}/{kind} rep {rep + 1}: {wall:.1f}s wall, {cpu:.1f}s CPU in turns")
                _remove_db(db)
    return runs, paused


def summarize_long(plan: Plan, runs: list[dict[str, Any]]) -> dict[str, Any]:
    storage: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    rss: dict[str, Any] = {}
    for system in SYSTEMS:
        for kind in MODES:
            mine = [r for r in runs if r["system"] == system and r["kind"] == kind]
            if not mine:
                continue
            storage.setdefault(system, {})[kind] = {str(n): _storage_at(mine, n) for n in plan.lengths}
            timing.setdefault(system, {})[kind] = {str(n): _timing_at(mine, n) for n in plan.lengths}
            curves.setdefault(system, {})[kind] = [
                {
                    "turn": t,
                    "blob_bytes": median(
                        [r["samples"][t]["checkpoint_blobs"] + r["samples"][t]["write_blobs"] for r in mine]
                    ),
                    "file_bytes": median([r["samples"][t]["file_bytes"] for r in mine]),
                }
                for t in sorted(mine[0]["samples"])
            ]
            rss.setdefault(system, {})[kind] = {
                "turns": max(plan.lengths),
                "rss_peak_mb": median([r["rss_peak_mb"] for r in mine]),
                "rss_before_mb": median([r["rss_before_mb"] for r in mine]),
                "rss_growth_mb": median([r["rss_peak_mb"] - r["rss_before_mb"] for r in mine]),
                "runs_rss_peak_mb": [r["rss_peak_mb"] for r in mine],
            }
    return {"storage": storage, "time": timing, "storage_curve": curves, "memory_rss": rss}


def _storage_at(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    at = [r["samples"][n] for r in runs]
    blob = median([s["checkpoint_blobs"] + s["write_blobs"] for s in at])
    file_bytes = median([s["file_bytes"] for s in at])
    return {
        "blob_bytes": blob,
        "checkpoint_blobs": median([s["checkpoint_blobs"] for s in at]),
        "write_blobs": median([s["write_blobs"] for s in at]),
        "file_bytes": file_bytes,
        "blob_bytes_per_turn": blob / n,
        "file_bytes_per_turn": file_bytes / n,
        "checkpoint_rows": median([s["checkpoints"] for s in at]),
        "write_rows": median([s["writes"] for s in at]),
    }


def _timing_at(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    w = window(n)
    cumulative = [sum(r["turn_s"][:n]) / n * 1000 for r in runs]
    recent = [sum(r["turn_s"][n - w : n]) / w * 1000 for r in runs]
    cpu = [sum(r["turn_cpu_s"][:n]) / n * 1000 for r in runs]
    cpu_recent = [sum(r["turn_cpu_s"][n - w : n]) / w * 1000 for r in runs]
    return {
        "mean_ms_per_turn": median(cumulative),
        "window_ms_per_turn": median(recent),
        "cpu_mean_ms_per_turn": median(cpu),
        "cpu_window_ms_per_turn": median(cpu_recent),
        "window_turns": w,
        "runs_mean_ms": [round(x, 3) for x in cumulative],
        "runs_window_ms": [round(x, 3) for x in recent],
        "runs_cpu_mean_ms": [round(x, 3) for x in cpu],
    }


# --- resume in a fresh process ---------------------------------------------------------------------


def bench_resume(plan: Plan, work: Path, paused: dict[str, dict[int, str]]) -> dict[str, Any]:
    trials: dict[str, dict[str, list[dict[str, Any]]]] = {s: {str(n): [] for n in plan.resume_lengths} for s in SYSTEMS}
    for trial in range(plan.resume_trials):
        for system in SYSTEMS:
            for n in plan.resume_lengths:
                db = work / f"trial-{system}-{n}.sqlite"
                shutil.copyfile(paused[system][n], db)
                result = probe(["resume", "--system", system, "--db", str(db), "--thread", "long", "--turn", str(n)])
                trials[system][str(n)].append(result)
                _remove_db(db)
        log(f"resume trial {trial + 1}/{plan.resume_trials} done")
    summary: dict[str, Any] = {}
    keys = ("import_ms", "open_ms", "load_ms", "resume_ms", "total_ms", "process_wall_ms")
    for system, by_length in trials.items():
        summary[system] = {}
        for n, results in by_length.items():
            summary[system][n] = {k: median([r[k] for r in results]) for k in keys}
            summary[system][n]["messages"] = results[0]["messages"]
            summary[system][n]["runs_total_ms"] = [r["total_ms"] for r in results]
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


# --- concurrent async threads on one file (child process each, with a stall watchdog) ----------------

CONCURRENCY_ROWS = (("gatedloop", "gatedloop", 0), ("anchor", "anchor", 0), ("gatedloop_pool64", "gatedloop", 64))


def bench_concurrency(plan: Plan, work: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in CONCURRENCY_ROWS}
    for rep in range(plan.concurrency_reps):
        for label, system, pool in CONCURRENCY_ROWS:
            db = work / f"conc-{label}-{rep}.sqlite"
            args = ["concurrency", "--system", system, "--db", str(db), "--threads", str(plan.threads)]
            args += ["--turns", str(plan.thread_turns), "--stall-s", str(plan.stall_s), "--pool", str(pool)]
            result = probe(args)
            runs[label].append(result)
            log(
                f"{plan.threads} threads {label} rep {rep + 1}: {result['turns']}/{result['turns_expected']} turns,"
                f" {result['turns_per_s']:.1f} turns/s, {result['errors']} errors ({result['lock_errors']} lock),"
                f" {'HUNG' if result['hung'] else 'finished'}"
            )
            _remove_db(db)
    return {
        label: {
            "system": system,
            "default_executor_workers": results[0]["default_executor_workers"],
            "threads": plan.threads,
            "turns_per_thread": plan.thread_turns,
            "turns_per_s": median([r["turns_per_s"] for r in results]),
            "wall_s": median([r["wall_s"] for r in results]),
            "cpu_ms_per_turn_by_thread": median_split(results),
            "switches_per_turn_by_thread": median_split(results, "switches_per_turn_by_thread"),
            "errors_total": sum(r["errors"] for r in results),
            "lock_errors_total": sum(r["lock_errors"] for r in results),
            "hung_runs": sum(bool(r["hung"]) for r in results),
            "turns_completed": [r["turns"] for r in results],
            "turns_expected": results[0]["turns_expected"],
            "error_samples": sorted({e for r in results for e in r["error_samples"]})[:5],
            "runs": results,
        }
        for label, system, pool in CONCURRENCY_ROWS
        for results in [runs[label]]
    }


# --- optional: tracemalloc peak ----------------------------------------------------------------------


def bench_tracemalloc(plan: Plan, work: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for system in SYSTEMS:
        db = work / f"mem-{system}.sqlite"
        summary[system] = probe(["memory", "--system", system, "--db", str(db), "--turns", str(plan.memory_turns)])
        _remove_db(db)
        log(f"tracemalloc {system}: peak {summary[system]['tracemalloc_peak_mb']} MB")
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (small lengths, one repetition)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out"), help="where results go (default bench/out/)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch SQLite files")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also run each system under tracemalloc (slow; RSS is always measured)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=("request", "long", "reads", "concurrency"),
        help="run only these parts (resume needs long)",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    parts = set(args.only or ("request", "long", "reads", "concurrency"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gatedloop-bench-"))
    results: dict[str, Any] = {"meta": {**environment(argv), "plan": asdict(plan), "quick": args.quick}}
    started = time.perf_counter()
    try:
        if "request" in parts:
            log(f"one long request: {plan.request_rounds} tool rounds, {plan.request_reps} x {len(SYSTEMS)} systems")
            results["request"] = bench_request(plan, work)
            results.setdefault("floor", {})["request"] = bench_floor("request", plan, plan.request_reps)
        if "long" in parts:
            log(f"long threads: {plan.reps} x {len(MODES)} modes x {len(SYSTEMS)} systems x {max(plan.lengths)} turns")
            runs, paused = bench_long(plan, work)
            results.setdefault("floor", {})["turns"] = bench_floor("turns", plan, plan.reps)
            results.update(summarize_long(plan, runs))
            results["raw_turn_ms"] = {
                f"{r['system']}/{r['kind']}/{r['rep']}": [round(t * 1000, 3) for t in r["turn_s"]] for r in runs
            }
            results["raw_turn_cpu_ms"] = {
                f"{r['system']}/{r['kind']}/{r['rep']}": [round(t * 1000, 3) for t in r["turn_cpu_s"]] for r in runs
            }
            log(f"resume in a fresh process at {plan.resume_lengths} turns, {plan.resume_trials} trials")
            results["resume"] = bench_resume(plan, work, paused)
        if "reads" in parts:
            results["parallel_reads"] = bench_parallel_reads(plan, work)
        if "concurrency" in parts:
            log(f"{plan.threads} concurrent threads x {plan.thread_turns} approval turns, {plan.concurrency_reps} reps")
            results["concurrency"] = bench_concurrency(plan, work)
            results.setdefault("floor", {})["concurrency"] = bench_floor("concurrency", plan, plan.concurrency_reps)
        if args.tracemalloc:
            log(f"tracemalloc peak of a {plan.memory_turns}-turn thread (subprocess)")
            results["tracemalloc"] = bench_tracemalloc(plan, work)
    finally:
        if args.keep:
            log(f"scratch files kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    results["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    results["meta"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    end = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    results["meta"]["git_commit_end"] = end.stdout.strip()
    results["ratios"], results["targets"] = judge(plan, results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown(plan, results))
    if "storage_curve" in results:
        from bench.plot import plot

        plot(results, out / "stored_bytes.png")
    if "request" in results:
        from bench.plot import plot_request

        plot_request(results, out / "long_request.png")
    log(f"done in {results['meta']['seconds']}s: {out / 'results.md'}")
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
