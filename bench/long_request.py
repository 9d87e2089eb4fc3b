"""One long request: one user message, then N tool rounds (an agent working through a task), both systems.

    .venv/bin/python -m bench.long_request --system gatedloop|anchor --db PATH [--rounds 400] [--sample-every 25]

A round = the model proposes one read (`lookup_order` with a fresh order id, so it is never a repeat) -> it
runs -> the model is asked again; after N rounds the model answers in text. The request is streamed
(`stream_mode="updates"`, `durability="sync"`); the end of each round (the tool node's update) is
timestamped, and every `--sample-every` rounds the stored bytes are read from a separate connection (the
time that takes is left out of the round it falls in). `total_s` is the whole request's wall time, `cpu_s` the
process's CPU time over it (all threads; far less sensitive than wall time to other work on the machine).
Prints one JSON object on its last line.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import re
import time
from dataclasses import asdict
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph

from bench.scenarios import POLICIES, TOOLS, System, config, connect, stored_bytes
from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

_TASK = re.compile(r"^work through (\d+) orders")
TOOL_NODE = {"gatedloop": "execute", "anchor": "tools"}


def task_text(rounds: int) -> str:
    return f"work through {rounds} orders, one lookup each, then summarize"


def summary_text(rounds: int) -> str:
    return f"Checked {rounds} orders; all have shipped."


def long_responder(messages: list[BaseMessage]) -> AIMessage | None:
    """One lookup per round until the task's count of results is in, then the summary."""
    start = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)), None)
    if start is None:
        return None
    found = _TASK.match(str(messages[start].content))
    if found is None:
        return None
    rounds = int(found.group(1))
    done = sum(isinstance(m, ToolMessage) for m in messages[start + 1 :])
    if done >= rounds:
        return reply(summary_text(rounds))
    return reply(calls=[call("lookup_order", {"order_id": f"L-{done:05d}"}, f"round-{done}")])


def long_limits(rounds: int) -> Limits:
    """Budgets that let one request make `rounds` tool rounds (defaults stop a request at 12 model calls)."""
    return Limits(max_model_calls=rounds + 2, max_tool_calls=rounds + 1, deadline_s=3600.0)


def gatedloop_long_graph(saver: Any, rounds: int) -> CompiledStateGraph:
    model = ScriptedChatModel(responder=long_responder)
    return build_graph(model, TOOLS, policies=POLICIES, limits=long_limits(rounds), checkpointer=saver)


def open_long(system: System, path: str | Path, rounds: int) -> tuple[Any, Any]:
    """(graph, closer) for one system on `path`, with the long-request model."""
    if system == "gatedloop":
        saver_cm = open_sqlite(path)
        saver = saver_cm.__enter__()
        return gatedloop_long_graph(saver, rounds), lambda: saver_cm.__exit__(None, None, None)
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    conn = connect(path)
    saver = SqliteSaver(conn)
    saver.setup()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"add_note": True})
    graph = create_agent(ScriptedChatModel(responder=long_responder), TOOLS, middleware=[hitl], checkpointer=saver)
    return graph, conn.close


def recursion_limit(rounds: int) -> int:
    return rounds * 4 + 20


def run_long_request(system: System, db: str, rounds: int, sample_every: int) -> dict[str, Any]:
    """Stream one request of `rounds` tool rounds; per-round wall time and stored bytes every `sample_every`."""
    graph, close = open_long(system, db, rounds)
    cfg = {**config("request"), "recursion_limit": recursion_limit(rounds)}
    round_s: list[float] = []
    samples: dict[int, dict[str, int]] = {}
    final: dict[str, Any] = {}
    try:
        cpu_started = time.process_time()
        last = started = time.perf_counter()
        stream = graph.stream(
            {"messages": [("user", task_text(rounds))]}, cfg, stream_mode="updates", durability="sync"
        )
        for update in stream:
            if TOOL_NODE[system] not in update:
                continue
            now = time.perf_counter()
            round_s.append(now - last)
            if len(round_s) % sample_every == 0:
                samples[len(round_s)] = asdict(stored_bytes(db))
            last = time.perf_counter()
        total_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_started
        final = graph.get_state(config("request")).values
    finally:
        close()
    if len(round_s) != rounds or str(final["messages"][-1].content) != summary_text(rounds):
        raise AssertionError(f"{system}: {len(round_s)} rounds, ended with {final['messages'][-1].content!r}")
    if system == "gatedloop" and final.get("status") != "completed":
        raise AssertionError(f"gatedloop ended {final.get('status')}: {final.get('stop_detail')}")
    samples[rounds] = asdict(stored_bytes(db))
    return {
        "system": system,
        "rounds": rounds,
        "round_s": round_s,
        "samples": samples,
        "total_s": total_s,
        "cpu_s": cpu_s,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.long_request")
    parser.add_argument("--system", choices=("gatedloop", "anchor"), required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--sample-every", type=int, default=25)
    args = parser.parse_args(argv)
    result = run_long_request(args.system, args.db, args.rounds, args.sample_every)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
