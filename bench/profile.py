"""Profile gatedloop's per-turn path (cProfile), to find where a turn's time goes.

    .venv/bin/python -m bench.profile [--turns 200] [--kind write|read] [--system gatedloop|anchor] [--out bench/out/]

Runs `--turns` turns on one thread after a few warm-up turns, under cProfile; writes the stats file and
a text report (top functions by own time and by cumulative time, plus time grouped by package).
Not part of `bench.run` (profiling slows everything down).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections import defaultdict

from bench.anchor import open_system
from bench.scenarios import SYSTEMS, run_turn

ROOT = Path(__file__).resolve().parent.parent


def group_of(filename: str) -> str:
    """Which package a profiled function belongs to (site-packages name, gatedloop folder, or builtin)."""
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith(str(ROOT)):
        rel = Path(filename).relative_to(ROOT)
        return f"gatedloop/{rel.parts[0]}/{rel.name}" if rel.parts[0] != "bench" else "bench"
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins"
    return "stdlib"


def by_group(stats: pstats.Stats) -> list[tuple[str, float]]:
    own: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        own[group_of(filename)] += tottime
    return sorted(own.items(), key=lambda item: -item[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--kind", choices=("read", "write"), default="write")
    parser.add_argument("--system", choices=SYSTEMS, default="gatedloop")
    parser.add_argument("--out", default=str(ROOT / "bench" / "out"))
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(tempfile.mkdtemp(prefix="gatedloop-profile-")) / "profile.sqlite"
    warm = 5
    with open_system(args.system, db) as graph:
        for turn in range(1, warm + 1):
            run_turn(args.system, graph, "p", turn, args.kind)
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        for turn in range(warm + 1, warm + args.turns + 1):
            run_turn(args.system, graph, "p", turn, args.kind)
        profiler.disable()
        elapsed = time.perf_counter() - started
    stem = f"profile-{args.system}-{args.kind}-{args.turns}"
    profiler.dump_stats(out / f"{stem}.prof")
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    text.write(
        f"{args.system}, {args.turns} {args.kind} turns after {warm} warm-up turns: {elapsed:.2f}s under cProfile "
        f"({elapsed / args.turns * 1000:.2f} ms/turn with profiling overhead)\n\n"
    )
    text.write("Own time by package/module (s):\n")
    total = sum(t for _, t in by_group(stats))
    for group, seconds in by_group(stats)[:25]:
        text.write(f"  {seconds:8.3f}  {seconds / total * 100:5.1f}%  {group}\n")
    text.write("\n")
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    (out / f"{stem}.txt").write_text(text.getvalue())
    print(text.getvalue()[:12000])
    print(f"written: {out / (stem + '.txt')}, {out / (stem + '.prof')}")


if __name__ == "__main__":
    main()
