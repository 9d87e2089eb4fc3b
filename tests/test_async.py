"""The async path (`ainvoke` on `open_async_sqlite`, on the loop and through aiosqlite): many threads at once on a
small executor, no deadlock; on the loop, the gate hands nothing to a thread but a tool, and waits out another
process's write lock."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langgraph.types import Command
from sample_app import Effects, build

from gatedloop.checkpoints import open_async_sqlite

HANG_GUARD_S = 120  # only a guard against a deadlock hanging CI; nothing here is a speed assertion
BOTH_DRIVERS = pytest.mark.parametrize("on_loop", [True, False], ids=["on_loop", "aiosqlite"])


@BOTH_DRIVERS
def test_many_concurrent_resumes_on_a_two_worker_executor_all_complete(tmp_path: Path, on_loop: bool):
    async def main() -> list[dict]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(tmp_path / "runs.sqlite", on_loop=on_loop) as saver:
            graph = build(saver, effects)
            configs = [{"configurable": {"thread_id": f"a{i}"}} for i in range(8)]
            for config in configs:
                await graph.ainvoke({"messages": [("user", "book 1 seat, 2 desk")]}, config)
            approve = Command(resume={"decisions": [{"type": "approve"}] * 2})
            return await asyncio.wait_for(
                asyncio.gather(*(graph.ainvoke(approve, config) for config in configs)), HANG_GUARD_S
            )

    outs = asyncio.run(main())
    assert [out["status"] for out in outs] == ["completed"] * 8
    for out in outs:
        assert_each_call_answered_once(out["messages"])
    effects = Effects(tmp_path / "effects.sqlite")
    assert len(effects.rows()) == 16 and len({key for _, _, key in effects.rows()}) == 16


@BOTH_DRIVERS
def test_an_unknown_outcome_pauses_and_resumes_on_the_async_path(tmp_path: Path, on_loop: bool):
    async def main() -> tuple[dict, dict]:
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(tmp_path / "runs.sqlite", on_loop=on_loop) as saver:
            graph = build(saver, effects, write_delay_s=0.5, timeout_s=0.1, reconcile=None)
            config = {"configurable": {"thread_id": "u1"}}
            await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config)
            paused = await graph.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
            await asyncio.sleep(1.0)  # let the timed-out write land, so `not_done` is refused and `done` is true
            done = {"decisions": [{"type": "done", "result": {"booking": 1}}], "reviewer": "ops"}
            return paused, await graph.ainvoke(Command(resume=done), config)

    paused, out = asyncio.run(main())
    assert paused["__interrupt__"][0].value["kind"] == "unknown_outcome"
    assert out["status"] == "completed"
    assert len(Effects(tmp_path / "effects.sqlite").rows()) == 1


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to it (`run_in_executor`, `asyncio.to_thread`) but the
    scripted model's replies: LangChain hands a chat model without `_agenerate` to a thread, a real client's
    request is awaited on the loop."""

    handed = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if not any(frame.name == "_agenerate" for frame in traceback.extract_stack()):
            self.handed += 1
        return super().submit(fn, *args, **kwargs)


@BOTH_DRIVERS
def test_on_the_loop_an_approval_turn_hands_only_its_writes_to_a_thread(tmp_path: Path, on_loop: bool):
    """On `open_async_sqlite`'s default the gate's nodes and the checkpoints run on the loop: of a turn that asks,
    is approved and books two writes, only the two tools' runs leave it. Through aiosqlite, the nodes' ledger work
    is handed over at each step."""

    async def main() -> tuple[dict, int]:
        executor = CountingExecutor(max_workers=4)
        asyncio.get_running_loop().set_default_executor(executor)
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(tmp_path / "runs.sqlite", on_loop=on_loop) as saver:
            graph = build(saver, effects)
            config = {"configurable": {"thread_id": "t1"}}
            await graph.ainvoke({"messages": [("user", "book 1 seat, 2 desk")]}, config)
            out = await graph.ainvoke(Command(resume={"decisions": [{"type": "approve"}] * 2}), config)
            return out, executor.handed

    out, handed = asyncio.run(main())
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])
    assert len(Effects(tmp_path / "effects.sqlite").rows()) == 2
    if on_loop:
        assert handed == 2
    else:
        assert handed > 10


HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def test_on_the_loop_a_turn_waits_out_another_process_holding_the_write_lock(tmp_path: Path):
    """The cost of running SQLite on the loop: while another process holds the file's write lock the loop waits,
    and the turn then goes on, each call answered once and each write done once (no "database is locked")."""
    db = tmp_path / "runs.sqlite"

    async def main() -> tuple[dict, float]:
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(db) as saver:
            graph = build(saver, effects)
            config = {"configurable": {"thread_id": "t1"}}
            await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config)
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db), "1.0"], stdout=subprocess.PIPE)
            try:
                assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
                started = time.monotonic()
                out = await graph.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
                waited = time.monotonic() - started
            finally:
                assert holder.wait(timeout=30) == 0
            return out, waited

    out, waited = asyncio.run(main())
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])
    assert len(Effects(tmp_path / "effects.sqlite").rows()) == 1
    assert waited >= 0.5  # it did meet the held lock: the turn could not write before the holder let go
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
