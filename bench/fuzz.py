"""Fuzz: the property tests, with a much larger budget than the test suite gives them.

    .venv/bin/python -m bench.fuzz                                   # 2,000 examples each, a fresh random seed
    .venv/bin/python -m bench.fuzz --examples 200 --seed 1234        # reproduce a run
    .venv/bin/python -m bench.fuzz --only tool_results --examples 5000

Runs, through pytest (so fixtures work as in the suite):
- `tests/test_properties.py`: whatever the model proposes and the reviewer answers, the loop holds its
  invariants (nothing unapproved runs, every call answered once, a known status);
- `tests/test_tool_results.py`: any tool return value or exception is answered once, as JSON text, and no
  exception text reaches the model;
- `tests/test_gate_forgery.py` (`forgery`): forged state written with `update_state` as any node never pays without
  an authorized approval, and most forgeries reach the gate (the module fails otherwise);
- `tests/test_gate_devserver.py` (`http_forgery`): forged state written over HTTP to the real `langgraph dev` never
  pays without an authorized approval (about 3.5 s an example: give it `--examples 200`, not the default).

The tests pin `max_examples` and `derandomize=True` in their own `@settings`; a profile cannot override an
explicit decorator, so a small pytest plugin replaces each Hypothesis test's settings object after collection
(`_hypothesis_internal_use_settings`, read by Hypothesis when the test runs). By default the run is random
(`derandomize=False`) with a seed printed up front; `--derandomize` replays the suite's fixed sequence.
Hypothesis prints a falsifying example (and the `@reproduce_failure` blob) for any failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {
    "properties": "tests/test_properties.py::"
    "test_the_loop_never_raises_never_runs_what_it_should_not_and_answers_every_call",
    "tool_results": "tests/test_tool_results.py::"
    "test_any_tool_result_or_exception_is_answered_once_as_json_and_never_leaks",
    "forgery": "tests/test_gate_forgery.py::test_forged_state_never_runs_a_gated_call_without_an_authorized_approval",
    "http_forgery": "tests/test_gate_devserver.py::"
    "test_forged_state_over_http_never_pays_without_an_authorized_approval",
}


class Budget:
    """A pytest plugin: give every collected Hypothesis test the fuzz budget, and record how it went."""

    def __init__(self, examples: int, derandomize: bool) -> None:
        self.examples = examples
        self.derandomize = derandomize
        self.tuned: list[str] = []
        self.outcomes: dict[str, dict[str, Any]] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            test = getattr(item, "obj", None)
            if not getattr(test, "is_hypothesis_test", False):
                continue
            current = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
            test._hypothesis_internal_use_settings = settings(
                current,
                max_examples=self.examples,
                derandomize=self.derandomize,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
            )
            self.tuned.append(item.nodeid)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call":
            self.outcomes[report.nodeid] = {"outcome": report.outcome, "seconds": round(report.duration, 1)}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="max_examples for each property test")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: a fresh random one)")
    parser.add_argument("--derandomize", action="store_true", help="the suite's fixed sequence, just longer")
    parser.add_argument("--only", choices=sorted(TARGETS), action="append", help="run only these (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    chosen = args.only or sorted(TARGETS)
    plugin = Budget(args.examples, args.derandomize)
    mode = "derandomized" if args.derandomize else f"seed {seed}"
    print(f"fuzz: {args.examples} examples each, {mode}: {', '.join(chosen)}", flush=True)
    pytest_args = [
        *[str(ROOT / TARGETS[name]) for name in chosen],
        "-q",
        "-p",
        "no:cacheprovider",
        "-n",
        "0",  # in this process: the suite's parallel workers (pyproject addopts) would not get this plugin's budgets
        "--import-mode=importlib",
        "--rootdir",
        str(ROOT),
        "--hypothesis-show-statistics",
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        f"--hypothesis-seed={seed}",
    ]
    started = time.perf_counter()
    code = pytest.main(pytest_args, plugins=[plugin])
    wall = time.perf_counter() - started
    missing = [name for name in chosen if not any(TARGETS[name].split("::")[1] in n for n in plugin.tuned)]
    if missing:
        print(f"fuzz: could not set the budget of {missing} (not collected as Hypothesis tests)", file=sys.stderr)
        return 2
    print(f"\nfuzz summary ({mode}, {args.examples} examples each, {wall:.1f} s):")
    for nodeid, outcome in plugin.outcomes.items():
        print(f"  {outcome['outcome']:>7}  {outcome['seconds']:>7.1f} s  {nodeid}")
    print(f"reproduce: .venv/bin/python -m bench.fuzz --examples {args.examples} --seed {seed}")
    return int(code)


if __name__ == "__main__":
    raise SystemExit(main())
