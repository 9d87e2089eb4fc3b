"""Postgres for more than one machine: LangGraph's `PostgresSaver`, the ledger beside it, and a lease.

`open_postgres(url)` yields a `GatedPostgresSaver`: the checkpointer (set up), `.ledger` (a `PostgresLedger`,
same tables and same semantics as `SqliteLedger`, in the same database) and `.lease(thread_id)`, the thread's
lease for `gatedloop.graph.runs`. SQLite's file lock becomes a session-level advisory lock
(`pg_try_advisory_lock`) held on a connection of its own: the server drops it when that session ends, however
the holder ends, so a SIGKILLed process never blocks the next one. The ledger's unique row per
(thread, call id) is, as with SQLite, the whole at-most-once story: `INSERT ... ON CONFLICT DO NOTHING` has
one winner across processes and hosts.

Tables are created once, under an advisory lock, because `CREATE TABLE IF NOT EXISTS` (and LangGraph's
migrations) can fail when two processes run them on a fresh database at the same moment.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import _aexecute, _execute
from psycopg import Connection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from gatedloop.checkpoints import postgres_ops
from gatedloop.checkpoints.approval_rounds import POSTGRES_ROUNDS_CHECK, postgres_rounds_upgrade
from gatedloop.checkpoints.chain import drive
from gatedloop.checkpoints.contract import LedgerThreads
from gatedloop.checkpoints.exact import ExactResumeWrites
from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.checkpoints.ledger import POSTGRES_SCHEMA, SqlLedger, claimant_alive
from gatedloop.checkpoints.outbox import KINDS, POSTGRES_KIND_CHECK, POSTGRES_KIND_UPGRADE
from gatedloop.checkpoints.pruning import Statements, prune_transactions, run_on_loop
from gatedloop.tools.blocking import call_blocking

try:  # the `postgres` extra installs it; without it the ledger's async path stays on worker threads
    import greenback
except ImportError:  # a Postgres driver installed by hand, without the extra
    greenback = None  # type: ignore[assignment]

T = TypeVar("T")
P = ParamSpec("P")
log = logging.getLogger("gatedloop.postgres")
CONNECT_TIMEOUT_S = 10
SETUP_LOCK_KEY = int.from_bytes(hashlib.sha256(b"gatedloop:setup").digest()[:8], "big", signed=True)
LEASE_POLL_S = 0.05
SETUP_WAIT_S = 120.0
# The lease's session must die soon after its holder does, also when the holder's host vanishes without
# closing the socket: TCP keepalives on both ends (about 25 s), and no idle timeout on the held session.
LEASE_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
LEASE_SERVER_OPTIONS = (
    "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3 -c idle_session_timeout=0"
)


def lease_key(schema: str, thread_id: str) -> int:
    """The advisory-lock key of a thread in `schema`: 64 bits of a hash, namespaced so other users of advisory
    locks in the same database are unlikely to collide with it (a collision only makes a thread look busy).
    Advisory locks are per database, not per schema: without the schema, two deployments sharing a database in
    schemas of their own would see each other's thread "t1" as busy."""
    name = f"gatedloop:lease:{schema}:{thread_id}"
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _with_defaults(url: str, **defaults: Any) -> str:
    """The URL with `defaults` for the parameters it does not set itself."""
    given = conninfo_to_dict(url)
    return make_conninfo(url, **{k: v for k, v in defaults.items() if k not in given})


def _lease_conninfo(url: str) -> str:
    given = conninfo_to_dict(url)
    options = " ".join(part for part in (str(given.get("options") or ""), LEASE_SERVER_OPTIONS) if part)
    return make_conninfo(
        _with_defaults(url, connect_timeout=CONNECT_TIMEOUT_S, application_name="gatedloop-lease", **LEASE_KEEPALIVES),
        options=options,
    )


