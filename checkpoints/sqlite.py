"""Opening the SQLite checkpointer the way a multi-process deployment needs it.

WAL so readers never block the writer, a busy timeout so a second process waits instead of failing with
"database is locked", and the execution ledger in the same file, reachable as `saver.ledger`. The savers add
what LangGraph Server uses beyond LangGraph's SQLite savers: `delete_for_runs` (rollback), `copy_thread`
(which copies the ledger rows too) and DeltaChannel-aware `prune` (see `sqlite_ops`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from gatedloop.checkpoints import sqlite_ops
from gatedloop.checkpoints.contract import LedgerThreads
from gatedloop.checkpoints.exact import ExactResumeWrites
from gatedloop.checkpoints.history_memo import MemoizedHistoryAsync, MemoizedHistorySync
from gatedloop.checkpoints.lease import thread_lease
from gatedloop.checkpoints.ledger import BUSY_TIMEOUT_MS, SqliteLedger, switch_to_wal
from gatedloop.checkpoints.pruning import Statements, prune_transactions, run_on_loop

T = TypeVar("T")


class _LedgerAndLease(LedgerThreads):
    """What gatedloop adds to either SQLite saver (`GatedSaver`): the ledger in the same file, the thread lease
    (a file lock beside it, see `lease`), and the thread listing."""

    ledger: SqliteLedger
    path: str

    def lease(self, thread_id: str, *, wait_s: float = 0.0) -> AbstractContextManager[None]:
        """The thread's lease (a context manager); see `thread_lease`."""
        return thread_lease(self.path, thread_id, wait_s=wait_s)


class GatedSqliteSaver(ExactResumeWrites, MemoizedHistorySync, _LedgerAndLease, SqliteSaver):
    """LangGraph's `SqliteSaver`, plus the ledger that lives beside the checkpoints and the lease, a thread's
    history read from disk once per process (`history_memo`), and resume values stored exactly or refused
    (`ExactResumeWrites`)."""

    def _transact(self, statements: Statements[None]) -> None:
        with self.lock:
            self.setup()
            sqlite_ops.run_sync(self.conn, statements)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) of these runs; ledger and audit rows stay."""
        self._transact(sqlite_ops.delete_for_runs([str(r) for r in run_ids], self.serde))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write, and the ledger and audit rows, to a new thread id."""
        self._transact(sqlite_ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: each namespace's latest checkpoint and what it needs to load (DeltaChannel history);
        `delete`: every checkpoint. One transaction per thread; ledger and audit rows stay."""
        for statements in prune_transactions(
            thread_ids, strategy, sqlite_ops.delete_threads, partial(sqlite_ops.keep_latest, serde=self.serde)
        ):
            self._transact(statements)


class GatedAsyncSqliteSaver(ExactResumeWrites, MemoizedHistoryAsync, _LedgerAndLease, AsyncSqliteSaver):
    """LangGraph's `AsyncSqliteSaver`, plus what `GatedSqliteSaver` adds (the ledger and the lease, the history
    memo, exact resume values)."""

    async def _atransact(self, statements: Statements[None]) -> None:
        await self.setup()
        async with self.lock:
            await sqlite_ops.run_async(self.conn, statements)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) of these runs; ledger and audit rows stay."""
        await self._atransact(sqlite_ops.delete_for_runs([str(r) for r in run_ids], self.serde))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write, and the ledger and audit rows, to a new thread id."""
        await self._atransact(sqlite_ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """See `GatedSqliteSaver.prune`."""
        for statements in prune_transactions(
            thread_ids, strategy, sqlite_ops.delete_threads, partial(sqlite_ops.keep_latest, serde=self.serde)
        ):
            await self._atransact(statements)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._blocking(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._blocking(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._blocking(self.aprune(thread_ids, strategy=strategy))

    def _blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run on the saver's loop from another thread, as LangGraph's own sync bridges do."""
        return run_on_loop(self.loop, coro, type(self).__name__)


def _prepare(path: str | Path) -> str:
    """The folder made and the file in WAL mode (a setting the file keeps), before either saver connects."""
    target = str(path)
    if target != ":memory:":
        Path(target).expanduser().parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(target, timeout=BUSY_TIMEOUT_MS / 1000)) as conn:
            switch_to_wal(conn)
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
        await conn.execute("PRAGMA synchronous=NORMAL")
        saver = GatedAsyncSqliteSaver(conn)
        await saver.setup()
        ledger = SqliteLedger(target, recreate=recreate_ledger)
        saver.ledger, saver.path = ledger, target
        try:
            yield saver
        finally:
            ledger.close()
