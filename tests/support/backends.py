"""The two storage backends the backend tests run on: a SQLite file of the test's own, or the Postgres server of
`pg_server` (as LangGraph's own checkpointer tests run one body per saver).

`backend` (the fixture in conftest.py) gives a `Backend` per parameter; the Postgres one is skipped on a
developer's machine without a server and fails under CI (see `pg_server.require_postgres`). On Postgres every
test shares one database, so tests name their threads with `pg_server.new_thread_id`.

Run as a script (`python tests/support/backends.py claim --db ... --thread ...`, tests/ on PYTHONPATH) it races ledger
claims: it waits at a barrier, then claims (or reclaims) calls c0..c{n-1}, printing `won <call>` for each one
this process got.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crash_child import child_command
from pg_server import URL_ENV, url_in_schema

from gatedloop.checkpoints.contract import POSTGRES_PREFIXES

SUPPORT = Path(__file__).resolve().parent


def resolve_db(db: str) -> str:
    """`env` is the Postgres URL from `GATEDLOOP_TEST_PG_URL` (so a child's command line shows no password)."""
    return os.environ[URL_ENV] if db == "env" else db


def open_checkpointer(db: str) -> AbstractContextManager[Any]:
    """`open_postgres` for a Postgres URL (or `env`), else `open_sqlite`: the saver with its ledger and lease."""
    target = resolve_db(db)
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import open_postgres

        return open_postgres(target)
    from gatedloop.checkpoints import open_sqlite

    return open_sqlite(target)


def open_async_checkpointer(db: str) -> AbstractAsyncContextManager[Any]:
    """The async twin of `open_checkpointer`: `open_async_postgres` (the ledger's statements awaited on the loop),
    else `open_async_sqlite`'s default (SQLite on the loop)."""
    target = resolve_db(db)
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import open_async_postgres

        return open_async_postgres(target)
    from gatedloop.checkpoints import open_async_sqlite

    return open_async_sqlite(target)


def open_ledger(db: str) -> Any:
    """The ledger alone (tables created if missing), as a process that only claims would open it."""
    target = resolve_db(db)
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import PostgresLedger

        return PostgresLedger(target)
    from gatedloop.checkpoints.ledger import SqliteLedger

    return SqliteLedger(target)


@dataclass(frozen=True)
class Backend:
    name: str
    db: str
    """A SQLite file, or the Postgres URL."""

    @property
    def child_db(self) -> str:
        """What a child process is given as `--db`."""
        return "env" if self.name == "postgres" else self.db

    def open(self) -> AbstractContextManager[Any]:
        return open_checkpointer(self.db)

    def child_command(self, effects: str, thread: str, *extra: str) -> list[str]:
        """`crash_child.py` driving `thread` on this backend."""
        return child_command(self.child_db, effects, thread, *extra)

    def ledger(self) -> Any:
        return open_ledger(self.db)


@contextmanager
def isolated(backend: Backend) -> Iterator[Backend]:
    """The backend with a ledger of its own, for tests that read the whole ledger (the evidence chain, reviewer
    telemetry): SQLite's file is the test's; on Postgres a fresh schema, dropped afterwards."""
    if backend.name != "postgres":
        yield backend
        return
    import psycopg

    schema = f"chain_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(backend.db, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = url_in_schema(backend.db, schema)
    assert url.startswith(("postgresql://", "postgres://"))
    try:
        yield Backend("postgres", url)
    finally:
        with psycopg.connect(backend.db, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def claim_command(db: str, thread: str, calls: int, barrier: str, *extra: str) -> list[str]:
    script = str(SUPPORT / "backends.py")
    return [
        sys.executable,
        script,
        "claim",
        "--db",
        db,
        "--thread",
        thread,
        "--calls",
        str(calls),
        "--barrier",
        barrier,
        *extra,
    ]


def claim_main(argv: list[str]) -> int:
    import crash_child

    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--barrier", required=True)
    parser.add_argument("--reclaim", type=int, default=None)
    args = parser.parse_args(argv)
    ledger = open_ledger(args.db)
    try:
        crash_child.mark("ready", os.getpid())
        Path(args.barrier, f"ready.{os.getpid()}").touch()
        while not os.path.exists(os.path.join(args.barrier, "go")):
            time.sleep(0.005)
        for index in range(args.calls):
            call_id = f"c{index}"
            if args.reclaim is None:
                won, _ = ledger.claim(args.thread, call_id, "book", "digest")
            else:
                won = ledger.reclaim(args.thread, call_id, args.reclaim)
            if won:
                crash_child.mark("won", call_id)
        crash_child.mark("finished")
    finally:
        ledger.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["claim"]:
        sys.exit("usage: backends.py claim --db DB --thread T --calls N --barrier DIR [--reclaim N]")
    sys.exit(claim_main(sys.argv[2:]))