@contextmanager
def hold_lease(url: str, thread_id: str, *, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the thread's advisory lock for the block on a connection of its own; ThreadBusy if another
    session holds it for longer than `wait_s`. Two holders in one process exclude each other too."""
    with psycopg.connect(_lease_conninfo(url), autocommit=True) as conn:
        key = lease_key(_current_schema(conn), thread_id)
        deadline = time.monotonic() + wait_s
        while not _try_lock(conn, key):
            if time.monotonic() >= deadline:
                raise ThreadBusy(thread_id)
            time.sleep(LEASE_POLL_S)
        try:
            yield
        finally:
            # closing the session releases the lock anyway; unlocking first keeps a session-pooling proxy honest
            with suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def _current_schema(conn: Connection[Any]) -> str:
    """Where the connection's tables are: the first schema of its search path that exists ('' if none does)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("SELECT coalesce(current_schema(), '')").fetchone()
    return str(row[0]) if row is not None else ""


def _try_lock(conn: Connection[Any], key: int) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (key,)).fetchone()
    return bool(row is not None and (row["locked"] if isinstance(row, dict) else row[0]))


WORKER_PREFIX = "pg-worker:"


def worker_key(token: str) -> int:
    """The advisory-lock key a worker holds for as long as it lives (namespaced as `lease_key`)."""
    return int.from_bytes(hashlib.sha256(f"gatedloop:worker:{token}".encode()).digest()[:8], "big", signed=True)


class WorkerLock:
    """This process's name in ledger claims, checkable from any host: an exclusive session-level advisory
    lock on a fresh random key, held on a connection of its own for as long as the process (and that
    session) lives. Another process asks with `pg_try_advisory_lock_shared`: it succeeds only when no session
    holds the key exclusively, i.e. when the claimant is gone, however it ended and wherever it ran.
    Checkers take the key shared, so two checkers never mistake each other for the claimant.

    If the session is lost (server restart, network), the lock is gone and others will treat the old name
    as dead; the next claim checks the session and takes a new name, so no claim is made under a lock that
    is not held. A write already running under the old name when its session dropped is the one gap, as
    for the thread lease (README).
    """

    def __init__(self, url: str):
        self.url = url
        self._lock = threading.Lock()
        self._conn: Connection[Any] | None = None
        self._pid = 0
        self._name = ""

    def name(self) -> str:
        """The claimant name to write into a claim now (the session is checked with one round trip)."""
        with self._lock:
            if self._conn is None or self._pid != os.getpid() or not self._healthy(self._conn):
                self._take_new_name()
            return self._name

    def _healthy(self, conn: Connection[Any]) -> bool:
        try:
            conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def _take_new_name(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            with suppress(psycopg.Error):
                self._conn.close()
        token = uuid.uuid4().hex
        conn = psycopg.connect(
            make_conninfo(_lease_conninfo(self.url), application_name="gatedloop-worker"), autocommit=True
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (worker_key(token),))
        self._conn, self._pid = conn, os.getpid()
        self._name = f"{WORKER_PREFIX}{token}:{socket.gethostname()}:{os.getpid()}"

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                with suppress(psycopg.Error):
                    self._conn.close()
            self._conn = None


def prepare_database(url: str, *, checkpoints: bool = True) -> None:
    """Create the ledger tables (and run LangGraph's checkpoint migrations if `checkpoints`), one process
    at a time. Connection errors surface here with the server's own message."""
    target = _with_defaults(url, connect_timeout=CONNECT_TIMEOUT_S, application_name="gatedloop-setup")
    with Connection.connect(target, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        # Poll rather than wait in `pg_advisory_lock`: a waiter blocked inside a statement holds a snapshot,
        # the holder's `CREATE INDEX CONCURRENTLY` waits for that snapshot, and the server reports a deadlock.
        deadline = time.monotonic() + SETUP_WAIT_S
        while not _try_lock(conn, SETUP_LOCK_KEY):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"another process has been setting up the database for {SETUP_WAIT_S:.0f}s")
            time.sleep(LEASE_POLL_S)
        try:
            if checkpoints:
                PostgresSaver(conn).setup()
            for statement in POSTGRES_SCHEMA:
                conn.execute(statement)
            found = conn.execute(POSTGRES_KIND_CHECK).fetchone()
            if found is None or not all(f"'{kind}'" in next(iter(found.values())) for kind in KINDS):
                for statement in POSTGRES_KIND_UPGRADE:
                    conn.execute(statement)
            unique = [row["conname"] for row in conn.execute(POSTGRES_ROUNDS_CHECK).fetchall()]
            upgrade = postgres_rounds_upgrade(unique)
            if upgrade:
                with conn.transaction():  # the column and the new key together, or neither
                    for statement in upgrade:
                        conn.execute(statement)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SETUP_LOCK_KEY,))


