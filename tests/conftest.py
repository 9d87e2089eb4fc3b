"""Shared fixtures. Tests import what they share (helpers, app builders, child processes) from tests/support/, put on
sys.path here (run with --import-mode=importlib)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SUPPORT = Path(__file__).parent / "support"  # what the tests share: fixtures' helpers, app builders, child processes
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "runs.sqlite")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Each backend in turn (see `backends`): a SQLite file of this test's own, then the Postgres test server
    (skipped without one on a developer's machine, failed under CI)."""
    from backends import Backend
    from pg_server import require_postgres

    if request.param == "postgres":
        return Backend("postgres", require_postgres())
    return Backend("sqlite", str(tmp_path / "runs.sqlite"))


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """support/auth_app.py under the real `langgraph dev` with gatedloop's auth (support/auth_server.py); one
    server per test module."""
    from auth_server import serve_auth_app

    with serve_auth_app(tmp_path_factory.mktemp("auth")) as running:
        yield running
