"""Many async threads on one SQLite file, served by one process or several: does the gap to the anchor stay?

    .venv/bin/python -m bench.processes --processes 1 2 --threads 50 --turns 8 --reps 3

For each process count N and each system (gatedloop on `open_async_sqlite`, the anchor on `AsyncSqliteSaver`): a
fresh file, then N `bench.probe concurrency` children at once, each with `threads / N` threads of its own
(`--prefix`) and `turns` approval turns per thread, held until one shared start time (`--start-at`) so that
their imports are not timed. turns/s = all the children's turns / (last end - first start). One process is bound
by one core's worth of Python (the GIL); several share the machine's cores, so the ratio to the anchor at N > 1
tells whether gatedloop's gap is that core or its CPU per turn. Prints a table, then one JSON object on its last
line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.anchor import open_async_system
from bench.run import ROOT, _remove_db, median

SYSTEMS = ("gatedloop", "anchor")
IMPORT_ALLOWANCE_S = 8.0  # a child's imports and graph build take 2-4 s on this machine, more when loaded


async def _create(system: str, db: Path) -> None:
    """The file and its tables, made once: children that all set up a fresh file at once meet SQLite's lock."""
    async with open_async_system(system, db):  # type: ignore[arg-type]
        pass


def batch(system: str, db: Path, processes: int, threads: int, turns: int) -> dict[str, Any]:
    """One batch: `processes` children on one fresh file, started together; their turns over the batch's span."""
    _remove_db(db)
    asyncio.run(_create(system, db))
    start_at = time.time() + IMPORT_ALLOWANCE_S
    children = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "bench.probe", "concurrency", "--system", system, "--db", str(db)),
                *("--threads", str(threads // processes), "--turns", str(turns)),
                *("--prefix", f"p{index}", "--start-at", str(start_at)),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    results = []
    for proc in children:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"bench.probe concurrency failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    _remove_db(db)
    late = [r["started_epoch"] - start_at for r in results]
    if max(late) > 0.5:
        raise RuntimeError(f"a child started {max(late):.1f} s late: raise IMPORT_ALLOWANCE_S")
    span = max(r["ended_epoch"] for r in results) - min(r["started_epoch"] for r in results)
    done = sum(r["turns"] for r in results)
    return {
        "turns": done,
        "turns_expected": sum(r["turns_expected"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "turns_per_s": done / span,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.processes")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {s: {n: [] for n in args.processes} for s in SYSTEMS}
    with tempfile.TemporaryDirectory(prefix="gatedloop-processes-") as work:
        for rep in range(args.reps):
            for n in args.processes:
                for system in SYSTEMS:  # interleaved, so both systems see the same machine
                    result = batch(system, Path(work) / f"{system}.sqlite", n, args.threads, args.turns)
                    runs[system][n].append(result)
                    print(f"rep {rep + 1}, {n} process(es), {system}: {result['turns_per_s']:.1f} turns/s", flush=True)
    summary: dict[str, Any] = {"threads": args.threads, "turns": args.turns, "reps": args.reps, "by_processes": {}}
    print("\n| processes | gatedloop turns/s | anchor turns/s | gatedloop / anchor | errors | incomplete batches |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.processes:
        mine, theirs = (median([r["turns_per_s"] for r in runs[s][n]]) for s in SYSTEMS)
        errors = sum(r["errors"] for s in SYSTEMS for r in runs[s][n])
        incomplete = sum(r["turns"] != r["turns_expected"] for s in SYSTEMS for r in runs[s][n])
        summary["by_processes"][n] = {"gatedloop": mine, "anchor": theirs, "errors": errors, "incomplete": incomplete}
        print(f"| {n} | {mine:.1f} | {theirs:.1f} | {mine / theirs:.2f} | {errors} | {incomplete} |")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