def _pool_options(url: str, max_size: int, name: str) -> dict[str, Any]:
    """Connections as LangGraph's Postgres savers expect them (autocommit, dict rows), for a sync or async pool."""
    return {
        "conninfo": _with_defaults(url, connect_timeout=CONNECT_TIMEOUT_S, application_name="gatedloop"),
        "kwargs": {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        "min_size": 1,
        "max_size": max_size,
        "open": False,
        "name": name,
    }


def _saver_pool(url: str, max_size: int) -> ConnectionPool[Connection[DictRow]]:
    """The synchronous pool, checked on loan so a server restart costs a reconnect, not an error."""
    return ConnectionPool(
        connection_class=Connection[DictRow],
        check=ConnectionPool.check_connection,
        **_pool_options(url, max_size, "gatedloop"),
    )


AsyncPool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]

_AWAITING: ContextVar[tuple[AsyncPool, psycopg.AsyncConnection[Any]] | None] = ContextVar(
    "gatedloop_postgres_awaiting", default=None
)
"""While `PostgresLedger.run_from_async` runs work: the async pool it serves and the connection its statements
are awaited on (a task's own context, so concurrent runs never share one)."""


class PostgresLedger(SqlLedger):
    """Ledger, audit trail and cancel flags in Postgres: `SqlLedger`'s tables and queries, on a connection pool.

    Every write is one autocommitted statement (a batch, one transaction), so each is atomic by itself; under
    READ COMMITTED a concurrent `INSERT ... ON CONFLICT DO NOTHING` waits for the other inserter and then does
    nothing, and a conditional `UPDATE` re-checks its condition on the row another one just changed.

    Given `async_pool` (an `AsyncConnectionPool` of the event loop `loop`: the async checkpointer's own), async code
    on that loop runs its ledger work on the loop and awaits each statement there (`run_from_async`); anywhere else
    the statements go through the synchronous pool.
    """

    postgres = True

    def __init__(
        self,
        conn: str | ConnectionPool[Any],
        *,
        setup: bool = True,
        max_size: int = 4,
        async_pool: AsyncPool | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        if isinstance(conn, str):
            if setup:
                prepare_database(conn, checkpoints=False)
            self._pool: ConnectionPool[Any] = _saver_pool(conn, max_size)
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            self._owns_pool = True
        else:
            self._pool = conn
            self._owns_pool = False
        conninfo = self._pool.conninfo
        self._worker = WorkerLock(conninfo() if callable(conninfo) else conninfo)
        self._async_pool, self._async_loop = async_pool, loop
        if async_pool is not None and greenback is None:
            log.warning(
                "greenback is not installed (the `postgres` extra installs it): async nodes will hand the "
                "ledger's work to worker threads instead of awaiting its statements on the loop"
            )

    def close(self) -> None:
        self._worker.close()
        if self._owns_pool:
            self._pool.close()

    async def run_from_async(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """See `Ledger.run_from_async`. On the async pool's loop: `work` runs on the loop, on one connection of
        that pool held for its duration, and each statement it makes is awaited there, so other runs go on
        meanwhile and nothing is handed to a thread. Synchronous code cannot await; greenback's portal lets it
        (the greenlet bridge SQLAlchemy's asyncio engine uses, as a library). Elsewhere: on a worker thread."""
        if greenback is None or self._async_pool is None or self._async_loop is not asyncio.get_running_loop():
            return await super().run_from_async(work, *args, **kwargs)
        async with self._async_pool.connection() as conn:
            token = _AWAITING.set((self._async_pool, conn))
            try:
                return await greenback.with_portal_run_sync(work, *args, **kwargs)
            finally:
                _AWAITING.reset(token)

    def _awaited_connection(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection to await this statement on: inside `run_from_async` on this ledger's loop (a view from
        `one_commit` shares its pool), not in a thread that work started."""
        awaiting = _AWAITING.get()
        if awaiting is None or greenback is None or awaiting[0] is not self._async_pool or not greenback.has_portal():
            return None
        return awaiting[1]

    @property
    def claimant(self) -> str:
        return call_blocking(self._worker.name)

    def claimant_alive(self, claimant: str) -> bool:
        """Whether the process named in a claim may still be running: it holds its worker lock while it lives.
        (A claim from before worker locks names host:pid:start-time, checkable on its own host only.)"""
        if not claimant.startswith(WORKER_PREFIX):
            return claimant_alive(claimant)
        key = worker_key(claimant.removeprefix(WORKER_PREFIX).split(":", 1)[0])
        return call_blocking(self._lock_free, key)

    def _lock_free(self, key: int) -> bool:
        with self._pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute("SELECT pg_try_advisory_lock_shared(%s)", (key,))
            row = cur.fetchone()
            taken = bool(row and row[0])
            if taken:
                cur.execute("SELECT pg_advisory_unlock_shared(%s)", (key,))
        return not taken

    def _run(self, query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        awaited = self._awaited_connection()
        if awaited is not None:
            return greenback.await_(_arows(awaited, query, params))
        with self._pool.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(_placeholders(query), tuple(params))
            return cur.fetchall()

    def _write_plain(self, query: str, params: Sequence[Any]) -> int:
        awaited = self._awaited_connection()
        if awaited is not None:
            return greenback.await_(_arowcount(awaited, query, params))
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(_placeholders(query), tuple(params))
            return cur.rowcount

    def _transaction(self, statements: Statements[T]) -> T:
        """The statements in one transaction; evidence appends serialize on the chain's advisory lock (see
        checkpoints/chain.py), taken after the transaction's own statements and held to its commit."""
        awaited = self._awaited_connection()
        if awaited is not None:
            return greenback.await_(_atransaction(awaited, statements))
        with self._pool.connection() as conn, conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:

            def execute(query: str, params: Sequence[Any], fetch: bool) -> list[Any]:
                cur.execute(_placeholders(query), tuple(params))
                return cur.fetchall() if fetch else []

            return drive(execute, statements)


async def _arows(conn: psycopg.AsyncConnection[Any], query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(_placeholders(query), tuple(params))
        return await cur.fetchall()


async def _arowcount(conn: psycopg.AsyncConnection[Any], query: str, params: Sequence[Any]) -> int:
    async with conn.cursor() as cur:
        await cur.execute(_placeholders(query), tuple(params))
        return cur.rowcount


async def _atransaction(conn: psycopg.AsyncConnection[Any], statements: Statements[T]) -> T:
    """`PostgresLedger._transaction` on an async connection: the same generator, each statement awaited."""
    async with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        try:
            query, params, fetch = next(statements)
            while True:
                await cur.execute(_placeholders(query), tuple(params))
                query, params, fetch = statements.send(await cur.fetchall() if fetch else [])
        except StopIteration as done:
            return done.value


def async_pool_of(saver: Any) -> dict[str, Any]:
    """`PostgresLedger`'s `async_pool` and `loop` for a ledger beside LangGraph's `AsyncPostgresSaver` on a pool
    (as Aegra's is): that pool, on the saver's loop. Nothing for any other saver (a sync one, or an async one on a
    single connection, which the checkpointer's own statements hold)."""
    pool, loop = getattr(saver, "conn", None), getattr(saver, "loop", None)
    if isinstance(pool, AsyncConnectionPool) and isinstance(loop, asyncio.AbstractEventLoop):
        return {"async_pool": pool, "loop": loop}
    return {}


def _placeholders(query: str) -> str:
    """`SqlLedger`'s `?` placeholders as psycopg's `%s` (its queries hold no other `?` or `%`)."""
    return query.replace("?", "%s")


class _LedgerAndLease(LedgerThreads):
    """What gatedloop adds to either Postgres saver (`GatedSaver`): the ledger in the same database, the thread
    lease, and the thread listing."""

    ledger: PostgresLedger
    url: str

    def lease(self, thread_id: str, *, wait_s: float = 0.0) -> AbstractContextManager[None]:
        """The thread's lease (a context manager); see `hold_lease`."""
        return hold_lease(self.url, thread_id, wait_s=wait_s)


class GatedPostgresSaver(ExactResumeWrites, _LedgerAndLease, PostgresSaver):
    """LangGraph's `PostgresSaver` on a connection pool, plus the ledger and the lease, and the thread
    operations LangGraph Server uses (see `postgres_ops`)."""

    def _transact(self, statements: Statements[None]) -> None:
        with self._cursor() as cur, cur.connection.transaction():
            _execute(cur, statements)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (writes, blobs) of these runs; ledger and audit rows stay."""
        self._transact(postgres_ops.delete_for_runs([str(r) for r in run_ids]))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write, and the ledger and audit rows, to a new thread id."""
        self._transact(postgres_ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: each namespace's latest checkpoint and what it needs to load (DeltaChannel history),
        one thread per transaction; `delete`: every checkpoint. Ledger and audit rows stay. As LangGraph's,
        a concurrent change to a thread being pruned can raise `SerializationFailure`; retrying is safe."""
        for statements in prune_transactions(
            thread_ids, strategy, postgres_ops.delete_threads, postgres_ops.keep_latest
        ):
            self._transact(statements)


class GatedAsyncPostgresSaver(ExactResumeWrites, _LedgerAndLease, AsyncPostgresSaver):
    """LangGraph's `AsyncPostgresSaver`, plus the ledger (its statements awaited on this saver's pool from async
    nodes, `PostgresLedger.run_from_async`) and the lease,
    and the thread operations LangGraph Server uses (see `postgres_ops`)."""

    async def _atransact(self, statements: Statements[None]) -> None:
        async with self._cursor() as cur, cur.connection.transaction():
            await _aexecute(cur, statements)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """See `GatedPostgresSaver.delete_for_runs`."""
        await self._atransact(postgres_ops.delete_for_runs([str(r) for r in run_ids]))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """See `GatedPostgresSaver.copy_thread`."""
        await self._atransact(postgres_ops.copy_thread(str(source_thread_id), str(target_thread_id)))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """See `GatedPostgresSaver.prune`."""
        for statements in prune_transactions(
            thread_ids, strategy, postgres_ops.delete_threads, postgres_ops.keep_latest
        ):
            await self._atransact(statements)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_on_loop(self.loop, self.adelete_for_runs(run_ids), type(self).__name__)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        run_on_loop(self.loop, self.acopy_thread(source_thread_id, target_thread_id), type(self).__name__)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        run_on_loop(self.loop, self.aprune(thread_ids, strategy=strategy), type(self).__name__)


@contextmanager
def open_postgres(url: str, *, max_size: int = 8) -> Iterator[GatedPostgresSaver]:
    """A synchronous Postgres checkpointer on `url` (tables created if missing), with its ledger and lease.

    `max_size` bounds this process's pooled connections (checkpoints and ledger share them); each held
    lease takes one more connection of its own.
    """
    prepare_database(url)
    pool = _saver_pool(url, max_size)
    pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
    ledger = PostgresLedger(pool, setup=False)
    try:
        saver = GatedPostgresSaver(pool)
        saver.ledger, saver.url = ledger, url
        yield saver
    finally:
        ledger.close()
        pool.close()


@asynccontextmanager
async def open_async_postgres(url: str, *, max_size: int = 8) -> AsyncIterator[GatedAsyncPostgresSaver]:
    """The async twin of `open_postgres`, for `ainvoke`/`astream`: checkpoints on an async pool, which the
    ledger's statements from async nodes share (awaited on the loop); its synchronous uses on a small synchronous
    pool of its own."""
    await asyncio.to_thread(prepare_database, url)
    pool: AsyncConnectionPool[psycopg.AsyncConnection[DictRow]] = AsyncConnectionPool(
        connection_class=psycopg.AsyncConnection[DictRow],
        check=AsyncConnectionPool.check_connection,
        **_pool_options(url, max_size, "gatedloop-async"),
    )
    await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
    ledger: PostgresLedger | None = None
    try:
        ledger = await asyncio.to_thread(
            PostgresLedger, url, setup=False, async_pool=pool, loop=asyncio.get_running_loop()
        )
        saver = GatedAsyncPostgresSaver(pool)
        saver.ledger, saver.url = ledger, url
        yield saver
    finally:
        if ledger is not None:
            ledger.close()
        await pool.close()
