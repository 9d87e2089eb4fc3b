"""What a middleware list costs a long thread (issue 34): per-turn time and stored bytes, in one run.

    .venv/bin/python -m bench.middleware [--turns 400] [--every 50]

One thread of `--turns` requests on a SQLite file, each one read and an answer (a scripted model, no network),
built four ways: no `middleware=` at all, an empty list, one no-op `AgentMiddleware` (the hooks' machinery), and
LangChain's `SummarizationMiddleware` (a scripted summarizer, trigger at 40 messages, keep 20). Prints the median
time of the last `--every` turns (the better of two passes) and the stored bytes, each as a ratio to no middleware,
and how often the summarizer was asked.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware, SummarizationMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from bench.scenarios import stored_bytes
from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy


@tool
def lookup(order_id: str) -> dict[str, Any]:
    """Look up an order (a read)."""
    return {"order_id": order_id, "status": "shipped"}


def one_read_per_request(messages: list[BaseMessage]) -> AIMessage:
    """The request's number is read from its own message: a summarized history no longer holds every one."""
    last = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
    turn = int(str(last.content).removeprefix("where is order ").removesuffix("?"))
    if isinstance(messages[-1], ToolMessage):
        return reply(f"order {turn} shipped")
    return reply(calls=[call("lookup", {"order_id": f"A-{turn}"}, f"c{turn}")])


class NoOp(AgentMiddleware):
    """Every model-side hook, doing nothing."""

    def before_model(self, state: Any, runtime: Any) -> None:
        return None

    def after_model(self, state: Any, runtime: Any) -> None:
        return None

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(request)


SUMMARIZED: list[int] = []
"""One entry per summarizer call, in the current measurement."""


def summarize(messages: list[BaseMessage]) -> AIMessage:
    SUMMARIZED.append(len(messages))
    return reply("summary of the earlier orders")


def lists() -> dict[str, list[Any] | None]:
    summarizer = ScriptedChatModel(responder=summarize)
    return {
        "none": None,
        "empty list": [],
        "no-op middleware": [NoOp()],
        "summarization": [SummarizationMiddleware(summarizer, trigger=("messages", 40), keep=("messages", 20))],
    }


def measure(middleware: list[Any] | None, turns: int, every: int) -> tuple[list[float], list[int]]:
    """(seconds per request, stored bytes every `every` requests) of one thread."""
    SUMMARIZED.clear()
    folder = tempfile.mkdtemp(prefix="gl-mw-")
    path = os.path.join(folder, "t.sqlite")
    times: list[float] = []
    sizes: list[int] = []
    with open_sqlite(path) as saver:
        kwargs = {} if middleware is None else {"middleware": middleware}
        graph = build_graph(
            ScriptedChatModel(responder=one_read_per_request),
            [lookup],
            policies={"lookup": ToolPolicy(effect="read", approval="never")},
            checkpointer=saver,
            **kwargs,
        )
        config = {"configurable": {"thread_id": "long"}}
        for turn in range(1, turns + 1):
            started = time.perf_counter()
            graph.invoke({"messages": [("user", f"where is order {turn}?")]}, config, durability="sync")
            times.append(time.perf_counter() - started)
            if turn % every == 0:
                sizes.append(stored_bytes(path).blob_bytes)
    return times, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--every", type=int, default=50)
    args = parser.parse_args()
    # Two passes, the second in reverse order, each list's better median kept: a slow minute on a shared machine
    # then weighs on no list alone.
    names = list(lists())
    medians: dict[str, float] = {}
    stored: dict[str, int] = {}
    summaries: dict[str, int] = {}
    for order in (names, names[::-1]):
        for name in order:
            times, sizes = measure(lists()[name], args.turns, args.every)
            median = statistics.median(times[-args.every :])
            medians[name] = min(median, medians.get(name, median))
            stored[name] = sizes[-1]
            summaries[name] = len(SUMMARIZED)
    base_time, base_bytes = medians["none"], stored["none"]
    print(f"{args.turns} requests, one read each; median of the last {args.every}; stored: checkpoint and write blobs")
    print(f"{'middleware':<18} {'ms/request':>10} {'ratio':>6} {'stored MB':>10} {'ratio':>6} {'summaries':>9}")
    for name in names:
        median, size = medians[name], stored[name]
        ratios = f"{median / base_time:>6.2f} {size / 1e6:>10.2f} {size / base_bytes:>6.2f}"
        print(f"{name:<18} {median * 1000:>10.1f} {ratios} {summaries[name]:>9}")


if __name__ == "__main__":
    main()
