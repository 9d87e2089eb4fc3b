"""bench/effects.py's own logic: how a child's markers become an outcome, how trials become a row of the table, and
how the drivers' payment file is read back (the kit's numbers are only as good as these). No process is started."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for folder in (ROOT, ROOT / "bench" / "effects_peers"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import payments  # noqa: E402

from bench import effects  # noqa: E402

SCENARIOS = {s.key: s for s in effects.SCENARIOS}
FRAMEWORKS = {f.key: f for f in effects.FRAMEWORKS}


def test_the_last_marker_that_says_how_a_process_ended_names_its_outcome():
    assert effects.outcome(["before_effect c1", "effect c1", "final Paid 250 to acme."], 0) == "completed"
    assert effects.outcome(["paused approval"], 0) == "waiting for approval"
    assert effects.outcome(["waiting unknown_outcome"], 0) == "waiting for a person (unknown outcome)"
    refused = "refused InvalidDecision: pay (c1): deciding this call needs one of the roles ['finance']"
    assert effects.outcome([refused], 0) == "refused InvalidDecision"
    assert effects.outcome(["raised UserError: no tool calls to resume: x"], 0) == "raised UserError"
    assert effects.outcome(["ready", "busy"], 0) == "ThreadBusy"
    assert effects.outcome(["noop no interruption c1 in the stored state"], 0) == "nothing to resume"
    assert effects.outcome(["effect c1", "hold"], None, killed=True) == "killed"
    assert effects.outcome(["ready", "before_effect c1"], 1) == "exited 1 without an outcome"
    assert effects.outcome(["effect c1", "timeout"], -9) == "timed out"


def trial(scenario: str, framework: str, paid: int, *steps: str, note: str = "") -> effects.Trial:
    return effects.Trial(scenario, framework, 0, payments=paid, steps=list(steps), note=note)


KILLED, RESUMED = "killed after paying", "completed after paying"
UNKNOWN = "waiting for a person (unknown outcome)"


def test_a_row_counts_payments_per_trial_and_says_how_the_processes_ended():
    trials = [trial("kill_after", "langchain", 2, KILLED, RESUMED) for _ in range(19)]
    trials.append(trial("kill_after", "langchain", 3, KILLED, "completed after paying 2 times"))
    trials.append(trial("kill_after", "gatedloop", 1, KILLED, UNKNOWN))
    row = effects.summarize(trials, SCENARIOS["kill_after"], FRAMEWORKS["langchain"])
    assert (row.trials, row.paid_once, row.paid_twice, row.paid_never) == (20, 0, 20, 0)
    assert row.notes == (
        "19× answer killed after paying, resume completed after paying; "
        "1× answer killed after paying, resume completed after paying 2 times"
    )
    assert row.verdict == "**20 of 20 paid twice**"
    ours = effects.summarize(trials, SCENARIOS["kill_after"], FRAMEWORKS["gatedloop"])
    assert (ours.trials, ours.paid_once, ours.verdict) == (1, 1, "")
    assert ours.notes == f"answer killed after paying, resume {UNKNOWN}"


def test_a_run_held_for_a_person_is_not_counted_wrong_and_one_that_never_pays_unasked_is():
    held = trial("kill_before", "gatedloop", 0, "killed", UNKNOWN)
    lost = trial("kill_before", "gatedloop", 0, "killed", "completed")
    assert effects.judge(held, "once") == "held for a person"
    assert effects.judge(lost, "once") == "never paid"
    assert effects.verdict([held, held, lost], "once") == "2 of 3 held for a person, **1 of 3 never paid**"


def test_a_scenario_where_a_safe_framework_pays_nothing_is_judged_on_paid_never():
    trials = [trial("wrong_role", "pydantic-ai", 1, "completed"), trial("wrong_role", "gatedloop", 0, "refused X")]
    assert effects.summarize(trials, SCENARIOS["wrong_role"], FRAMEWORKS["pydantic-ai"]).verdict == (
        "**1 of 1 paid against the rule**"
    )
    assert effects.summarize(trials, SCENARIOS["wrong_role"], FRAMEWORKS["gatedloop"]).verdict == ""


def test_mixed_outcomes_are_counted_each_and_a_note_is_kept():
    trials = [
        trial("two_resumers", "openai-agents", 2, "completed", "completed"),
        trial("two_resumers", "openai-agents", 2, "completed", "completed"),
        trial("two_resumers", "openai-agents", 1, "completed", "nothing to resume", note="a resumer never got ready"),
    ]
    row = effects.summarize(trials, SCENARIOS["two_resumers"], FRAMEWORKS["openai-agents"])
    assert row.notes == (
        "2× one completed, other completed; 1× one completed, other nothing to resume (a resumer never got ready)"
    )
    assert (row.paid_once, row.paid_twice) == (1, 2)


def test_the_table_marks_wrong_rows_and_lists_skipped_frameworks():
    kill_after = SCENARIOS["kill_after"]
    rows = [
        effects.summarize(
            [trial("kill_after", "gatedloop+reconcile", 1, KILLED, "completed")],
            kill_after,
            FRAMEWORKS["gatedloop+reconcile"],
        ),
        effects.summarize([trial("kill_after", "langchain", 2, KILLED, RESUMED)], kill_after, FRAMEWORKS["langchain"]),
    ]
    text = effects.table(rows, {"pydantic-ai": "pip install pydantic-ai-slim failed: no network"})
    lines = text.splitlines()
    assert lines[2].startswith("| killed after the payment (once) | gatedloop + reconcile | 1 | 1 | 0 | 0 |")
    assert lines[2].endswith("| answer killed after paying, resume completed |")
    assert lines[3].endswith("| **1 of 1 paid twice**: answer killed after paying, resume completed after paying |")
    assert lines[4] == (
        "| every scenario | Pydantic AI, deferred tools | 0 | | | | skipped: pip install pydantic-ai-slim failed: no "
        "network |"
    )


def test_the_payment_file_is_read_back_as_the_provider_would_answer_a_reconcile(tmp_path: Path):
    assert payments.find_payment(str(tmp_path), "k1") is None
    result = payments.pay(str(tmp_path), "k1", 250.0, "acme", "none")
    assert result == {"ok": True, "payment": "k1", "amount": 250.0, "to": "acme"}
    assert payments.find_payment(str(tmp_path), "k1") == result
    assert payments.find_payment(str(tmp_path), "k2") is None
    assert effects.payments(tmp_path) == 1


def test_the_pip_noise_is_left_out_of_a_skip_reason():
    stderr = "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored\nERROR: No matching distribution found for x\n"
    assert effects._tail(stderr) == "ERROR: No matching distribution found for x"


def test_quick_is_two_trials_of_everything_and_names_are_checked():
    args = effects.parse_args(["--quick"])
    assert (args.trials, args.fixed_trials) == (2, 2)
    assert [s.key for s in effects._pick("kill_after,wrong_role", effects.SCENARIOS, "scenario")] == [
        "kill_after",
        "wrong_role",
    ]
    try:
        effects._pick("kill_sideways", effects.SCENARIOS, "scenario")
    except SystemExit as refused:
        assert "unknown scenario: kill_sideways" in str(refused)
    else:
        raise AssertionError("an unknown scenario was accepted")
