"""Crash trials at scale: the seeded trials of tests/test_crash.py, N of them, and one summary line.

    .venv/bin/python -m bench.crash_trials [--trials 300] [--seed 1] [--jobs 2] [--keep DIR] [--on-loop] [--postgres]
    .venv/bin/python -m bench.crash_trials --answers [--trials 200] [--seed 1] [--jobs 2] [--keep DIR]

Each trial: a real child process starts a thread of 2-4 approved writes and is SIGKILLed at a seeded
moment (on a marker: a step, a write's start, its committed effect, a checkpoint or task-result write;
or after a random delay); a fresh process resumes by thread id alone and is killed again in about half
the trials; this process resumes last without a kill. Then the invariants are checked (see
`tests/support/crash_child.py: inspect_thread`). Prints the summary line, where each kill landed, and every trial
that broke an invariant. Exit status 1 if any did.

`--postgres`: every trial on the test server's database (`GATEDLOOP_TEST_PG_URL`), with a thread id of its own,
instead of a SQLite file of its own. `--on-loop`: the killed children drive through the async API, on SQLite's
on-loop saver or on `open_async_postgres` (each ledger statement awaited on the loop).

With `--answers`, the answer trials of `tests/support/answer_crash.py` instead (issue 29, finding 2): a child sends
ana's refused answer (approve of her own call; `not_done` for a paid write of unknown outcome) and is SIGKILLed
0-8 ms after sending it, 0-8 ms after LangGraph stored it, or on a marker with nothing after it stored; bo
resumes with no answer (`invoke(None)`). The summary counts writes nobody authorised, doubles and audit rows
naming bo, and says where each kill landed, per path and kind of kill.
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

from answer_crash import (  # noqa: E402  (tests/ is not a package)
    LANDINGS,
    PATHS,
    AnswerResult,
    make_template,
    plan_answer_trial,
    run_answer_trial,
)
from crash_child import ChildRun, TrialPlan, TrialResult, plan_trial, run_trial  # noqa: E402
from pg_server import new_thread_id  # noqa: E402

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


KILL_LABELS = {
    "sent": "killed 0-8 ms after sending",
    "stored": "killed 0-8 ms after it was stored",
    "held": "killed on hold_resume",
}


def summarize_answers(results: list[AnswerResult], elapsed: float) -> tuple[str, list[str], list[AnswerResult]]:
    """The summary line, where the kills landed (per path and kind of kill), and the failed trials."""
    paths = Counter(r.plan.path for r in results)
    failed = [r for r in results if not r.ok]
    line = (
        f"answer trials={len(results)} ({', '.join(f'{p}={paths[p]}' for p in PATHS)}) "
        f"kills={sum(r.killed for r in results)} "
        f"unauthorised_writes={sum(r.unauthorised for r in results)} doubles={sum(r.doubles for r in results)} "
        f"false_audit_rows={sum(len(r.false_audit) for r in results)} "
        f"completed_after_bos_answer={sum(r.final == 'completed' for r in results)} "
        f"trials_failing_an_invariant={len(failed)} elapsed={elapsed:.1f}s"
    )
    landings = []
    for path in PATHS:
        for kill, label in KILL_LABELS.items():
            group = [r for r in results if r.plan.path == path and r.plan.kill == kill]
            if not group:
                continue
            seen = Counter(r.landed for r in group)
            bad = Counter(r.landed for r in group if r.unauthorised or r.doubles)
            where = ", ".join(
                f"{landing}={seen[landing]}" + (f" (broken: {bad[landing]})" if bad[landing] else "")
                for landing in LANDINGS
                if seen[landing]
            )
            landings.append(f"{path}, {label} ({len(group)}): {where}")
    return line, landings, failed


def main_answers(args: argparse.Namespace) -> int:
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gatedloop-answers-"))
    root.mkdir(parents=True, exist_ok=True)
    plans = [plan_answer_trial(args.seed + i) for i in range(args.trials or 200)]
    started = time.monotonic()
    try:
        templates = {path: make_template(path, root / f"template-{path}") for path in PATHS}
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda p: run_answer_trial(p, templates[p.path], root / f"trial-{p.seed}"), plans))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    line, landings, failed = summarize_answers(results, time.monotonic() - started)
    print(line)
    print("kills landed:")
    for landing in landings:
        print("  " + landing)
    kinds = Counter(f"{r.plan.form}/{r.plan.durability}/bo {r.plan.resumer}" for r in results)
    shown = ", ".join(f"{k}={n}" for k, n in sorted(kinds.items()))
    print("trial kinds (answer form/durability/where bo resumes): " + shown)
    for result in failed:
        print("\nFAILED " + result.explain())
    return 1 if failed else 0


def trial(plan: TrialPlan, workdir: Path, postgres: bool) -> TrialResult:
    """One trial, on a SQLite file of its own or on the test server's database with a thread id of its own."""
    if not postgres:
        return run_trial(plan, workdir)
    return run_trial(plan, workdir, "env", new_thread_id(f"bench-trial-{plan.seed}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=None, help="300; with --answers, 200")
    parser.add_argument("--answers", action="store_true", help="the answer trials (issue 29, finding 2)")
    parser.add_argument("--seed", type=int, default=1, help="first seed; trial i uses seed + i")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at the same time")
    parser.add_argument("--keep", default=None, help="keep each trial's files under this directory")
    parser.add_argument(
        "--on-loop",
        action="store_true",
        help="the killed children drive through the async API (SQLite on the loop; Postgres awaited there)",
    )
    parser.add_argument("--postgres", action="store_true", help="on the server of GATEDLOOP_TEST_PG_URL")
    args = parser.parse_args(argv)
    # the trials whose reconcile cannot tell log a warning each time; expected here, so kept off the output
    logging.getLogger("gatedloop.reconcile").setLevel(logging.ERROR)
    if args.answers:
        return main_answers(args)

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gatedloop-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    plans = [plan_trial(args.seed + i, on_loop=args.on_loop) for i in range(args.trials or 300)]
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda p: trial(p, root / f"trial-{p.seed}", args.postgres), plans))
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
