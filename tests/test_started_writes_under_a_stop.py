"""A stop (deadline, cancel) stops work not yet started; a write that started is settled, never answered "not run";
and time spent waiting for a person to settle an unknown outcome does not count toward the deadline.

The loop's clock is a fake one (`LoopParts.clock`), moved by the tools (work) and by the test (waiting), so the
deadline is reached by arithmetic, never by sleeping.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph, runs
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

THREAD = "w1"
DEADLINE_S = 600.0
WAIT_S = 1000.0  # the person answers long after the deadline would have passed
TURN = [
    call("lookup", {"key": "before"}, "r1"),
    call("pay", {"to": "lossy"}, "p1"),
    call("lookup", {"key": "after"}, "r2"),
    call("pay", {"to": "bob"}, "p2"),
]
DONE = {"type": "done", "result": {"paid": "seen at the bank"}}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Bank:
    """The tools: every real execution is recorded. Paying `lossy` takes `work_s` of the loop's clock, then loses
    its connection, and the bank cannot tell afterwards whether it paid (a person must say)."""

    def __init__(self, clock: Clock, work_s: float) -> None:
        self.ran: list[tuple[str, str]] = []

        @tool
        def lookup(key: str) -> str:
            """Look something up (read)."""
            self.ran.append(("lookup", key))
            return key

        @tool
        def pay(to: str) -> dict[str, Any]:
            """Pay someone (write)."""
            self.ran.append(("pay", to))
            if to == "lossy":
                clock.now += work_s
                raise ConnectionError("the bank closed the connection after taking the payment")
            return {"paid": to}

        def cannot_tell(args: dict[str, Any], key: str) -> Any:
            raise ConnectionError("the bank's status service is down")

        self.tools = [lookup, pay]
        self.policies = {
            "lookup": ToolPolicy(effect="read", approval="never"),
            "pay": ToolPolicy(effect="write", approval="never", reconcile=cannot_tell),
        }


def paused_on_the_question(saver: Any, work_s: float) -> tuple[Any, Bank, Clock]:
    """A thread whose turn is `TURN`, paused on the unknown outcome of `p1` after r1 and p1 ran."""
    clock = Clock()
    bank = Bank(clock, work_s)
    model = ScriptedChatModel(script=[reply(calls=TURN), reply("all settled")])
    graph = build_graph(
        model, bank.tools, policies=bank.policies, limits=Limits(deadline_s=DEADLINE_S), checkpointer=saver
    )
    parts = parts_of(graph)
    assert parts is not None
    parts.clock = clock
    out = runs.start(graph, THREAD, "pay lossy, then bob")
    assert out["__interrupt__"][0].value["kind"] == "unknown_outcome"
    assert bank.ran == [("lookup", "before"), ("pay", "lossy")]
    return graph, bank, clock


def answers(out: dict[str, Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def body(message: ToolMessage) -> Any:
    return json.loads(str(message.content))


def test_a_long_wait_for_a_person_is_not_work_and_the_request_goes_on(db: str):
    with open_sqlite(db) as saver:
        graph, bank, clock = paused_on_the_question(saver, work_s=100.0)
        clock.now += WAIT_S
        out = runs.resume(graph, THREAD, {"decisions": [DONE]})
        waited = graph.get_state({"configurable": {"thread_id": THREAD}}).values["counters"]["waited_s"]
    assert out["status"] == "completed", out.get("stop_detail")
    got = answers(out)
    assert body(got["p1"]) == DONE["result"]
    assert bank.ran == [("lookup", "before"), ("pay", "lossy"), ("lookup", "after"), ("pay", "bob")]
    assert body(got["p2"]) == {"paid": "bob"}
    assert waited == pytest.approx(WAIT_S)  # the wait, not the 100 s the payment itself took
    assert_each_call_answered_once(out["messages"])


def test_work_before_the_question_still_counts_and_the_started_write_gets_the_persons_answer(db: str):
    """700 s of work before the question pass the 600 s deadline: the request stops, but the payment that started
    is answered with what the person said, and only the calls not yet started are "not run"."""
    with open_sqlite(db) as saver:
        graph, bank, clock = paused_on_the_question(saver, work_s=700.0)
        clock.now += WAIT_S
        out = runs.resume(graph, THREAD, {"decisions": [DONE]})
        entries = [(e.call_id, e.state) for e in saver.ledger.entries(THREAD)]
    assert out["status"] == "deadline"
    got = answers(out)
    assert body(got["p1"]) == DONE["result"]
    assert body(got["r2"])["error"]["type"] == body(got["p2"])["error"]["type"] == "deadline"
    assert bank.ran == [("lookup", "before"), ("pay", "lossy")]
    assert entries == [("p1", "done")]
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize(
    ("decision", "status", "p1_error"),
    [(DONE, "cancelled", None), ({"type": "abandon"}, "needs_attention", "outcome_unknown")],
)
def test_a_cancel_while_paused_settles_the_started_write_and_runs_nothing_new(
    db: str, decision: dict[str, Any], status: str, p1_error: str | None
):
    with open_sqlite(db) as saver:
        graph, bank, _ = paused_on_the_question(saver, work_s=1.0)
        runs.cancel(THREAD, ledger=saver.ledger)
        out = runs.resume(graph, THREAD, {"decisions": [decision]})
        entries = [(e.call_id, e.state) for e in saver.ledger.entries(THREAD)]
    assert out["status"] == status
    got = answers(out)
    if p1_error is None:
        assert body(got["p1"]) == DONE["result"]
    else:
        assert body(got["p1"])["error"]["type"] == p1_error
    assert "Not run" not in str(got["p1"].content)
    assert body(got["r2"])["error"]["type"] == body(got["p2"])["error"]["type"] == "cancelled"
    assert bank.ran == [("lookup", "before"), ("pay", "lossy")]
    assert entries == [("p1", "done" if p1_error is None else "abandoned")]
    assert_each_call_answered_once(out["messages"])


def test_finalize_answers_a_claimed_write_as_unknown_never_as_not_run(db: str):
    """`finalize`'s last line: a write left open with a claim (it started; nobody knows if it happened) when a stop
    ends the request is answered `outcome_unknown`, and the request needs attention."""
    clock = Clock()
    bank = Bank(clock, work_s=0.0)
    gated = {**bank.policies, "pay": ToolPolicy(effect="write", approval="always")}
    with open_sqlite(db) as saver:
        model = ScriptedChatModel(script=[reply(calls=[call("pay", {"to": "bob"}, "p1")])])
        graph = build_graph(model, bank.tools, policies=gated, checkpointer=saver)
        runs.start(graph, THREAD, "pay bob")
        saver.ledger.claim(THREAD, "p1", "pay", "digest")
        config = {"configurable": {"thread_id": THREAD}}
        graph.update_state(config, {"stop": "cancelled", "stop_detail": "cancelled on request"}, as_node="validate")
        out = graph.invoke(None, config)
    assert out["status"] == "needs_attention"
    assert body(answers(out)["p1"])["error"]["type"] == "outcome_unknown"
    assert bank.ran == []
