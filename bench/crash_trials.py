"""Crash trials at scale: the seeded trials of tests/test_crash.py, N of them, and one summary line.

    .venv/bin/python -m bench.crash_trials [--trials 300] [--seed 1] [--jobs 2] [--keep DIR]

Each trial: a real child process starts a thread of 2-4 approved writes and is SIGKILLed at a seeded
moment (on a marker: a step, a write's start, its committed effect, a checkpoint or task-result write;
or after a random delay); a fresh process resumes by thread id alone and is killed again in about half
the trials; this process resumes last without a kill. Then the invariants are checked (see
`tests/support/crash_child.py: inspect_thread`). Prints the summary line, where each kill landed, and every trial
that broke an invariant. Exit status 1 if any did.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests" / "support"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from crash_child import ChildRun, TrialResult, plan_trial, run_trial  # noqa: E402  (tests/ is not a package)

WRITE_MARKERS = ("write_begin", "hold_before", "effect", "hold_after")


def kill_moment(child: ChildRun) -> str:
    """Where a killed child was, from the last marker it printed before the signal landed."""
    kinds = [line.split(" ", 1)[0] for line in child.lines]
    last = kinds[-1] if kinds else "none"
    if last in ("write_begin", "hold_before"):
        return "in a write, before its effect"
    if last in ("effect", "hold_after"):
        return "in a write, after its effect"
    if last in ("ckpt", "writes"):
        return "while writing a checkpoint"
    if not any(k in WRITE_MARKERS for k in kinds):
        return "before its writes" if last not in ("none", "ready") else "at startup"
    return "between or after writes"


def summarize(results: list[TrialResult], elapsed: float) -> tuple[str, Counter[str], list[TrialResult]]:
    kills = sum(r.kills for r in results)
    double = sum(len(r.report.double_effects) for r in results)
    missing = sum(len(r.report.missing_effects) for r in results)
    unanswered = sum(len(r.report.unanswered) for r in results)
    statuses = Counter(r.report.status for r in results)
    failed = [r for r in results if not r.ok]
    histogram = ", ".join(f"{status}={n}" for status, n in statuses.most_common())
    line = (
        f"trials={len(results)} kills={kills} double_effects={double} unanswered_calls={unanswered} "
        f"missing_effects={missing} trials_failing_an_invariant={len(failed)} "
        f"final_statuses: {histogram} elapsed={elapsed:.1f}s"
    )
    moments = Counter(kill_moment(child) for r in results for child in r.runs if child.killed)
    return line, moments, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="first seed; trial i uses seed + i")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at the same time")
    parser.add_argument("--keep", default=None, help="keep each trial's files under this directory")
    args = parser.parse_args(argv)
    # the trials whose reconcile cannot tell log a warning each time; expected here, so kept off the output
    logging.getLogger("gatedloop.reconcile").setLevel(logging.ERROR)

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gatedloop-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    plans = [plan_trial(args.seed + i) for i in range(args.trials)]
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda p: run_trial(p, root / f"trial-{p.seed}"), plans))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    line, moments, failed = summarize(results, time.monotonic() - started)
    print(line)
    print("kills landed: " + ", ".join(f"{moment}={n}" for moment, n in moments.most_common()))
    plans_seen = Counter(f"reconcile={r.plan.reconcile}/unknown={r.plan.unknown}" for r in results)
    print("trial kinds: " + ", ".join(f"{kind}={n}" for kind, n in sorted(plans_seen.items())))
    for result in failed:
        print("\nFAILED " + result.explain())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
