"""Storage per step does not grow with the work: one long request on a real SQLite file.

A size, not a time, so it is stable on a busy machine. One request makes 400 tool rounds (about 2 s with
the scripted model); the bytes stored are read from the file after every round of two windows, rounds
26-50 and 376-400. Before the fix, every checkpoint carried the request's repeat-detection table again,
and a round at 400 added 4.6x what a round at 50 did. And a step stores only the gate's keys it changed.
"""

from __future__ import annotations

import sqlite3
import statistics
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.state import PROTECTED_KEYS, OutputState
from gatedloop.tools import ToolPolicy

ROUNDS = 400
WINDOWS = (range(26, 51), range(376, 401))


@tool
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order (a read)."""
    return {"order_id": order_id, "status": "shipped", "carrier": "SF Express"}


def one_lookup_per_round(messages: list[BaseMessage]) -> AIMessage:
    start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    done = sum(isinstance(m, ToolMessage) for m in messages[start:])
    if done >= ROUNDS:
        return reply(f"checked {done} orders")
    return reply(calls=[call("lookup", {"order_id": f"L-{done:05d}"}, f"round-{done}")])


def stored(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        (checkpoints,) = conn.execute("SELECT SUM(LENGTH(checkpoint) + LENGTH(metadata)) FROM checkpoints").fetchone()
        (writes,) = conn.execute("SELECT SUM(LENGTH(value)) FROM writes").fetchone()
    finally:
        conn.close()
    return int(checkpoints) + int(writes)


def test_bytes_a_step_adds_at_step_400_are_within_1_5x_of_those_at_step_50(db):
    limits = Limits(max_model_calls=ROUNDS + 2, max_tool_calls=ROUNDS, deadline_s=3600)
    after_round: dict[int, int] = {}
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=one_lookup_per_round),
            [lookup],
            policies={"lookup": ToolPolicy(effect="read", approval="never")},
            limits=limits,
            checkpointer=saver,
        )
        cfg = {"configurable": {"thread_id": "long"}, "recursion_limit": ROUNDS * 4 + 20}
        rounds = 0
        for update in graph.stream(
            {"messages": [("user", "work through the orders")]}, cfg, stream_mode="updates", durability="sync"
        ):
            if "execute" in update:
                rounds += 1
                if any(rounds in w or rounds + 1 == w.start for w in WINDOWS) or rounds == 50:
                    after_round[rounds] = stored(db)
        final = graph.get_state(cfg).values
    assert rounds == ROUNDS and final["status"] == "completed"
    assert final["messages"][-1].content == f"checked {ROUNDS} orders"

    def typical_step(window: range) -> float:
        return statistics.median(after_round[n] - after_round[n - 1] for n in window)

    early, late = typical_step(WINDOWS[0]), typical_step(WINDOWS[1])
    assert late <= 1.5 * early, f"a step at {ROUNDS} adds {late:.0f} bytes, at 50 {early:.0f}"
    # Amortized, snapshots of the history included: the mean bytes per step does not grow either.
    mean_50, mean_400 = after_round[50] / 50, after_round[ROUNDS] / ROUNDS
    assert mean_400 <= 1.5 * mean_50, f"mean bytes per step {mean_400:.0f} at {ROUNDS}, {mean_50:.0f} at 50"


@tool
def pay(amount: float, to: str) -> str:
    """Pay an amount to someone (a write)."""
    return f"paid {amount} to {to}"


def pay_then_answer(messages: list[BaseMessage]) -> AIMessage:
    start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
    if any(isinstance(m, ToolMessage) for m in messages[start:]):
        return reply("done")
    if "pay" not in str(messages[start].content):
        return reply("nothing to pay")
    return reply(calls=[call("pay", {"amount": 5.0, "to": "bo"}, f"c{start}")])


def test_a_step_stores_only_the_gate_keys_it_changed(db):
    """LangGraph checkpoints every key a node writes, changed or not (and a server streams it): the gate's nodes
    leave out a key that already holds the value (a `stop` still None, `calls` already empty), except the result
    keys a caller reads from a paused or finished run."""
    plain = PROTECTED_KEYS - {"seen_reads"}
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=pay_then_answer),
            [pay],
            policies={"pay": ToolPolicy(effect="write", approval="always")},
            checkpointer=saver,
        )
        cfg = {"configurable": {"thread_id": "t"}}
        paused = graph.invoke({"messages": [("user", "pay bo")]}, cfg)
        assert paused["__interrupt__"] and (paused["status"], paused["answer"]) == (None, None)
        assert graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)["answer"] == "done"
        second = graph.invoke({"messages": [("user", "hello")]}, cfg)
        assert (second["status"], second["answer"]) == ("completed", "nothing to pay")
        names = {t.id: t.name for snap in graph.get_state_history(cfg) for t in snap.tasks}
        written, unchanged = [], []
        for before in saver.list(cfg):
            if before.metadata.get("source") == "input":
                continue  # the caller's input, not a node's step
            held = before.checkpoint["channel_values"]
            for task_id, key, value in before.pending_writes or []:
                if key in plain:
                    written.append((names[task_id], key))
                    if held.get(key) == value and key not in OutputState.__annotations__:
                        unchanged.append((names[task_id], key, value))
    assert unchanged == []
    assert ("model", "status") in written  # the second request resets the first one's result
    assert written.count(("finalize", "status")) == 2
    assert ("model", "stop") not in written and ("approve", "review_error") not in written
