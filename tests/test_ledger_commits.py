"""A round of reads commits the ledger three times: proposals, validation, answers; a decision once (issue 21).
Each commit carries the evidence chain's entries for the rows it wrote (invariant 14, checkpoints/chain.py).

Each audit event is written in the transaction of the evidence it describes (a call's `validated` event with its
registration, its `executed` event with its answer), not in a commit of its own: two commits fewer per round, and
no audit row without the evidence it speaks of. Counted on the ledger's own connection of a real SQLite file.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

ROUNDS = 5


@tool
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order (a read)."""
    return {"order_id": order_id, "status": "shipped"}


def one_lookup_per_round(messages: list[BaseMessage]) -> AIMessage:
    start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    done = sum(isinstance(m, ToolMessage) for m in messages[start:])
    if done >= ROUNDS:
        return reply(f"checked {done} orders")
    return reply(calls=[call("lookup", {"order_id": f"L-{done}"}, f"round-{done}")])


@contextmanager
def traced_writes(saver: Any) -> Iterator[list[str]]:
    """The statements the ledger's writer connection runs meanwhile (its reads run on another connection)."""
    statements: list[str] = []
    saver.ledger._writer.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        saver.ledger._writer.set_trace_callback(None)


def test_a_read_round_commits_the_ledger_three_times_with_its_audit_inside(db):
    config = {"configurable": {"thread_id": "commits"}}
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=one_lookup_per_round),
            [lookup],
            policies={"lookup": ToolPolicy(effect="read", approval="never")},
            limits=Limits(max_model_calls=ROUNDS + 2),
            checkpointer=saver,
        )
        graph.invoke({"messages": [("user", "warm up")]}, {"configurable": {"thread_id": "warm"}})
        with traced_writes(saver) as statements:
            out = graph.invoke({"messages": [("user", "check the orders")]}, config, durability="sync")
        audit = saver.ledger.audit("commits")
    assert out["answer"] == f"checked {ROUNDS} orders"
    # A new thread's first run records the graph that made it (invariant 11), once; the request's start commits
    # nothing else (no cancel flag to clear); then three commits a round.
    first, *rounds = transactions(statements)
    assert first[0].startswith("INSERT INTO GATEDLOOP_THREAD_GRAPHS"), first
    assert len(rounds) == 3 * ROUNDS, statements
    for n in range(ROUNDS):
        events = [e["event"] for e in audit if e["call_id"] == f"round-{n}"]
        assert events == ["validated", "executed"]


@tool
def refund(order_id: str) -> dict[str, Any]:
    """Refund an order (a write that needs approval)."""
    return {"order_id": order_id, "refunded": True}


def one_refund(messages: list[BaseMessage]) -> AIMessage:
    if isinstance(messages[-1], ToolMessage):
        return reply("refunded")
    return reply(calls=[call("refund", {"order_id": "A-1"}, "refund-1")])


def transactions(statements: list[str]) -> list[list[str]]:
    """The write transactions among the traced statements, each as its statements' first three words."""
    found: list[list[str]] = []
    current: list[str] | None = None
    for statement in statements:
        words = " ".join(statement.split()[:3]).upper()
        if words.startswith("BEGIN"):
            current = []
        elif words == "COMMIT" and current is not None:
            found.append(current)
            current = None
        elif current is not None:
            current.append(words)
    return found


def asked_then_answered(db: str, thread_id: str, decision: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """A refund asked, then answered with `decision`: every statement traced, and the answer's transactions."""
    config = {"configurable": {"thread_id": thread_id}}
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=one_refund),
            [refund],
            policies={"refund": ToolPolicy(effect="write", approval="always")},
            checkpointer=saver,
        )
        with traced_writes(saver) as statements:
            graph.invoke({"messages": [("user", "refund A-1")]}, config, durability="sync")
            asked = len(statements)
            out = graph.invoke(Command(resume={"decisions": [decision]}), config, durability="sync")
    assert out["status"] == "completed"
    return statements, transactions(statements[asked:])


def test_a_decision_is_audited_in_the_transaction_that_records_it(db):
    """An answer is one commit (issue 52): the reviewer's decision, its audit row, the `decided` notice and the
    chain's entries (invariant 14); a crash keeps all or none. Then the write's claim, its finish and its answer.
    And a new request takes no write lock just to clear a cancel flag that is not there."""
    statements, answered = asked_then_answered(db, "approved", {"type": "approve"})
    assert answered[0] == [
        "INSERT INTO GATEDLOOP_AUDIT",
        "INSERT INTO GATEDLOOP_APPROVALS",
        "INSERT INTO GATEDLOOP_OUTBOX",
        "SELECT SEQ, CHAIN_HASH",
        "INSERT INTO GATEDLOOP_CHAIN",
    ]
    assert [tx[0] for tx in answered[1:3]] == ["INSERT INTO GATEDLOOP_LEDGER", "UPDATE GATEDLOOP_LEDGER SET"]
    assert not any("DELETE FROM GATEDLOOP_CANCEL" in tx for tx in transactions(statements))


def test_a_rejection_and_its_answer_to_the_model_are_one_commit(db):
    """A rejection is a decision and an answer to the model at once: its approval record, audit row, recorded
    answer and notice in one transaction, and nothing else is written for it."""
    _, answered = asked_then_answered(db, "rejected", {"type": "reject", "message": "not this one"})
    assert len(answered) == 2, answered  # the decision; then the `finished` notice when the request ends
    assert {"INSERT INTO GATEDLOOP_APPROVALS", "INSERT INTO GATEDLOOP_CALLS", "INSERT INTO GATEDLOOP_OUTBOX"} <= set(
        answered[0]
    ), answered[0]
    assert not any("INSERT INTO GATEDLOOP_LEDGER" in tx for tx in answered)


def test_a_view_that_raises_writes_nothing(db):
    """`one_commit`: a decision that fails half-way leaves no trace of its first half."""
    with open_sqlite(db) as saver:
        ledger = saver.ledger
        try:
            with ledger.one_commit() as view:
                view.record("t", "c-1", "decision", {"n": 1})
                raise RuntimeError("crash between two writes of one decision")
        except RuntimeError:
            pass
        assert ledger.audit("t") == []
        with ledger.one_commit() as view:
            view.record("t", "c-1", "decision", {"n": 1})
            assert ledger.audit("t") == []  # pending until the block ends
        assert [row["event"] for row in ledger.audit("t")] == ["decision"]
