"""The per-process history memo gives exactly what a fresh process reads from disk.

A thread is loaded once per process and then extended step by step (`checkpoints.history_memo`,
`checkpoints.channels.fold_messages`). Whatever happened in between (turns here, a turn by another saver on the same
file, a snapshot of the history, a look at an older checkpoint), a load must equal the saver's full walk.
"""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.checkpoints.channels import DoublingDeltaChannel, fold_messages
from gatedloop.checkpoints.history_memo import HistoryMemo, _Walk
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

CFG = {"configurable": {"thread_id": "memo"}}


@tool
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order (a read)."""
    return {"order_id": order_id, "status": "shipped"}


def one_read_then_answer(messages: list[BaseMessage]) -> AIMessage:
    turn = sum(isinstance(m, HumanMessage) for m in messages)
    if isinstance(messages[-1], ToolMessage):
        return reply(f"answer {turn}")
    return reply(calls=[call("lookup", {"order_id": f"A-{turn}"}, f"c{turn}")])


def graph_on(saver: Any) -> Any:
    model = ScriptedChatModel(responder=one_read_then_answer)
    return build_graph(
        model, [lookup], policies={"lookup": ToolPolicy(effect="read", approval="never")}, checkpointer=saver
    )


def seen(values: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(type(m).__name__, str(m.id), str(m.content)) for m in values["messages"]]


def from_disk(db: str, config: dict[str, Any]) -> list[tuple[str, str, str]]:
    with open_sqlite(db) as fresh:
        return seen(graph_on(fresh).get_state(config).values)


def test_loads_through_the_memo_equal_a_fresh_process_read(db):
    with open_sqlite(db) as saver:
        graph = graph_on(saver)
        for turn in range(1, 41):  # 160+ messages: the history is snapshotted along the way
            out = graph.invoke({"messages": [("user", f"question {turn}")]}, CFG, durability="sync")
            assert out["answer"] == f"answer {turn}"
            if turn % 10 == 0:
                assert seen(graph.get_state(CFG).values) == from_disk(db, CFG)
        with open_sqlite(db) as other:  # another saver (as another process would) adds a turn
            graph_on(other).invoke({"messages": [("user", "from elsewhere")]}, CFG, durability="sync")
        here = graph.get_state(CFG).values
        assert seen(here) == from_disk(db, CFG) and here["messages"][-1].content == "answer 41"
        older = list(graph.get_state_history(CFG, limit=30))[-1].config  # an older checkpoint, off the memo
        assert seen(graph.get_state(older).values) == from_disk(db, older)
        out = graph.invoke({"messages": [("user", "question 42")]}, CFG, durability="sync")
        assert out["answer"] == "answer 42"
        assert seen(graph.get_state(CFG).values) == from_disk(db, CFG)
        assert len(out["messages"]) == 42 * 4


def test_async_loads_of_many_threads_at_once_equal_a_fresh_process_read(db):
    """Threads interleaved on one async saver: each load walks back to its own thread's memoized checkpoint."""
    threads = [{"configurable": {"thread_id": f"memo-{i}"}} for i in range(6)]

    async def run() -> list[list[tuple[str, str, str]]]:
        async with open_async_sqlite(db) as saver:
            graph = graph_on(saver)
            for turn in range(1, 5):
                outs = await asyncio.gather(
                    *(graph.ainvoke({"messages": [("user", f"q {turn}")]}, cfg, durability="sync") for cfg in threads)
                )
                assert [o["answer"] for o in outs] == [f"answer {turn}"] * len(threads)
            return [seen((await graph.aget_state(cfg)).values) for cfg in threads]

    here = asyncio.run(run())
    assert here == [from_disk(db, cfg) for cfg in threads]
    assert all(len(h) == 4 * 4 for h in here)


