"""Invariants 3 and 7 under real crashes: child processes SIGKILLed mid-run, resumed by thread id alone.

The seeded trials kill a real child at a random moment (before, during and between writes, and while
checkpoints are written), resume in a fresh process (killed again in about half the trials), resume once
more in the test process without a kill, and check every invariant on what is left (see
`crash_child.inspect_thread`). The deterministic tests below create each unknown-outcome case for real,
by killing a child inside a write that waits on a gate file, or by a ledger claim whose claimant process
is dead or alive, and check what reconcile (or a person) makes of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from answer_crash import PATHS, STORED_NOT_REFUSED, AnswerPlan, make_template, plan_answer_trial, run_answer_trial
from backends import Backend
from crash_child import (
    Child,
    KillPlan,
    TrialPlan,
    TrialResult,
    assert_completed_once,
    child_command,
    effects_per_call,
    inspect_thread,
    plan_trial,
    run_child,
    run_trial,
)
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from langgraph.types import Command
from pg_server import new_thread_id
from sample_app import Effects, build

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.ledger import idempotency_key
from gatedloop.graph import runs
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import CallContext

pytestmark = pytest.mark.slow

# Sized for the suite (every kill point is drawn in the first dozen seeds); `python -m bench.crash_trials` runs
# hundreds, and these variables size the suite's own run.
TRIALS = int(os.environ.get("GATEDLOOP_CRASH_TRIALS", "12"))
PG_TRIALS = int(os.environ.get("GATEDLOOP_PG_CRASH_TRIALS", "4"))
ON_LOOP_TRIALS = int(os.environ.get("GATEDLOOP_ON_LOOP_CRASH_TRIALS", "8"))
SEED_BASE = int(os.environ.get("GATEDLOOP_CRASH_SEED", "20240"))
THREAD = "t1"
# Seeded answer trials beside the held one of each path (tests/support/answer_crash.py; the bench runs hundreds).
ANSWER_TRIALS = int(os.environ.get("GATEDLOOP_ANSWER_TRIALS", "1"))


# Until the bug pinned by test_rerun_killed_again_then_not_done_runs_the_write is fixed, a trial whose
# second kill lands inside the re-run of a write ends `completed` with that write never run and its claim
# left open. Only that exact signature is tolerated here (and reported as a warning); set this to False
# once the pinned test passes.
TOLERATE_KNOWN_RERUN_BUG = False


def known_rerun_bug(result: TrialResult) -> bool:
    """The one known failure: after two kills, the re-run of a write never happens and its claim stays open."""
    report = result.report
    open_claims = [cid for cid, (state, attempts) in report.ledger.items() if state == "claimed" and attempts >= 2]
    return (
        result.kills >= 2
        and report.status == "completed"
        and bool(open_claims)
        and sorted(report.missing_effects) == sorted(open_claims)
        and not report.double_effects
        and not report.unanswered
        and len(report.problems) == 2
    )


def test_seeded_crash_trials_keep_every_invariant(backend: Backend, tmp_path: Path):
    """On SQLite each trial has a file of its own; on Postgres the shared database, with thread ids of its own."""
    trials = TRIALS if backend.name == "sqlite" else PG_TRIALS
    plans = [plan_trial(SEED_BASE + i) for i in range(trials)]

    def trial(plan: TrialPlan) -> TrialResult:
        workdir = tmp_path / f"trial-{plan.seed}"
        if backend.name == "sqlite":
            return run_trial(plan, workdir)
        return run_trial(plan, workdir, backend.child_db, new_thread_id(f"trial-{plan.seed}"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(trial, plans))
    assert_trials_keep_every_invariant(results)


def test_seeded_crash_trials_through_the_async_api_on_the_loop_keep_every_invariant(backend: Backend, tmp_path: Path):
    """The killed children drive through `runs.astart`/`aresume` with the gate's nodes on the event loop: on SQLite
    `open_async_sqlite`'s default saver (the ledger and the checkpoints there too), on Postgres
    `open_async_postgres` (each ledger statement awaited on the loop); a sync process resumes last."""
    on_sqlite = backend.name == "sqlite"
    plans = [plan_trial(SEED_BASE + 1000 + i, on_loop=True) for i in range(ON_LOOP_TRIALS if on_sqlite else PG_TRIALS)]

    def trial(plan: TrialPlan) -> TrialResult:
        workdir = tmp_path / f"trial-{plan.seed}"
        if on_sqlite:
            return run_trial(plan, workdir)
        return run_trial(plan, workdir, backend.child_db, new_thread_id(f"async-trial-{plan.seed}"))

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(trial, plans))
    driver = "driver on_loop" if on_sqlite else "driver awaited"
    assert all(driver in r.runs[0].lines for r in results)
    assert sum("step start" in r.runs[0].lines for r in results) >= len(plans) // 2
    assert_trials_keep_every_invariant(results)


def assert_trials_keep_every_invariant(results: list[TrialResult]) -> None:
    trials = len(results)
    known = [r for r in results if not r.ok and TOLERATE_KNOWN_RERUN_BUG and known_rerun_bug(r)]
    for result in known:
        warnings.warn(f"known bug (re-run killed again): {result.plan.describe()}", stacklevel=1)
    failures = [r.explain() for r in results if not r.ok and r not in known]
    assert not failures, "\n\n".join(failures)
    assert not any(r.report.double_effects or r.report.unanswered for r in results)
    kills = sum(r.kills for r in results)
    statuses = Counter(r.report.status for r in results)
    assert kills >= trials // 2, f"only {kills} kills landed in {trials} trials"
    assert set(statuses) <= {"completed", "needs_attention", "waiting_for_person"}, statuses
    for result in results:
        if result.plan.unknown == "truthful" and result not in known:
            assert result.report.status == "completed", result.explain()
            assert all(n == 1 for n in result.report.effects_per_call.values()), result.explain()


# ------------------------------------------------------------------ unknown outcomes created by a real kill


def killed_in_write(tmp_path: Path, where: str, text: str = "book 2 seat", *extra: str) -> tuple[str, Effects]:
    """A real child approves the thread's writes and is SIGKILLed inside the first one, before or after its
    effect is recorded (it waits on a gate file that never appears). The ledger claim stays `claimed`.
    `extra`: more child options (who asks, who approves, the tool's approvers)."""
    db, effects_path = str(tmp_path / "runs.sqlite"), str(tmp_path / "effects.sqlite")
    held = ("--hold", where, "--hold-call", "c1_0", "--gate", str(tmp_path / "x"))
    cmd = child_command(db, effects_path, THREAD, "--text", text, *held, *extra)
    run = run_child(cmd, tmp_path / "child.stderr", KillPlan(f"hold_{where}"))
    assert run.killed, run.lines
    effects = Effects(effects_path)
    assert len(effects.rows()) == (1 if where == "after" else 0)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT state, attempts FROM gatedloop_ledger").fetchall() == [("claimed", 1)]
    return db, effects


def tool_answers(out: dict) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def ledger_state(saver, call_id: str = "c1_0") -> tuple[str, int]:
    entry = saver.ledger.get(THREAD, call_id)
    return entry.state, entry.attempts


def events(saver) -> list[str]:
    return [e["event"] for e in saver.ledger.audit(THREAD) if e["call_id"] == "c1_0"]


def test_reconcile_done_reuses_the_result_and_does_not_run_again(tmp_path: Path):
    db, effects = killed_in_write(tmp_path, "after")
    [(_, args, key)] = effects.rows()
    with open_sqlite(db) as saver:
        out = runs.resume(build(saver, effects), THREAD)
        assert ledger_state(saver) == ("done", 1)
        assert "reconciled" in events(saver)
    assert out["status"] == "completed"
    assert effects.rows() == [("book", args, key)]
    answer = tool_answers(out)["c1_0"]
    assert answer.status == "success"
    assert json.loads(answer.content) == effects.find(key)
    assert_each_call_answered_once(out["messages"])


def test_reconcile_not_done_runs_the_write_exactly_once_more(tmp_path: Path):
    db, effects = killed_in_write(tmp_path, "before")
    with open_sqlite(db) as saver:
        out = runs.resume(build(saver, effects), THREAD)
        assert ledger_state(saver) == ("done", 2)
    assert out["status"] == "completed"
    key = idempotency_key(THREAD, "c1_0")
    assert [k for _, _, k in effects.rows()] == [key]
    assert json.loads(tool_answers(out)["c1_0"].content) == effects.find(key)
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("where", ["before", "after"])
def test_write_of_a_killed_process_is_reconciled_by_a_new_process_and_never_happens_twice(
    backend: Backend, tmp_path: Path, where: str
):
    """Killed inside c1_0, before or after its effect: the claim stays `claimed`. A fresh process asks the
    booking system (reconcile): after -> the recorded booking is reused; before -> the write runs once more."""
    thread_id, calls, effects = new_thread_id(f"killed-{where}"), ["c1_0", "c1_1"], str(tmp_path / "effects.sqlite")
    held = ["--hold", where, "--hold-call", "c1_0", "--gate", str(tmp_path / "never")]
    cmd = backend.child_command(effects, thread_id, "--text", "book 2 seat, 1 lunch", *held)
    killed = run_child(cmd, tmp_path / "killed.stderr", KillPlan(f"hold_{where}"))
    assert killed.killed, (killed.lines, killed.stderr[-2000:])
    assert effects_per_call(effects, thread_id, calls) == {"c1_0": int(where == "after"), "c1_1": 0}
    with backend.open() as saver:
        assert [(e.call_id, e.state, e.attempts) for e in saver.ledger.entries(thread_id)] == [("c1_0", "claimed", 1)]

    resumed = run_child(backend.child_command(effects, thread_id), tmp_path / "resumed.stderr")
    assert resumed.returncode == 0, (resumed.lines, resumed.stderr[-2000:])
    report = assert_completed_once(backend.db, effects, thread_id, calls)
    assert report.ledger["c1_0"] == ("done", 1 if where == "after" else 2)
    writes_in_resume = [line for line in resumed.lines if line.startswith("write_begin")]
    assert len(writes_in_resume) == (1 if where == "after" else 2), resumed.lines
    with backend.open() as saver:
        events = [e["event"] for e in saver.ledger.audit(thread_id) if e["call_id"] == "c1_0"]
    assert ("reconciled" in events) == (where == "after"), events
    assert ("rerun_2" in events) == (where == "before"), events


def _cannot_tell(args: dict, key: str):
    raise ConnectionError("the booking system is down")


CANNOT_TELL = {"absent": {"reconcile": None}, "raises": {"reconcile": _cannot_tell}}


def paused_on_unknown(graph, thread_id: str = THREAD) -> dict:
    out = runs.resume(graph, thread_id)
    request = out["__interrupt__"][0].value
    assert request["kind"] == "unknown_outcome"
    assert request["allowed_decisions"] == ["done", "not_done", "abandon"]
    [call] = request["calls"]
    assert call["tool_call_id"] == "c1_0"
    assert call["idempotency_key"] == idempotency_key(thread_id, "c1_0")
    assert call["args"] == {"item": "seat", "quantity": 2}
    assert call["reason"] == "claimant_died"
    return request


@contextlib.contextmanager
def asking_about_a_killed_write(
    tmp_path: Path, where: str, reconcile: str, text: str = "book 2 seat"
) -> Iterator[tuple[Any, Any, Effects]]:
    """Killed in a write (`where`: before or after its effect), then a new graph whose reconcile cannot tell,
    paused on the unknown-outcome request: (saver, graph, effects)."""
    db, effects = killed_in_write(tmp_path, where, text=text)
    with open_sqlite(db) as saver:
        graph = build(saver, effects, **CANNOT_TELL[reconcile])
        paused_on_unknown(graph)
        yield saver, graph, effects


@pytest.mark.parametrize("reconcile", sorted(CANNOT_TELL))
def test_cannot_tell_asks_a_person_and_done_records_their_result(tmp_path: Path, reconcile: str):
    with asking_about_a_killed_write(tmp_path, "after", reconcile) as (saver, graph, effects):
        with pytest.raises(InvalidDecision):
            runs.resume(graph, THREAD, {"decisions": [{"type": "done"}]})  # done needs the result
        assert runs.pending_request(graph, THREAD)["kind"] == "unknown_outcome"
        result = {"booking": "B-77", "note": "seen in the back office"}
        answer = {"decisions": [{"type": "done", "result": result}], "reviewer": "a note, not a name"}
        out = runs.resume(graph, THREAD, answer, context=CallContext(user_id="ops"))
        assert ledger_state(saver) == ("done", 1)
        audit = saver.ledger.audit(THREAD)
        marked = [e for e in audit if e["event"] == "marked done"]
        assert [e["actor"] for e in marked] == ["ops"]  # the resuming call's identity, never the answer's note
        [decided] = [e for e in audit if e["event"] == "unknown_outcome_decision"]
        assert decided["detail"] == {"decision": "done", "note": "a note, not a name"}
    assert out["status"] == "completed"
    assert len(effects.rows()) == 1
    assert json.loads(tool_answers(out)["c1_0"].content) == result
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("reconcile", sorted(CANNOT_TELL))
def test_cannot_tell_then_not_done_runs_the_write_once(tmp_path: Path, reconcile: str):
    with asking_about_a_killed_write(tmp_path, "before", reconcile) as (saver, graph, effects):
        assert effects.rows() == []
        out = runs.resume(graph, THREAD, {"decisions": [{"type": "not_done"}], "reviewer": "ops"})
        assert ledger_state(saver) == ("done", 2)
    assert out["status"] == "completed"
    assert [k for _, _, k in effects.rows()] == [idempotency_key(THREAD, "c1_0")]
    assert tool_answers(out)["c1_0"].status == "success"
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("reconcile", sorted(CANNOT_TELL))
def test_cannot_tell_then_abandon_stops_with_needs_attention(tmp_path: Path, reconcile: str):
    asked = asking_about_a_killed_write(tmp_path, "before", reconcile, text="book 2 seat, 1 lunch")
    with asked as (saver, graph, effects):
        out = runs.resume(graph, THREAD, {"decisions": [{"type": "abandon"}], "reviewer": "ops"})
        assert ledger_state(saver) == ("abandoned", 1)
        assert ledger_state(saver, "c1_1") == ("done", 1)
    assert out["status"] == "needs_attention"
    assert out["answer"] is None
    assert [k for _, _, k in effects.rows()] == [idempotency_key(THREAD, "c1_1")]
    answers = tool_answers(out)
    assert answers["c1_0"].status == "error"
    assert json.loads(answers["c1_0"].content)["error"]["type"] == "outcome_unknown"
    assert answers["c1_1"].status == "success"
    assert_each_call_answered_once(out["messages"])


def test_only_an_approver_settles_a_killed_write_and_a_refused_answer_never_counts_later(tmp_path: Path):
    """Issue 19, finding 1: `book` needs a finance approver; bo (finance) approved and the child was SIGKILLed
    right after the payment. ana (the requester), and an answer with no identity that names bo in its note,
    may not settle it: each is refused and audited, and nothing runs. When bo then answers, the task replays
    ana's `not_done` first: it stays refused (judged as when it was given), so the write never runs twice."""
    who = ("--approvers", "finance", "--requester", "ana", "--reviewer", "bo:finance")
    db, effects = killed_in_write(tmp_path, "after", "book 2 seat", *who)
    with open_sqlite(db) as saver:
        graph = build(saver, effects, reconcile=None, approvers={"finance"})
        paused_on_unknown(graph)
        ana = CallContext(user_id="ana", roles={"staff"})
        with pytest.raises(InvalidDecision, match=r"needs one of the roles \['finance'\]"):
            runs.resume(graph, THREAD, {"decisions": [{"type": "not_done"}]}, context=ana)
        with pytest.raises(InvalidDecision, match="needs an identified reviewer"):
            runs.resume(graph, THREAD, {"decisions": [{"type": "not_done"}], "reviewer": "bo"})
        assert len(effects.rows()) == 1
        assert ledger_state(saver) == ("claimed", 1)
        bo = CallContext(user_id="bo", roles={"finance"})
        out = runs.resume(graph, THREAD, {"decisions": [{"type": "abandon"}]}, context=bo)
        assert ledger_state(saver) == ("abandoned", 1)
        audit = [e for e in saver.ledger.audit(THREAD) if e["call_id"] == "c1_0"]
    assert out["status"] == "needs_attention"
    assert len(effects.rows()) == 1  # one real payment, never a second
    refused = [e for e in audit if e["event"].startswith("unknown_answer_refused:")]
    assert [(e["actor"], e["detail"]["kind"]) for e in refused] == [
        ("ana", "unknown_outcome"),
        ("anonymous", "unknown_outcome"),
    ]
    assert [(e["actor"], e["detail"]) for e in audit if e["event"] == "unknown_outcome_decision"] == [
        ("bo", {"decision": "abandon"})
    ]
    assert_each_call_answered_once(out["messages"])


def test_a_refused_answer_is_never_handed_back_as_the_next_resumers(tmp_path: Path):
    """Issue 29, finding 1: after the child paid and was SIGKILLed, ana (the requester, no finance role) answers
    `not_done` positionally and keyed by the interrupt's id, and dan (another team) positionally: each is
    refused. bo (finance) then continues with no answer of his own (`invoke(None)`, twice): LangGraph hands the
    stored answers back to the settle task, at their position and the next; each is still judged as its sender's, so
    nothing runs again, nothing is decided, and the question still waits."""
    who = ("--approvers", "finance", "--requester", "ana", "--reviewer", "bo:finance")
    db, effects = killed_in_write(tmp_path, "after", "book 2 seat", *who)
    cfg = {"configurable": {"thread_id": THREAD}}
    ana = CallContext(user_id="ana", roles={"staff"})
    bo = CallContext(user_id="bo", roles={"finance"})
    not_done = {"decisions": [{"type": "not_done"}]}
    with open_sqlite(db) as saver:
        graph = build(saver, effects, reconcile=None, approvers={"finance"})
        paused_on_unknown(graph)
        graph.invoke(Command(resume=not_done), cfg, context=ana)
        [pending] = graph.get_state(cfg).interrupts
        graph.invoke(Command(resume={pending.id: not_done}), cfg, context=ana)
        graph.invoke(Command(resume=not_done), cfg, context={"user_id": "dan", "roles": ["ops"]})
        for _ in range(2):
            out = graph.invoke(None, cfg, context=bo)
            assert out["__interrupt__"][0].value["kind"] == "unknown_outcome"
        assert len(effects.rows()) == 1  # the one real payment of the killed child, never a second
        assert ledger_state(saver) == ("claimed", 1)
        audit = [e for e in saver.ledger.audit(THREAD) if e["call_id"] == "c1_0"]
    assert not [e for e in audit if e["event"] == "unknown_outcome_decision"]
    refused = [e["actor"] for e in audit if e["event"].startswith("unknown_answer_refused:")]
    assert refused and set(refused) == {"ana", "dan"}, refused


def test_an_answer_whose_sender_is_killed_as_it_is_stored_stays_its_senders(tmp_path: Path):
    """Issue 29, finding 2. ana (the requester, no finance role) answers in a real child: `approve` of her own
    call, or `not_done` for the write a killed child already paid. The child is SIGKILLed on the marker right
    after LangGraph stored her answer, before anything else is (`--hold resume`), and bo (finance) continues with
    no answer, `graph.invoke(None, cfg, context=bo)`, in this process (which never opened that thread); the seeded
    trials kill it 0-8 ms after it printed that the answer was stored. Each time ana's answer is judged as hers:
    nothing is paid that nobody authorised, nothing twice, and the audit names bo for nothing; when bo then
    answers himself, the thread completes with exactly one payment. (The bench runs hundreds, bo in a fresh
    process in half of them.)"""
    plans = [AnswerPlan(SEED_BASE, path, "held") for path in PATHS]
    plans += [plan_answer_trial(SEED_BASE + 1 + i, kill="stored", resumer="here") for i in range(ANSWER_TRIALS)]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the settle template (a killed child) first: the longest
        templates = {path: pool.submit(make_template, path, tmp_path / path) for path in sorted(PATHS, reverse=True)}
        trial = lambda p: run_answer_trial(p, templates[p.path].result(), tmp_path / f"{p.path}-{p.seed}")  # noqa: E731
        results = list(pool.map(trial, plans))
    failures = [r.explain() for r in results if not r.ok]
    assert not failures, "\n\n".join(failures)
    for held in results[: len(PATHS)]:
        assert held.killed and held.landed == STORED_NOT_REFUSED, held.explain()
    assert all(r.final == "completed" for r in results), [r.explain() for r in results]


# ------------------------------------------------------------ unknown outcomes from a planted ledger claim


def claimant_of(pid: int) -> str:
    """The ledger's claimant identity (host:pid:start time) of a running process, read from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        started = stat.read().rsplit(")", 1)[1].split()[19]
    return f"{socket.gethostname()}:{pid}:{started}"


def plant_claim(db: str, call_id: str, claimant: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO gatedloop_ledger (thread_id, call_id, tool, args_digest, idempotency_key, state, claimed_at,"
            " attempts, claimant) VALUES (?, ?, 'book', 'x', ?, 'claimed', ?, 1, ?)",
            (THREAD, call_id, idempotency_key(THREAD, call_id), time.time(), claimant),
        )


def test_claim_of_a_dead_process_is_reconciled_and_run_once(db: str, tmp_path: Path):
    effects = Effects(tmp_path / "effects.sqlite")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = claimant_of(gone.pid)
    gone.wait()
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        runs.start(graph, THREAD, "book 2 seat")
        plant_claim(db, "c1_0", dead)
        out = runs.resume(graph, THREAD, {"decisions": [{"type": "approve"}]})
        assert ledger_state(saver) == ("done", 2)
    assert out["status"] == "completed"
    assert [k for _, _, k in effects.rows()] == [idempotency_key(THREAD, "c1_0")]
    assert_each_call_answered_once(out["messages"])


def test_claim_of_a_live_process_goes_to_a_person_not_rerun(db: str, tmp_path: Path):
    effects = Effects(tmp_path / "effects.sqlite")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with open_sqlite(db) as saver:
            graph = build(saver, effects)
            runs.start(graph, THREAD, "book 2 seat")
            plant_claim(db, "c1_0", claimant_of(other.pid))
            out = runs.resume(graph, THREAD, {"decisions": [{"type": "approve"}]})
            request = out["__interrupt__"][0].value
            assert request["kind"] == "unknown_outcome"
            assert [c["reason"] for c in request["calls"]] == ["claimant_running"]
            assert effects.rows() == []
            other.kill()
            other.wait()
            out = runs.resume(graph, THREAD, {"decisions": [{"type": "not_done"}]})
            assert ledger_state(saver) == ("done", 2)
    finally:
        other.kill()
        other.wait()
    assert out["status"] == "completed"
    assert [k for _, _, k in effects.rows()] == [idempotency_key(THREAD, "c1_0")]
    assert_each_call_answered_once(out["messages"])


# ------------------------------------------------------------------------- known bugs, pinned until fixed


def test_rerun_killed_again_then_not_done_runs_the_write(tmp_path: Path):
    """Kill 1 inside the write; the next process re-claims it (attempts 2) and is killed inside it too. The
    third process sees `claimant_died` from its cached first try (attempts 1), so the conditional reclaim
    fails: the call goes to a person, and `not_done` cannot reclaim either."""
    db, effects = killed_in_write(tmp_path, "before")
    cmd = child_command(db, effects.path, THREAD, "--hold", "before", "--gate", str(tmp_path / "x"))
    assert run_child(cmd, tmp_path / "child2.stderr", KillPlan("hold_before")).killed
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        out = runs.resume(graph, THREAD)
        if "__interrupt__" in out:
            out = runs.resume(graph, THREAD, {"decisions": [{"type": "not_done"}]})
        report = inspect_thread(db, effects.path, THREAD, ["c1_0"])
    assert out["status"] == "completed"
    assert report.problems == []
    assert len(effects.rows()) == 1


def test_writes_keep_the_models_order_across_a_crash(tmp_path: Path):
    db, effects = killed_in_write(tmp_path, "before", text="book 1 a, 2 b, 3 c")
    with open_sqlite(db) as saver:
        out = runs.resume(build(saver, effects), THREAD)
    assert out["status"] == "completed"
    assert [args["item"] for _, args, _ in effects.rows()] == ["a", "b", "c"]


def killed_before_step_checkpoint(tmp_path: Path) -> tuple[str, Effects]:
    """A real child approves the write and is SIGKILLed after the approve step's task writes are saved but
    before that step's checkpoint is (the checkpoint write waits on a gate file)."""
    db, effects_path = str(tmp_path / "runs.sqlite"), str(tmp_path / "effects.sqlite")
    hold = ["--hold", "ckpt", "--hold-step", "3", "--gate", str(tmp_path / "x")]
    cmd = child_command(db, effects_path, THREAD, "--text", "book 2 seat", *hold)
    assert run_child(cmd, tmp_path / "child.stderr", KillPlan("hold_ckpt")).killed
    return db, Effects(effects_path)


def test_killed_between_a_steps_writes_and_its_checkpoint_resumes_by_thread_id(tmp_path: Path):
    db, effects = killed_before_step_checkpoint(tmp_path)
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        assert runs.pending_request(graph, THREAD) is None
        out = runs.resume(graph, THREAD)
    assert out["status"] == "completed"
    assert [k for _, _, k in effects.rows()] == [idempotency_key(THREAD, "c1_0")]
    assert_each_call_answered_once(out["messages"])


def test_killed_between_a_steps_writes_and_its_checkpoint_is_listed_as_resumable(tmp_path: Path):
    from gatedloop.checkpoints.threads import describe_thread

    db, effects = killed_before_step_checkpoint(tmp_path)
    with open_sqlite(db) as saver:
        summary = describe_thread(build(saver, effects), THREAD)
    assert summary.status == "interrupted"


def test_claim_of_a_killed_but_unreaped_process_is_reconciled(tmp_path: Path):
    db, effects_path = str(tmp_path / "runs.sqlite"), str(tmp_path / "effects.sqlite")
    cmd = child_command(db, effects_path, THREAD, "--text", "book 2 seat", "--hold", "before", "--gate", "/nonexistent")
    child = Child(cmd, tmp_path / "child.stderr", fresh=True)  # a child of this process, so it stays unreaped
    try:
        assert child.wait_for("hold_before") is not None
        child.proc.kill()  # SIGKILL without reaping: the claimant stays a zombie until wait()
        while process_state(child.proc.pid) != "Z":
            time.sleep(0.01)
        with open_sqlite(db) as saver:
            # The leader shows "Z" while the child's other threads may still be exiting and holding its files,
            # the lease among them: wait for the lease, as a resumer after a crash would.
            out = runs.resume(build(saver, Effects(effects_path)), THREAD, wait_s=30)
    finally:
        child.kill()
        child.wait()
    assert out.get("status") == "completed", out.get("__interrupt__")
    assert len(Effects(effects_path).rows()) == 1


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
