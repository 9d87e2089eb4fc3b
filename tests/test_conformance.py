"""LangGraph's checkpointer conformance suite against gatedloop's four savers: every capability, none skipped.

`langgraph-checkpoint-conformance` registers a saver factory (`@checkpointer_test`) and runs each capability's
tests through the async methods. The sync savers run behind `async_adapter.as_async`, which only exposes what
they implement, so a missing sync method shows up here as a skipped capability and fails the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from async_adapter import as_async
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from pg_server import require_postgres

from gatedloop.checkpoints import open_async_sqlite, open_sqlite

CAPABILITIES = sorted(c.value for c in ALL_CAPABILITIES)


def sqlite_sync(folder: Path) -> Callable[[], AsyncIterator[Any]]:
    async def factory() -> AsyncIterator[Any]:
        with open_sqlite(folder / "sync.sqlite") as saver:
            yield as_async(saver)

    return factory


def sqlite_async(folder: Path) -> Callable[[], AsyncIterator[Any]]:
    async def factory() -> AsyncIterator[Any]:
        async with open_async_sqlite(folder / "async.sqlite") as saver:
            yield saver

    return factory


def postgres_sync(url: str) -> Callable[[], AsyncIterator[Any]]:
    from gatedloop.checkpoints.postgres import open_postgres

    async def factory() -> AsyncIterator[Any]:
        with open_postgres(url) as saver:
            yield as_async(saver)

    return factory


def postgres_async(url: str) -> Callable[[], AsyncIterator[Any]]:
    from gatedloop.checkpoints.postgres import open_async_postgres

    async def factory() -> AsyncIterator[Any]:
        async with open_async_postgres(url) as saver:
            yield saver

    return factory


SAVERS = ["GatedSqliteSaver", "GatedAsyncSqliteSaver", "GatedPostgresSaver", "GatedAsyncPostgresSaver"]


@pytest.mark.parametrize("name", SAVERS)
def test_every_capability_passes_and_none_is_skipped(name: str, tmp_path: Path) -> None:
    if "Postgres" in name:
        url = require_postgres()
        factory = postgres_sync(url) if name == "GatedPostgresSaver" else postgres_async(url)
    else:
        factory = sqlite_sync(tmp_path) if name == "GatedSqliteSaver" else sqlite_async(tmp_path)
    registered = checkpointer_test(name=name)(factory)

    report = asyncio.run(validate(registered))

    summary = {cap: (r.detected, r.passed, r.tests_failed, r.tests_skipped) for cap, r in report.results.items()}
    assert sorted(report.results) == CAPABILITIES
    failures = [f for r in report.results.values() for f in r.failures]
    assert not failures, failures
    assert all(r.detected and r.passed and r.tests_skipped == 0 for r in report.results.values()), summary
    assert sum(r.tests_passed for r in report.results.values()) >= 81
