"""The floor: gatedloop's graph with nodes that only write what gatedloop's nodes write, nothing else.

    .venv/bin/python -m bench.floor request --rounds 400 --saver gated|plain
    .venv/bin/python -m bench.floor turns --turns 50 --saver gated|plain
    .venv/bin/python -m bench.floor concurrency --threads 50 --turns 4 --saver gated|plain

What LangGraph itself costs for gatedloop's graph: the same state schema and routing, a round of three
checkpointed supersteps (`model`, `validate`, `execute`), an approval turn of eight with an `interrupt()` in
`approve`, `durability="sync"`, on gatedloop's saver (`gated`) or LangGraph's own (`plain`). No model call, no
ledger, no tool, no check: what is left when gatedloop's code costs nothing. `bench.run` measures it in the same
run as the two systems; a target below this floor's ratio to the anchor cannot be met by this graph on LangGraph,
whatever the nodes do. Prints one JSON object on its last line.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiosqlite
from langchain_core.messages import AIMessage, ToolMessage
from langgraph._internal._runnable import RunnableCallable
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from bench import thread_cpu
from bench.scenarios import connect
from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph.routing import RouteState
from gatedloop.nodes.state import GatedState, InputState, OutputState

APPROVE = {"decisions": [{"type": "approve"}]}


def _both(name: str, fn: Any) -> RunnableCallable:
    """One function as a node under invoke and ainvoke alike (as gatedloop's nodes have sync and async twins)."""

    async def afn(state: Any) -> Any:
        return fn(state)

    return RunnableCallable(fn, afn, name=name)


def floor_graph(saver: Any, *, rounds: int | None = None) -> Any:
    """`rounds` given: one long request of reads (never asked); else every turn is one gated write, approved."""

    def model(state: Any) -> dict[str, Any]:
        messages = state["messages"]
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if (rounds is not None and done >= rounds) or (rounds is None and isinstance(messages[-1], ToolMessage)):
            return {"messages": [AIMessage("done", id=f"ai-end-{len(messages)}")], "calls": []}
        call_id = f"call-{len(messages)}"
        effect, verdict = ("read", "run") if rounds is not None else ("write", "ask")
        call = {"name": "lookup_order", "args": {"order_id": f"L-{done}"}, "id": call_id}
        plan = {**call, "verdict": verdict, "effect": effect, "digest": "d" * 32}
        return {"messages": [AIMessage("", tool_calls=[call], id=f"ai-{call_id}")], "calls": [plan]}

    def validate(state: Any) -> dict[str, Any]:
        return {"calls": [dict(c) for c in state["calls"]]}

    def approve(state: Any) -> dict[str, Any]:
        interrupt({"action_requests": [{"name": c["name"], "args": c["args"]} for c in state["calls"]]})
        return {"calls": [{**c, "verdict": "run"} for c in state["calls"]]}

    def execute(state: Any) -> dict[str, Any]:
        call = state["calls"][0]
        content, call_id = '{"status": "shipped"}', call["id"]
        answer = ToolMessage(content, tool_call_id=call_id, name=call["name"], id=f"tool-{call_id}")
        return {"messages": [answer], "calls": [{**call, "verdict": "answered"}]}

    def finalize(state: Any) -> dict[str, Any]:
        return {"status": "completed", "answer": "done", "calls": []}

    builder = StateGraph(GatedState, input_schema=InputState, output_schema=OutputState)
    for name, fn in (("model", model), ("validate", validate), ("approve", approve), ("execute", execute)):
        builder.add_node(name, _both(name, fn))
    builder.add_node("finalize", _both("finalize", finalize))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", after_model, ["validate", "finalize"])
    builder.add_conditional_edges("validate", after_validate, ["approve", "execute"])
    builder.add_edge("approve", "execute")
    builder.add_edge("execute", "model")
    builder.add_edge("finalize", END)
    return builder.compile(checkpointer=saver)


# Routers read only `calls`, as gatedloop's do (graph/routing.py): a conditional edge reads its input schema's channels.
def after_model(state: RouteState) -> str:
    return "validate" if state.get("calls") else "finalize"


def after_validate(state: RouteState) -> str:
    return "approve" if (state.get("calls") or [{}])[0].get("verdict") == "ask" else "execute"


@contextmanager
def open_saver(kind: str, path: str) -> Iterator[Any]:
    if kind == "gated":
        with open_sqlite(path) as saver:
            yield saver
        return
    conn = connect(path)  # the anchor's connection: WAL, synchronous=NORMAL, busy timeout
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        yield saver
    finally:
        conn.close()


@asynccontextmanager
async def open_async_saver(kind: str, path: str) -> AsyncIterator[Any]:
    if kind == "gated":
        async with open_async_sqlite(path) as saver:
            yield saver
        return
    async with aiosqlite.connect(path, timeout=10.0) as conn:
        for pragma in ("busy_timeout=10000", "journal_mode=WAL", "synchronous=NORMAL"):
            await conn.execute(f"PRAGMA {pragma}")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield saver


def request(saver_kind: str, rounds: int) -> dict[str, Any]:
    """One request of `rounds` read rounds, streamed as `bench.long_request` streams it."""
    with open_saver(saver_kind, str(Path(tempfile.mkdtemp()) / "floor.sqlite")) as saver:
        graph = floor_graph(saver, rounds=rounds)
        cfg = {"configurable": {"thread_id": "request"}, "recursion_limit": rounds * 4 + 20}
        started = time.perf_counter()
        for _ in graph.stream({"messages": [("user", "go")]}, cfg, stream_mode="updates", durability="sync"):
            pass
        return {"total_s": time.perf_counter() - started}


def turns(saver_kind: str, count: int) -> dict[str, Any]:
    """`count` approval turns on one thread (each two invokes, as `bench.scenarios.run_turn`)."""
    with open_saver(saver_kind, str(Path(tempfile.mkdtemp()) / "floor.sqlite")) as saver:
        graph = floor_graph(saver)
        cfg = {"configurable": {"thread_id": "turns"}}
        times, cpu_started = [], time.process_time()
        for turn in range(count):
            started = time.perf_counter()
            graph.invoke({"messages": [("user", f"turn {turn}")]}, cfg, durability="sync")
            out = graph.invoke(Command(resume=APPROVE), cfg, durability="sync")
            times.append(time.perf_counter() - started)
            assert out["status"] == "completed", out
        cpu_ms = (time.process_time() - cpu_started) / count * 1000
        return {"mean_ms_per_turn": sum(times) / count * 1000, "cpu_ms_per_turn": cpu_ms}


async def concurrency(saver_kind: str, threads: int, count: int) -> dict[str, Any]:
    """`threads` threads at once, `count` approval turns each, on one file."""
    async with open_async_saver(saver_kind, str(Path(tempfile.mkdtemp()) / "floor.sqlite")) as saver:
        graph = floor_graph(saver)

        async def one(index: int) -> None:
            cfg = {"configurable": {"thread_id": f"floor-{index}"}}
            for turn in range(count):
                await graph.ainvoke({"messages": [("user", f"turn {turn}")]}, cfg, durability="sync")
                await graph.ainvoke(Command(resume=APPROVE), cfg, durability="sync")

        started, cpu_before = time.perf_counter(), thread_cpu.snapshot()
        await asyncio.gather(*(one(i) for i in range(threads)))
        wall = time.perf_counter() - started
        cpu_after, turns = thread_cpu.snapshot(), threads * count
        return {
            "turns_per_s": turns / wall,
            "wall_s": wall,
            "cpu_ms_per_turn_by_thread": thread_cpu.split(cpu_before, cpu_after, turns),
            "switches_per_turn_by_thread": thread_cpu.split_switches(cpu_before, cpu_after, turns),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("shape", choices=("request", "turns", "concurrency"))
    parser.add_argument("--saver", choices=("gated", "plain"), default="gated")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--threads", type=int, default=50)
    args = parser.parse_args(argv)
    if args.shape == "request":
        result = request(args.saver, args.rounds)
    elif args.shape == "turns":
        result = turns(args.saver, args.turns)
    else:
        result = asyncio.run(concurrency(args.saver, args.threads, args.turns))
    print(json.dumps({"shape": args.shape, "saver": args.saver, **result}))


if __name__ == "__main__":
    main()
