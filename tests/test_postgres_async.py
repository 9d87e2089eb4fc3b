"""The ledger under `ainvoke` on Postgres (issue 52): each statement awaited on the event loop, on the async
checkpointer's own pool, both as Aegra serves a graph (LangGraph's `AsyncPostgresSaver` on a pool, the ledger found
by `ledger_for`) and under `open_async_postgres`; none of the gate's ledger work is handed to a thread.

Against a real server (`GATEDLOOP_TEST_PG_URL`), each test in a schema of its own (`backends.isolated`). The crash
trials of this path are in test_crash.py (`..._through_the_async_api_on_the_loop_...`, the `postgres` backend).
"""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from backends import Backend, isolated
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command
from pg_server import require_postgres
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from sample_app import Effects, build

from gatedloop.checkpoints.chain import CHAIN_LOCK_KEY
from gatedloop.checkpoints.postgres import PostgresLedger, open_async_postgres
from gatedloop.graph.thread_graph import GraphMismatch

pytestmark = pytest.mark.slow
APPROVE = Command(resume={"decisions": [{"type": "approve"}]})


@pytest.fixture
def url() -> Iterator[str]:
    with isolated(Backend("postgres", require_postgres())) as backend:
        yield backend.db


@asynccontextmanager
async def aegra_shaped_saver(url: str) -> AsyncIterator[AsyncPostgresSaver]:
    """LangGraph's own async saver on a pool, configured as Aegra 0.11 configures its own (core/database.py)."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url,
        kwargs={"autocommit": True, "prepare_threshold": None, "row_factory": dict_row},
        check=AsyncConnectionPool.check_connection,
        max_size=10,
        open=False,
    )
    async with pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver


@asynccontextmanager
async def loop_ticks() -> AsyncIterator[list[float]]:
    """A tick every 10 ms of the event loop while the block runs: about 100 a second on a free loop, almost none on
    a loop something blocks."""
    ticks: list[float] = []

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.append(time.monotonic())

    ticking = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        ticking.cancel()


SAVERS: dict[str, Callable[[str], AbstractAsyncContextManager[Any]]] = {
    "aegra_shaped": aegra_shaped_saver,
    "open_async_postgres": open_async_postgres,
}


@pytest.fixture
def ledger_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """For each of the ledger's reads, writes and transactions: the thread that made it, and whether it was made by
    a write's own run (`running.run_write`: its claim and outcome, around the tool, on the tool's thread)."""
    calls: list[tuple[int, bool]] = []
    for method in ("_run", "_write_plain", "_transaction"):
        original = getattr(PostgresLedger, method)

        def recorded(self: PostgresLedger, *args: Any, _original: Any = original) -> Any:
            in_write = any(frame.name == "run_write" for frame in traceback.extract_stack())
            calls.append((threading.get_ident(), in_write))
            return _original(self, *args)

        monkeypatch.setattr(PostgresLedger, method, recorded)
    return calls


@pytest.mark.parametrize("opened", SAVERS)
def test_under_ainvoke_the_gates_ledger_work_is_awaited_on_the_loop(
    url: str, tmp_path: Path, ledger_calls: list[tuple[int, bool]], opened: str
):
    """Every ledger statement of the gate's nodes is made on the loop; only the approved write's own claim and
    outcome go with the tool to its thread (the tool is user code that may block)."""
    effects = Effects(tmp_path / "effects.sqlite")
    config = {"configurable": {"thread_id": "awaited"}}

    async def scenario() -> tuple[int, dict[str, Any]]:
        async with SAVERS[opened](url) as saver:
            graph = build(saver, effects)
            paused = await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config)
            assert paused["__interrupt__"][0].value["action_requests"][0]["name"] == "book"
            return threading.get_ident(), await graph.ainvoke(APPROVE, config)

    loop_thread, out = asyncio.run(scenario())
    assert out["status"] == "completed"
    assert len(effects.rows("book")) == 1
    on_loop = [in_write for thread, in_write in ledger_calls if thread == loop_thread]
    elsewhere = [in_write for thread, in_write in ledger_calls if thread != loop_thread]
    assert len(on_loop) > 10  # proposals, validation, the approval, answers, notices; before: none of them
    assert elsewhere and all(elsewhere)  # the write's claim and outcome only


def test_thirty_threads_at_once_on_the_served_saver_each_pay_once_and_the_chain_holds(url: str, tmp_path: Path):
    """Runs whose transactions interleave on one loop, each waiting its turn for the chain's advisory lock by
    awaiting it: every approved write runs once and the evidence chain verifies."""
    effects = Effects(tmp_path / "effects.sqlite")
    threads = 30

    async def one(graph: Any, n: int) -> str:
        config = {"configurable": {"thread_id": f"many-{n}"}}
        await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config)
        return str((await graph.ainvoke(APPROVE, config))["status"])

    async def scenario() -> list[str]:
        async with aegra_shaped_saver(url) as saver:
            graph = build(saver, effects)
            return list(await asyncio.gather(*(one(graph, n) for n in range(threads))))

    assert asyncio.run(scenario()) == ["completed"] * threads
    keys = [key for _, _, key in effects.rows("book")]
    assert len(keys) == len(set(keys)) == threads
    ledger = PostgresLedger(url, setup=False)
    try:
        report = ledger.verify_chain()
    finally:
        ledger.close()
    assert report.ok, report.problems
    assert report.entries > threads * 5


def test_a_run_waiting_for_the_chain_lock_leaves_the_loop_free(url: str, tmp_path: Path):
    """Another session holds the evidence chain's lock for a second: the run's write waits for it by awaiting, so
    the loop serves others meanwhile (a ticker keeps ticking), and the run finishes once the lock is let go."""
    effects = Effects(tmp_path / "effects.sqlite")
    hold_s = 1.0

    async def scenario() -> tuple[int, float, bool]:
        async with aegra_shaped_saver(url) as saver:
            graph = build(saver, effects)
            async with loop_ticks() as ticks:
                with psycopg.connect(url, autocommit=True) as holder:
                    holder.execute("SELECT pg_advisory_lock(%s)", (CHAIN_LOCK_KEY,))
                    released = asyncio.get_running_loop().call_later(
                        hold_s, lambda: holder.execute("SELECT pg_advisory_unlock(%s)", (CHAIN_LOCK_KEY,))
                    )
                    started = time.monotonic()
                    out = await graph.ainvoke(
                        {"messages": [("user", "book 1 seat")]}, {"configurable": {"thread_id": "t"}}
                    )
                    took = time.monotonic() - started
                    released.cancel()
            return len(ticks), took, "__interrupt__" in out

    ticks, took, paused = asyncio.run(scenario())
    assert paused  # asking for the approval
    assert took >= hold_s * 0.9  # it did wait for the lock
    assert ticks >= 40  # 100 would be a free loop; a loop blocked for the second gets almost none


def test_a_refusal_raised_inside_awaited_ledger_work_reaches_the_caller_and_nothing_runs(url: str, tmp_path: Path):
    """An error raised by the gate while its ledger work runs on the loop (here the thread's graph check: the same
    graph redeployed with `book` no longer asking anyone) comes out of `ainvoke` as itself, nothing is paid, and
    the thread still waits for the approval its own graph asks for."""
    effects = Effects(tmp_path / "effects.sqlite")
    config = {"configurable": {"thread_id": "weakened"}}

    async def scenario() -> tuple[BaseException | None, bool]:
        async with aegra_shaped_saver(url) as saver:
            await build(saver, effects).ainvoke({"messages": [("user", "book 1 seat")]}, config)
            weakened = build(saver, effects, approval="never")
            try:
                await weakened.ainvoke(APPROVE, config)
            except GraphMismatch as exc:
                refused: BaseException | None = exc
            else:
                refused = None
            state = await build(saver, effects).aget_state(config)
            return refused, bool(state.interrupts)

    refused, still_waiting = asyncio.run(scenario())
    assert isinstance(refused, GraphMismatch) and "book" in str(refused)
    assert still_waiting
    assert effects.rows("book") == []


def test_a_blocking_validator_runs_off_the_loop_while_the_gates_work_is_on_it(url: str, tmp_path: Path):
    """A policy's own function may block (this validator sleeps half a second, as a query to a slow system would):
    on the loop's path it runs on a worker thread, awaited, so the loop keeps serving others meanwhile."""
    effects = Effects(tmp_path / "effects.sqlite")
    ran_on: list[int] = []

    def slow_validator(args: dict[str, Any], context: Any) -> None:
        ran_on.append(threading.get_ident())
        time.sleep(0.5)

    async def scenario() -> tuple[int, int, bool]:
        async with aegra_shaped_saver(url) as saver:
            graph = build(saver, effects, validator=slow_validator)
            async with loop_ticks() as ticks:
                out = await graph.ainvoke({"messages": [("user", "book 1 seat")]}, {"configurable": {"thread_id": "v"}})
            return threading.get_ident(), len(ticks), "__interrupt__" in out

    loop_thread, ticks, paused = asyncio.run(scenario())
    assert paused
    assert ran_on and loop_thread not in ran_on  # before: on the loop, which stood still for each half second
    assert ticks >= 30


def test_without_greenback_the_ledger_work_goes_to_threads_as_before_and_says_so(
    url: str,
    tmp_path: Path,
    ledger_calls: list[tuple[int, bool]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """A Postgres driver installed by hand, without the `postgres` extra (so without greenback): the async path
    works as it did before this change, every ledger use on a worker thread, and a warning says why."""
    import gatedloop.checkpoints.postgres as postgres

    monkeypatch.setattr(postgres, "greenback", None)
    effects = Effects(tmp_path / "effects.sqlite")
    config = {"configurable": {"thread_id": "threads"}}

    async def scenario() -> tuple[int, dict[str, Any]]:
        async with aegra_shaped_saver(url) as saver:
            graph = build(saver, effects)
            await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config)
            return threading.get_ident(), await graph.ainvoke(APPROVE, config)

    with caplog.at_level("WARNING", logger="gatedloop.postgres"):
        loop_thread, out = asyncio.run(scenario())
    assert out["status"] == "completed"
    assert len(effects.rows("book")) == 1
    assert ledger_calls and all(thread != loop_thread for thread, _ in ledger_calls)
    assert "greenback is not installed" in caplog.text