def test_the_memo_keeps_the_newest_threads_within_its_bounds():
    memo = HistoryMemo(threads=3, writes=10)
    history = {"messages": {"writes": [("task", "messages", i) for i in range(4)]}}
    for i in range(4):
        memo.put((f"t{i}", ""), f"c{i}", history)  # 5 entries each: two fit in 10
    assert [memo.latest((f"t{i}", "")) is not None for i in range(4)] == [False, False, True, True]
    huge = {"messages": {"writes": [("task", "messages", i) for i in range(50)]}}
    memo.put(("big", ""), "c", huge)  # over the bound alone: still kept, as the newest
    assert memo.latest(("big", "")) == ("c", huge) and memo.latest(("t3", "")) is None


def snapshot_reads(saver: Any) -> list[str]:
    """The checkpoints holding the history itself (snapshots) that loads decode while walking back."""
    found: list[str] = []
    walking = [False]
    loads, walk = saver.serde.loads_typed, saver.get_delta_channel_history

    def counted_loads(data: Any) -> Any:
        value = loads(data)
        if walking[0] and isinstance(value, dict) and "messages" in (value.get("channel_values") or {}):
            found.append(str(value.get("id")))
        return value

    def counted_walk(**kwargs: Any) -> Any:
        walking[0] = True
        try:
            return walk(**kwargs)
        finally:
            walking[0] = False

    saver.serde.loads_typed, saver.get_delta_channel_history = counted_loads, counted_walk
    return found


def test_a_snapshot_stored_since_the_memoized_checkpoint_is_not_read(db):
    """The memo's value and the writes since stand for a snapshot stored after it: a load reads neither the
    snapshot nor the whole stretch before it, and the history stays the same message objects."""
    with open_sqlite(db) as saver:
        graph = graph_on(saver)
        graph.invoke({"messages": [("user", "question 1")]}, CFG, durability="sync")
        reads = snapshot_reads(saver)
        for turn in range(2, 61):  # 240 messages: snapshots at 100 and 200 updates
            before = graph.get_state(CFG).values["messages"]
            graph.invoke({"messages": [("user", f"question {turn}")]}, CFG, durability="sync")
            after = graph.get_state(CFG).values["messages"]
            assert all(map(operator.is_, before[:-4], after))  # the last turn's, read back once
        assert reads == []
        assert seen(graph.get_state(CFG).values) == from_disk(db, CFG)
    conn = sqlite3.connect(db)
    stored = [saver.serde.loads_typed((t, b)) for t, b in conn.execute("SELECT type, checkpoint FROM checkpoints")]
    assert sum("messages" in c["channel_values"] for c in stored) >= 2  # the run stored snapshots


def test_a_load_that_never_meets_the_memoized_checkpoint_reads_the_snapshots_on_its_branch(db):
    """Another process forks the thread from an early checkpoint and goes on past a snapshot: this process's
    memo is on the other branch, so the load reads the branch as the saver's own walk does."""
    with open_sqlite(db) as saver:
        graph = graph_on(saver)
        for turn in range(1, 11):
            graph.invoke({"messages": [("user", f"question {turn}")]}, CFG, durability="sync")
        early = list(graph.get_state_history(CFG))[-8].config
        with open_sqlite(db) as other:
            forked = graph_on(other)
            forked.invoke({"messages": [("user", "fork 1")]}, early, durability="sync")
            for turn in range(2, 41):
                forked.invoke({"messages": [("user", f"fork {turn}")]}, CFG, durability="sync")
            tip = forked.get_state(CFG).config
        reads = snapshot_reads(saver)
        assert seen(graph.get_state(tip).values) == from_disk(db, tip)
        assert reads  # the fork's snapshot, read: the memo was not on its way
        assert seen(graph.get_state(CFG).values) == from_disk(db, CFG)


