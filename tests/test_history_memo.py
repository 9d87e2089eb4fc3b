"""The per-process history memo gives exactly what a fresh process reads from disk.

A thread is loaded once per process and then extended step by step (`checkpoints.history_memo`,
`checkpoints.channels.fold_messages`). Whatever happened in between (turns here, a turn by another saver on the same
file, a snapshot of the history, a look at an older checkpoint), a load must equal the saver's full walk.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.checkpoints.history_memo import HistoryMemo
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
