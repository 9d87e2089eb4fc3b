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
from typing import Any, Literal

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
    with _anchor_on(SqliteSaver, path) as graph:
        yield graph


@contextmanager
def _anchor_on(saver_type: type[SqliteSaver], path: str | Path) -> Iterator[Any]:
    """The anchor's graph on a `saver_type` over `connect(path)`, closed on exit."""
    conn = connect(path)
    try:
        saver = saver_type(conn)
        saver.setup()
        yield anchor_graph(saver)
    finally:
        conn.close()


class OnLoopSqliteSaver(SqliteSaver):
    """LangGraph's `SqliteSaver` answering the async calls in place, on the loop: the anchor on the kind of driver
    gatedloop's `open_async_sqlite` uses by default, to tell what the driver alone buys (`--driver on-loop`)."""

    async def aget_tuple(self, config: Any) -> Any:
        return self.get_tuple(config)

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def aget_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
        return self.get_delta_channel_history(config=config, channels=channels)


Driver = Literal["default", "on-loop", "aiosqlite"]
"""How a system's async saver reaches SQLite: its default (gatedloop: on the loop; the anchor: LangGraph's
`AsyncSqliteSaver`, aiosqlite), or either one forced."""


@asynccontextmanager
async def open_async_system(system: System, path: str | Path, driver: Driver = "default") -> AsyncIterator[Any]:
    if system == "gatedloop":
        async with open_async_sqlite(path, on_loop=driver != "aiosqlite") as saver:
            yield gatedloop_graph(saver)
        return
    if driver == "on-loop":
        with _anchor_on(OnLoopSqliteSaver, path) as graph:
            yield graph
        return
    async with aiosqlite.connect(str(path), timeout=10.0) as conn:
        await conn.execute("PRAGMA busy_timeout=10000")
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        yield anchor_graph(saver)
