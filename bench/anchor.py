"""The two systems under test, opened the same way: gatedloop, and the anchor it is measured against.

The anchor is what LangChain v1 offers for the same job: `create_agent(model, tools,
middleware=[HumanInTheLoopMiddleware(interrupt_on={...})], checkpointer=SqliteSaver(conn))`, with the same
scripted model and tools. Its connection gets the pragmas gatedloop's `open_sqlite` sets (WAL,
synchronous=NORMAL, busy timeout) so the comparison is about orchestration and storage layout, not fsyncs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from bench.scenarios import GATED, POLICIES, TOOLS, System, connect, scripted_model
from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph import Limits, build_graph

# Per-request budgets are reset by each user message; these only make room for the 8-read turn.
LIMITS = Limits(max_model_calls=12, max_tool_calls=40, max_calls_per_turn=16)


def gatedloop_graph(saver: Any) -> Any:
    return build_graph(scripted_model(), TOOLS, policies=POLICIES, limits=LIMITS, checkpointer=saver)


def anchor_graph(saver: Any) -> Any:
    hitl = HumanInTheLoopMiddleware(interrupt_on={name: True for name in GATED})
    return create_agent(scripted_model(), TOOLS, middleware=[hitl], checkpointer=saver)


@contextmanager
def open_system(system: System, path: str | Path) -> Iterator[Any]:
    """A compiled graph of `system` checkpointing to `path`, closed on exit."""
    if system == "gatedloop":
        with open_sqlite(path) as saver:
            yield gatedloop_graph(saver)
        return
    conn = connect(path)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        yield anchor_graph(saver)
    finally:
        conn.close()


@asynccontextmanager
async def open_async_system(system: System, path: str | Path) -> AsyncIterator[Any]:
    if system == "gatedloop":
        async with open_async_sqlite(path) as saver:
            yield gatedloop_graph(saver)
        return
    async with aiosqlite.connect(str(path), timeout=10.0) as conn:
        await conn.execute("PRAGMA busy_timeout=10000")
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield anchor_graph(saver)
