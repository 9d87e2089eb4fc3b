"""Reads of a turn run concurrently (checked with a barrier, not a clock); writes one at a time, in order."""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

CFG = {"configurable": {"thread_id": "o1"}}
READ = ToolPolicy(effect="read", approval="never")
WRITE = ToolPolicy(effect="write", approval="never")


def one_turn_of(calls: list[Any], tools: list[Any], policies: dict[str, ToolPolicy], saver: Any) -> Any:
    """A graph whose model asks for `calls` in one turn, then answers."""
    model = ScriptedChatModel(script=[reply(calls=calls), reply("ok")])
    return build_graph(model, tools, policies=policies, checkpointer=saver)


def test_four_reads_of_one_turn_run_at_the_same_time(db):
    barrier = threading.Barrier(4, timeout=5)
    met: list[bool] = []

    @tool
    def slow_read(n: int) -> dict[str, Any]:
        """A read that only returns once all four reads are running at once."""
        barrier.wait()  # raises BrokenBarrierError (-> a tool_error) unless four calls overlap
        met.append(True)
        return {"n": n}

    calls = [call("slow_read", {"n": i}, f"r{i}") for i in range(4)]
    with open_sqlite(db) as saver:
        policies = {"slow_read": ToolPolicy(effect="read", approval="never", timeout_s=10)}
        graph = one_turn_of(calls, [slow_read], policies, saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert met == [True] * 4
    assert out["status"] == "completed"


def test_writes_run_one_at_a_time_in_the_models_order_and_reads_between_them_wait(db):
    events: list[str] = []
    running = threading.Semaphore(1)

    def tracked(name: str, value: str) -> dict[str, Any]:
        assert running.acquire(blocking=False), "two calls overlapped"
        events.append(f"{name}:{value}:start")
        events.append(f"{name}:{value}:end")
        running.release()
        return {"ok": value}

    @tool
    def write(value: str) -> dict[str, Any]:
        """A write."""
        return tracked("write", value)

    @tool
    def read(value: str) -> dict[str, Any]:
        """A read."""
        events.append(f"read:{value}")
        return {"value": value}

    calls = [
        call("write", {"value": "a"}, "w1"),
        call("read", {"value": "x"}, "r1"),
        call("write", {"value": "b"}, "w2"),
        call("write", {"value": "c"}, "w3"),
    ]
    with open_sqlite(db) as saver:
        graph = one_turn_of(calls, [write, read], {"write": WRITE, "read": READ}, saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == "completed"
    assert events == [
        "write:a:start",
        "write:a:end",
        "read:x",
        "write:b:start",
        "write:b:end",
        "write:c:start",
        "write:c:end",
    ]


def test_a_finished_call_is_not_run_again_when_its_node_resumes(db):
    """A read and a write finish, a second write's outcome is unknown: `execute` pauses inside itself for a
    person; on resume the node runs again from the top, and the finished calls come from their task results."""
    runs: list[str] = []
    release = threading.Event()

    @tool
    def lookup(q: str) -> dict[str, Any]:
        """A read."""
        runs.append(f"lookup {q}")
        return {"q": q}

    @tool
    def pay(amount: int) -> dict[str, Any]:
        """A write."""
        runs.append(f"pay {amount}")
        if amount == 2:
            release.wait(5)
        return {"paid": amount}

    calls = [call("lookup", {"q": "a"}, "l1"), call("pay", {"amount": 1}, "p1"), call("pay", {"amount": 2}, "p2")]
    with open_sqlite(db) as saver:
        policies = {"lookup": READ, "pay": ToolPolicy(effect="write", approval="never", timeout_s=0.2)}
        graph = one_turn_of(calls, [lookup, pay], policies, saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
        assert out["__interrupt__"][0].value["kind"] == "unknown_outcome"
        release.set()
        out = graph.invoke(Command(resume={"decisions": [{"type": "done", "result": {"paid": 2}}]}), CFG)
    assert out["status"] == "completed"
    assert runs == ["lookup a", "pay 1", "pay 2"]
