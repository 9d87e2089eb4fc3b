"""The approve node: each decision, each malformed answer (then a correct one), resume in a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from langgraph.types import Command
from sample_app import Effects, build

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import runs
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import CallContext

SUPPORT = Path(__file__).parent / "support"
CFG = {"configurable": {"thread_id": "t1"}}


def start(saver, text="book 2 seat"):
    effects = Effects(Path(saver.path).with_name("effects.sqlite"))
    graph = build(saver, effects)
    out = graph.invoke({"messages": [("user", text)]}, CFG, durability="sync")
    return graph, effects, out


def answers(out) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def test_approve_runs_exactly_the_proposed_arguments_with_an_idempotency_key(db):
    with open_sqlite(db) as saver:
        graph, effects, out = start(saver)
        action = out["__interrupt__"][0].value["action_requests"][0]
        answer = {"decisions": [{"type": "approve"}], "reviewer": "the-CFO"}
        out = graph.invoke(Command(resume=answer), CFG, context=CallContext(user_id="ana"))
        audit = saver.ledger.audit("t1")
    [(tool, args, key)] = effects.rows()
    assert (tool, args) == ("book", action["args"])
    assert key and len(key) == 32
    assert out["status"] == "completed"
    decision = next(e for e in audit if e["event"] == "decision")
    assert decision["actor"] == "ana" and decision["detail"]["decision"] == "approve"
    assert decision["detail"]["note"] == "the-CFO"  # a note in the answer, never the identity


def test_edit_runs_the_edited_arguments_and_tells_the_model(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        edit = {"type": "edit", "edited_action": {"name": "book", "args": {"item": "seat", "quantity": 5}}}
        out = graph.invoke(Command(resume={"decisions": [edit]}), CFG)
    assert [r[1] for r in effects.rows()] == [{"item": "seat", "quantity": 5}]
    body = json.loads(answers(out)["c1_0"].content)
    assert body["ran_with"] == {"item": "seat", "quantity": 5}
    assert body["note"].startswith("a reviewer edited")
    assert_each_call_answered_once(out["messages"])


def test_reject_with_a_reason_runs_nothing_and_the_model_sees_the_reason(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        out = graph.invoke(Command(resume={"decisions": [{"type": "reject", "message": "over budget"}]}), CFG)
    assert effects.rows() == []
    body = json.loads(answers(out)["c1_0"].content)
    assert body == {
        "ok": False,
        "error": {"type": "rejected_by_reviewer", "message": "over budget", "retryable": False},
    }
    assert out["status"] == "completed"


def test_respond_answers_in_the_tools_place_and_runs_nothing(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        out = graph.invoke(Command(resume={"decisions": [{"type": "respond", "message": "already booked"}]}), CFG)
    assert effects.rows() == []
    body = json.loads(answers(out)["c1_0"].content)
    assert body == {"ok": True, "answered_by": "reviewer", "result": "already booked"}


def test_mixed_decisions_for_several_gated_calls_in_one_interrupt(db):
    with open_sqlite(db) as saver:
        graph, effects, out = start(saver, "book 1 a, 2 b, 3 c")
        assert len(out["__interrupt__"]) == 1
        assert [a["args"]["item"] for a in out["__interrupt__"][0].value["action_requests"]] == ["a", "b", "c"]
        decisions = [{"type": "approve"}, {"type": "reject"}, {"type": "approve"}]
        out = graph.invoke(Command(resume={"decisions": decisions}), CFG)
    assert [r[1]["item"] for r in effects.rows()] == ["a", "c"]
    assert_each_call_answered_once(out["messages"])


MALFORMED = [
    pytest.param("yes", "must be an object", id="not-a-dict"),
    pytest.param({"decision": []}, "decisions", id="no-decisions-list"),
    pytest.param({"decisions": []}, "expected 1 decision", id="too-few"),
    pytest.param({"decisions": [{"type": "approve"}, {"type": "approve"}]}, "expected 1 decision", id="too-many"),
    pytest.param({"decisions": [{"type": "maybe"}]}, "unknown type", id="unknown-type"),
    pytest.param({"decisions": ["approve"]}, "must be an object", id="decision-not-a-dict"),
    pytest.param({"decisions": [{"type": "edit"}]}, "edit needs", id="edit-without-action"),
    pytest.param(
        {"decisions": [{"type": "edit", "edited_action": {"name": "lookup", "args": {"query": "x"}}}]},
        "cannot change the tool",
        id="edit-other-tool",
    ),
    pytest.param(
        {"decisions": [{"type": "edit", "edited_action": {"name": "book", "args": {"item": "x"}}}]},
        "not valid",
        id="edit-invalid-args",
    ),
    pytest.param({"decisions": [{"type": "respond"}]}, "respond needs a message", id="respond-without-message"),
    pytest.param({"decisions": [{"type": "approve", "args_digest": "0" * 32}]}, "different arguments", id="stale"),
]


@pytest.mark.parametrize(("answer", "complaint"), MALFORMED)
def test_malformed_answer_changes_nothing_and_the_same_interrupt_is_answerable(db, answer, complaint):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        out = graph.invoke(Command(resume=answer), CFG, durability="sync")
        again = out["__interrupt__"][0].value
        assert complaint in again["error"]
        assert again["action_requests"][0]["args"] == {"item": "seat", "quantity": 2}
        assert effects.rows() == []
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG, durability="sync")
    assert out["status"] == "completed"
    assert len(effects.rows()) == 1
    assert_each_call_answered_once(out["messages"])


def test_runs_resume_raises_before_touching_the_thread(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        before = graph.get_state(CFG).config["configurable"]["checkpoint_id"]
        with pytest.raises(InvalidDecision, match="expected 1 decision"):
            runs.resume(graph, "t1", {"decisions": []})
        assert graph.get_state(CFG).config["configurable"]["checkpoint_id"] == before
        with pytest.raises(InvalidDecision, match="not valid"):
            runs.resume(graph, "t1", {"decisions": [{"type": "edit", "edited_action": {"args": {"item": 1}}}]})
        with pytest.raises(InvalidDecision, match="none was given"):
            runs.resume(graph, "t1", None)
        out = runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]})
    assert out["status"] == "completed" and len(effects.rows()) == 1


def test_disallowed_decision_type_is_refused(db):
    with open_sqlite(db) as saver:
        effects = Effects(Path(db).with_name("effects.sqlite"))
        graph = build(saver, effects, allowed_decisions=("approve", "reject"))
        out = graph.invoke({"messages": [("user", "book 1 x")]}, CFG)
        assert out["__interrupt__"][0].value["review_configs"][0]["allowed_decisions"] == ["approve", "reject"]
        out = graph.invoke(Command(resume={"decisions": [{"type": "respond", "message": "no"}]}), CFG)
        assert "not allowed" in out["__interrupt__"][0].value["error"]
        out = graph.invoke(Command(resume={"decisions": [{"type": "reject"}]}), CFG)
    assert out["status"] == "completed" and effects.rows() == []


def test_arguments_tampered_after_the_interrupt_do_not_run(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        state = graph.get_state(CFG)
        tampered = [{**c, "args": {"item": "seat", "quantity": 999}} for c in state.values["calls"]]
        graph.update_state(CFG, {"calls": tampered})
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG)
        assert effects.rows() == []
        assert_refused_as_changed(out)


def assert_refused_as_changed(out) -> None:
    """Arguments nobody validated are answered with an error and never run, whatever the state says."""
    body = json.loads(answers(out)["c1_0"].content)
    assert body["error"]["type"] == "invalid_arguments" and "differ" in body["error"]["message"]
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])


def test_arguments_tampered_after_approval_are_refused_not_run(db):
    with open_sqlite(db) as saver:
        graph, effects, _ = start(saver)
        graph.update_state(CFG, None, as_node="approve")  # nothing yet: the approval has not happened
        approved = [
            {**c, "verdict": "run", "approved_digest": c["digest"]} for c in graph.get_state(CFG).values["calls"]
        ]
        tampered = [{**c, "args": {"item": "seat", "quantity": 999}} for c in approved]
        graph.update_state(CFG, {"calls": tampered}, as_node="approve")
        out = graph.invoke(None, CFG)
        assert effects.rows() == []
        assert_refused_as_changed(out)


def test_a_paused_thread_is_resumed_by_thread_id_in_a_new_process(db):
    with open_sqlite(db) as saver:
        _, effects, out = start(saver)
        assert "__interrupt__" in out
    script = (
        "import sys; from pathlib import Path; from sample_app import Effects, build\n"
        "from gatedloop.checkpoints import open_sqlite\nfrom gatedloop.graph import runs\n"
        "db = sys.argv[1]\n"
        "with open_sqlite(db) as saver:\n"
        "    graph = build(saver, Effects(Path(db).with_name('effects.sqlite')))\n"
        "    out = runs.resume(graph, 't1', {'decisions': [{'type': 'approve'}], 'reviewer': 'child'})\n"
        "    print(out['status'], __import__('os').getpid())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", script, db], capture_output=True, text=True, env=env, timeout=60)
    assert child.returncode == 0, child.stderr
    status, pid = child.stdout.split()
    assert status == "completed" and int(pid) != os.getpid()
    assert len(effects.rows()) == 1
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        assert graph.get_state(CFG).values["status"] == "completed"
        assert_each_call_answered_once(graph.get_state(CFG).values["messages"])
