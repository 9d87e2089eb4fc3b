"""The async path (`ainvoke` on `open_async_sqlite`): many threads at once on a small executor, no deadlock."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from invariants import assert_each_call_answered_once
from langgraph.types import Command
from sample_app import Effects, build

from gatedloop.checkpoints import open_async_sqlite

HANG_GUARD_S = 120  # only a guard against a deadlock hanging CI; nothing here is a speed assertion


def test_many_concurrent_resumes_on_a_two_worker_executor_all_complete(tmp_path: Path):
    async def main() -> list[dict]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(tmp_path / "runs.sqlite") as saver:
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


def test_an_unknown_outcome_pauses_and_resumes_on_the_async_path(tmp_path: Path):
    async def main() -> tuple[dict, dict]:
        effects = Effects(tmp_path / "effects.sqlite")
        async with open_async_sqlite(tmp_path / "runs.sqlite") as saver:
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