def test_an_earlier_answer_rewritten_under_the_memo_never_reaches_the_model(db):
    """update_state replaces an answer given turns ago (same message id, forged content): the next load through
    the memo holds the rewrite, and the gate removes it as foreign before the model is asked."""
    sent: list[list[BaseMessage]] = []

    def recording(messages: list[BaseMessage]) -> AIMessage:
        sent.append(messages)
        return one_read_then_answer(messages)

    with open_sqlite(db) as saver:
        model = ScriptedChatModel(responder=recording)
        graph = build_graph(
            model, [lookup], policies={"lookup": ToolPolicy(effect="read", approval="never")}, checkpointer=saver
        )
        for turn in range(1, 31):
            graph.invoke({"messages": [("user", f"question {turn}")]}, CFG, durability="sync")
        first = next(m for m in graph.get_state(CFG).values["messages"] if isinstance(m, ToolMessage))
        forged = ToolMessage("forged", tool_call_id=first.tool_call_id, name=first.name, id=first.id)
        graph.update_state(CFG, {"messages": [forged]}, as_node="execute")
        assert any(m.content == "forged" for m in graph.get_state(CFG).values["messages"])
        sent.clear()
        out = graph.invoke({"messages": [("user", "question 31")]}, CFG, durability="sync")
    assert out["answer"] == "answer 31"
    assert sent and not any(m.content == "forged" for request in sent for m in request)
    assert not any(m.content == "forged" for m in out["messages"])


class JsonSerde:
    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return json.loads(data[1])


def walked(base: tuple[str, Any] | None, rows: list[tuple[str, dict[str, Any]]]) -> tuple[Any, Any, Any]:
    """A walk of `rows` (newest first, each a checkpoint id and its stored channel values) with `base` memoized."""
    memo = HistoryMemo()
    if base is not None:
        memo.put(("t", ""), *base)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": rows[0][0]}}
    walk = _Walk(memo, config, ["messages", "seen"], JsonSerde())  # type: ignore[arg-type]
    for cid, values in rows:
        if walk.step((cid, "json", json.dumps({"channel_values": values}).encode())):
            break
    walk.finish()
    return walk.chain, walk.seeds, walk.from_memo


def test_a_walk_that_passes_snapshots_and_never_meets_the_memo_is_the_walk_without_one():
    """Rows newer than the memoized checkpoint are held back; when the walk goes past where it could be, they are
    read as the walk without a memo reads them: each channel's chain ends at the row that seeds it."""
    rows = [("9", {}), ("8", {"messages": ["snapshot"]}), ("7", {}), ("6", {"seen": {"s": 1}}), ("4", {}), ("3", {})]
    histories = {"messages": {"writes": []}, "seen": {"writes": []}}
    assert walked(("5", histories), rows) == walked(None, rows)
    assert walked(None, rows)[0] == {"messages": ["8"], "seen": ["8", "7", "6"]}
    chain, seeds, from_memo = walked(("7", histories), rows)
    assert (chain, seeds, from_memo) == ({"messages": ["8", "7"], "seen": ["8", "7"]}, {}, {"messages", "seen"})


def test_a_load_replays_only_what_was_stored_since_the_memoized_checkpoint(db, monkeypatch):
    """The memo hands over the value the channel rebuilt at its checkpoint, with the writes stored since: a load's
    replay does not grow with the thread."""
    replayed: list[int] = []
    replay = DoublingDeltaChannel.replay_writes

    def counted(self: DoublingDeltaChannel, writes: Any) -> None:
        if self.reducer is fold_messages:
            replayed.append(len(writes))
        replay(self, writes)

    monkeypatch.setattr(DoublingDeltaChannel, "replay_writes", counted)
    with open_sqlite(db) as saver:
        graph = graph_on(saver)
        for turn in range(1, 31):  # 120 messages: past a snapshot
            graph.invoke({"messages": [("user", f"question {turn}")]}, CFG, durability="sync")
        here = seen(graph.get_state(CFG).values)
        assert replayed == [4] * 30  # each load: the user message, the call, its answer, the reply
        assert here == from_disk(db, CFG)
