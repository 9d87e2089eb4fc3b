"""Opening the SQLite checkpointer the way a multi-process deployment needs it.

WAL so readers never block the writer, a busy timeout so a second process waits instead of failing with
"database is locked", and the execution ledger in the same file, reachable as `saver.ledger`. The savers add
what LangGraph Server uses beyond LangGraph's SQLite savers: `delete_for_runs` (rollback), `copy_thread`
(which copies the ledger rows too) and DeltaChannel-aware `prune` (see `sqlite_ops`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, closing, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
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
S = TypeVar("S", bound="GatedSqliteSaver")  # the sync saver, or its on-loop subclass


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


class GatedOnLoopSqliteSaver(GatedSqliteSaver):
    """`GatedSqliteSaver` for `ainvoke`/`astream`: its async methods run the sync ones in place, on the event loop's
    thread, and so does its ledger (`SqlLedger.on_loop`), so an async turn hands nothing to another thread but a tool.

    Why: a statement on a local SQLite file takes tens of microseconds, less than handing it to a thread and back
    (aiosqlite sends every statement to its connection's thread, and a sync node is run on the default executor);
    under 50 concurrent threads those hand-offs cost more CPU than the gate's work itself (docs/performance.md).
    No transaction stays open across an `await`, so the ledger's writes and the checkpoint's never wait on each
    other inside a process. The cost: while another process holds the file's write lock, the loop waits for it
    (up to the busy timeout). A server whose loop must never block (`langgraph dev`'s blockbuster) opens
    `open_async_sqlite(path, on_loop=False)`. Hand-written: LangGraph's `SqliteSaver` refuses async calls and its
    `AsyncSqliteSaver` is the aiosqlite one."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in self.list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self.put_writes(config, writes, task_id, task_path)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self.get_delta_channel_history(config=config, channels=channels)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)


class GatedAsyncSqliteSaver(ExactResumeWrites, MemoizedHistoryAsync, _LedgerAndLease, AsyncSqliteSaver):
    """LangGraph's `AsyncSqliteSaver` (aiosqlite: every statement on its connection's thread, the loop never
    waits), plus what `GatedSqliteSaver` adds (the ledger and the lease, the history memo, exact resume values):
    `open_async_sqlite(path, on_loop=False)`, for servers."""

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
    with _opened(path, recreate_ledger, GatedSqliteSaver) as saver:
        yield saver


@contextmanager
def _opened(path: str | Path, recreate_ledger: bool, saver_type: type[S]) -> Iterator[S]:
    target = _prepare(path)
    conn = sqlite3.connect(target, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
    ledger = None
    try:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous=NORMAL")
        saver = saver_type(conn)
        saver.setup()
        ledger = SqliteLedger(target, recreate=recreate_ledger, on_loop=issubclass(saver_type, GatedOnLoopSqliteSaver))
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
async def open_async_sqlite(
    path: str | Path, *, recreate_ledger: bool = False, on_loop: bool = True
) -> AsyncIterator[GatedOnLoopSqliteSaver | GatedAsyncSqliteSaver]:
    """The async twin of `open_sqlite`, for `ainvoke`/`astream` and many concurrent threads.

    `on_loop` (the default): SQLite's statements, the checkpoints' and the ledger's, run on the event loop's
    thread (`GatedOnLoopSqliteSaver`, whose `conn` is a `sqlite3.Connection`), the fastest way under many threads
    at once; the loop waits while another process holds the write lock. `on_loop=False`: through aiosqlite, the
    gate's ledger work on worker threads, for a loop that serves other work and must never wait on a lock
    (`GatedAsyncSqliteSaver`)."""
    if on_loop:
        with _opened(path, recreate_ledger, GatedOnLoopSqliteSaver) as on_loop_saver:
            yield on_loop_saver
        return
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
