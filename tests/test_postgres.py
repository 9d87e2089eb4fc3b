"""What only Postgres has, against a real server: the CI guard on the server, processes setting up a fresh
database at once, and the async saver.

What both backends do (ledger semantics, claims raced by processes, crash and resume by a new process,
concurrent resumes and the lease) is tested once for both, with the `backend` fixture: test_ledger_backends.py,
test_concurrent_resume.py, test_crash.py. The server comes from `GATEDLOOP_TEST_PG_URL`; see `pg_server`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pg_server
import pytest
from crash_child import Child, assert_completed_once
from pg_server import PostgresUnavailable, find_postgres, new_thread_id, require_postgres, url_in_schema
from sample_app import Effects, build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pg_url() -> str:
    return require_postgres()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    return {"effects": str(tmp_path / "effects.sqlite"), "barrier": str(barrier), "tmp": str(tmp_path)}


# ------------------------------------------------------------------------------- the CI guard on the server


def test_missing_server_skips_on_a_developer_machine_and_fails_in_ci():
    with pytest.raises(PostgresUnavailable):
        find_postgres({})
    with pytest.raises(pytest.skip.Exception):
        require_postgres({})
    with pytest.raises(pytest.fail.Exception, match="CI=true but no Postgres"):
        require_postgres({"CI": "true"})


# ------------------------------------------------------------------------- setting up a fresh database


def test_processes_opening_a_fresh_database_at_once_all_succeed(pg_url: str, files: dict[str, str]):
    """LangGraph's own `setup()` fails when two processes run it on a fresh database at once (duplicate
    pg_type / checkpoint_migrations rows); `open_postgres` takes turns, without a deadlock against the
    migrations' `CREATE INDEX CONCURRENTLY`."""
    import psycopg
    from psycopg import sql

    name = f"gl_fresh_{new_thread_id('db').split('-', 1)[1]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        try:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test role may not create databases")
    try:
        cmd = [sys.executable, str(Path(pg_server.__file__)), "open", "--database", name, "--barrier", files["barrier"]]
        children = [Child(cmd, Path(files["tmp"], f"open{i}.stderr")) for i in range(4)]
        for child in children:
            assert child.wait_for("ready") is not None, child.wait().stderr[-2000:]
        Path(files["barrier"], "go").touch()
        results = [child.wait() for child in children]
        assert [r.last() for r in results] == ["opened"] * 4, [r.stderr[-1500:] for r in results]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_an_old_outbox_is_upgraded_in_its_own_schema_whatever_another_schema_holds(pg_url: str):
    """The kind CHECK is read on the search path's outbox: read by name alone, a newer outbox in another schema
    (here made first, so its row comes first) hid this one's old CHECK and left it refusing `decided` notices;
    and a schema dropped meanwhile by another process failed setup ("could not open relation with OID")."""
    import psycopg

    from gatedloop.checkpoints.ledger import postgres_statements
    from gatedloop.checkpoints.outbox import OUTBOX_TABLE
    from gatedloop.checkpoints.postgres import prepare_database

    suffix = new_thread_id("schema").split("-", 1)[1]
    new_schema, old_schema = f"outbox_new_{suffix}", f"outbox_old_{suffix}"

    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {new_schema}")
        admin.execute(f"CREATE SCHEMA {old_schema}")
    try:
        prepare_database(url_in_schema(pg_url, new_schema), checkpoints=False)
        old_check = "CHECK (kind IN ('request', 'expiring', 'unknown', 'reminder', 'escalated'))"
        with psycopg.connect(url_in_schema(pg_url, old_schema), autocommit=True) as conn:
            for statement in postgres_statements(OUTBOX_TABLE.format(check=old_check)):
                conn.execute(statement)
        prepare_database(url_in_schema(pg_url, old_schema), checkpoints=False)
        with psycopg.connect(url_in_schema(pg_url, old_schema), autocommit=True) as conn:
            conn.execute(
                "INSERT INTO gatedloop_outbox (id, kind, thread_id, request_id, payload, created_at)"
                " VALUES ('n1', 'decided', 't', 'r', '{}', 0)"
            )
            assert conn.execute("SELECT kind FROM gatedloop_outbox").fetchall() == [("decided",)]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {new_schema} CASCADE")
            admin.execute(f"DROP SCHEMA {old_schema} CASCADE")


# ------------------------------------------------------------------------------ deployments side by side


def test_two_deployments_in_schemas_of_one_database_run_the_same_thread_id_at_once(pg_url: str):
    """Advisory locks are per database: keyed by thread id alone, a deployment's thread "t1" looked busy while
    another schema's "t1" ran (eight racing processes of one test failed with ThreadBusy because another test,
    in a schema of its own, ran threads of the same names). Within one schema the lease still excludes."""
    import psycopg

    from gatedloop.checkpoints.lease import ThreadBusy
    from gatedloop.checkpoints.postgres import hold_lease

    suffix = new_thread_id("schema").split("-", 1)[1]
    schemas = [f"lease_a_{suffix}", f"lease_b_{suffix}"]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        for schema in schemas:
            admin.execute(f"CREATE SCHEMA {schema}")
    try:
        first, second = (url_in_schema(pg_url, schema) for schema in schemas)
        with hold_lease(first, "t1"), hold_lease(second, "t1"):
            with pytest.raises(ThreadBusy), hold_lease(first, "t1"):
                pass
            with pytest.raises(ThreadBusy), hold_lease(second, "t1"):
                pass
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            for schema in schemas:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


# ---------------------------------------------------------------------------------------- the async twin


def test_async_twin_pauses_and_resumes(pg_url: str, files: dict[str, str]):
    from langgraph.types import Command

    from gatedloop.checkpoints.postgres import open_async_postgres, open_postgres

    thread_id = new_thread_id("async")
    config = {"configurable": {"thread_id": thread_id}}

    async def scenario() -> dict[str, Any]:
        async with open_async_postgres(pg_url) as async_saver:
            graph = build(async_saver, Effects(files["effects"]))
            out = await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config, durability="sync")
            assert out["__interrupt__"][0].value["action_requests"][0]["args"] == {"item": "seat", "quantity": 1}
            return await graph.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config)

    out = asyncio.run(scenario())
    assert out["status"] == "completed"
    with open_postgres(pg_url) as sync_saver:  # the sync saver reads what the async one wrote
        assert build(sync_saver, Effects(files["effects"])).get_state(config).values["status"] == "completed"
    assert_completed_once(pg_url, files["effects"], thread_id, ["c1_0"])
