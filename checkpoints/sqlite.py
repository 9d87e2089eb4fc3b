"""Opening the SQLite checkpointer the way a multi-process deployment needs it.

WAL so readers never block the writer, a busy timeout so a second process waits instead of failing with
"database is locked", and the execution ledger in the same file, reachable as `saver.ledger`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import aiosqlite
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from gatedloop.checkpoints.exact import ExactResumeWrites
from gatedloop.checkpoints.history_memo import MemoizedHistoryAsync, MemoizedHistorySync
from gatedloop.checkpoints.ledger import BUSY_TIMEOUT_MS, SqliteLedger


class GatedSqliteSaver(ExactResumeWrites, MemoizedHistorySync, SqliteSaver):
    """LangGraph's `SqliteSaver`, plus the ledger that lives beside the checkpoints, a thread's history read
    from disk once per process (`history_memo`), and resume values stored exactly or refused (`ExactResumeWrites`)."""

    ledger: SqliteLedger
    path: str


class GatedAsyncSqliteSaver(ExactResumeWrites, MemoizedHistoryAsync, AsyncSqliteSaver):
    """LangGraph's `AsyncSqliteSaver`, plus the ledger that lives beside the checkpoints, a thread's history read
    from disk once per process (`history_memo`), and resume values stored exactly or refused (`ExactResumeWrites`)."""

    ledger: SqliteLedger
    path: str


def _prepare(path: str | Path) -> str:
    target = str(path)
    if target != ":memory:":
        Path(target).expanduser().parent.mkdir(parents=True, exist_ok=True)
    return target


@contextmanager
def open_sqlite(path: str | Path, *, recreate_ledger: bool = False) -> Iterator[GatedSqliteSaver]:
    """A synchronous SQLite checkpointer on `path` (created if missing), with its ledger.

    A file with checkpoints but no ledger table raises `LedgerError` unless `recreate_ledger=True`."""
    target = _prepare(path)
    conn = sqlite3.connect(target, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    ledger = None
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        saver = GatedSqliteSaver(conn)
        saver.setup()
        ledger = SqliteLedger(target, recreate=recreate_ledger)
        saver.ledger, saver.path = ledger, target
        yield saver
    finally:
        if ledger is not None:
            ledger.close()
        conn.close()


def _connect_readonly(target: str) -> sqlite3.Connection:
    """`mode=ro`; on a read-only folder (SQLite cannot make the WAL index beside the file) `immutable=1`."""
    uri = Path(target).expanduser().resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn


@contextmanager
def open_sqlite_readonly(path: str | Path) -> Iterator[GatedSqliteSaver]:
    """An existing checkpoint file opened for reading only (listing and showing threads), so a read-only copy
    or mount can be inspected; nothing is created or written. Raises `sqlite3.OperationalError` if it cannot
    be read."""
    target = str(path)
    if not Path(target).expanduser().is_file():
        raise sqlite3.OperationalError(f"no database file at {target}")
    conn = _connect_readonly(target)
    try:
        saver = GatedSqliteSaver(conn)
        saver.is_setup = True
        saver.ledger, saver.path = SqliteLedger(target, connection=conn), target
        yield saver
    finally:
        conn.close()


@asynccontextmanager
async def open_async_sqlite(path: str | Path, *, recreate_ledger: bool = False) -> AsyncIterator[GatedAsyncSqliteSaver]:
    """The async twin of `open_sqlite`, for `ainvoke`/`astream` and many concurrent threads."""
    target = _prepare(path)
    async with aiosqlite.connect(target, timeout=BUSY_TIMEOUT_MS / 1000) as conn:
        await conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        saver = GatedAsyncSqliteSaver(conn)
        await saver.setup()
        ledger = SqliteLedger(target, recreate=recreate_ledger)
        saver.ledger, saver.path = ledger, target
        try:
            yield saver
        finally:
            ledger.close()
