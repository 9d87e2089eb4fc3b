"""Which ledger a checkpointer gets when `build_graph` is given none: never one that loses an approval silently.

The ledger must be as durable as the checkpoints (invariant 12): an approval recorded in memory is gone when the
process ends, and a thread resumed in another process would find its approved write "never validated". So:

- a gatedloop saver (`open_sqlite`, `open_async_sqlite`, `open_postgres`, ...) brings its own ledger;
- a plain `SqliteSaver` on a file gets gatedloop's ledger in that same file, on a connection of its own;
- an in-memory saver (`InMemorySaver`, or a `SqliteSaver` on ":memory:") gets an in-memory ledger, as durable as it;
  one that keeps its checkpoints in files (LangGraph's `PersistentDict`: `langgraph dev`'s own saver, in
  `.langgraph_api/`) gets a ledger file beside them, so an approval asked before a restart is answered after it;
- LangGraph's own `PostgresSaver` / `AsyncPostgresSaver` gets gatedloop's ledger in the same database;
- no checkpointer (LangGraph Server supplies one at run time) gets the ledger of the checkpointer each run is
  given, by the rules here, looked up when a step uses it (`LedgerOfTheRun`): under gatedloop's checkpointer in
  `langgraph.json` or LangGraph's Postgres saver (Aegra), the server's own database, with no `ledger=` to pass;
- any other saver is refused, with what to pass instead.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any, cast
from weakref import WeakKeyDictionary

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.checkpoint.sqlite import SqliteSaver

from gatedloop.checkpoints.contract import GatedSaver
from gatedloop.checkpoints.ledger import Ledger, LedgerError, SqliteLedger
from gatedloop.checkpoints.running_step import running_checkpointer

NO_DURABLE_LEDGER = (
    "build_graph cannot keep approvals and write outcomes durably with a {saver}: gatedloop's ledger must live where "
    "the checkpoints do, or a thread resumed in another process loses its approvals. Use gatedloop's saver for this "
    "database ({instead}), or pass ledger= a ledger in the same database (SqliteLedger(path) for a SQLite file, "
    "PostgresLedger for Postgres)."
)
INSTEAD = {
    "AsyncSqliteSaver": "gatedloop.checkpoints.open_async_sqlite(path)",
}
KEPT_LEDGER_NAME = "gatedloop-ledger.sqlite"
PORTED_FILE = (
    "{path} holds checkpoints of a plain SqliteSaver but no gatedloop ledger yet. If no gatedloop graph ever ran on "
    "it, pass ledger=SqliteLedger({path!r}, recreate=True) once (every write is then reconciled with its system "
    "before it runs); otherwise restore the ledger from a backup. ({error})"
)


def unwrapped(saver: BaseCheckpointSaver) -> BaseCheckpointSaver:
    """The saver a LangGraph Server adapter wraps: `langgraph dev` hands a graph a fresh
    `_CustomCheckpointerAdapter` around the configured checkpointer for each run; the ledger is the inner saver's,
    one per saver, not one per run. Read by its attribute: the adapter is private to langgraph_api."""
    inner = saver.__dict__.get("_inner")
    return unwrapped(inner) if isinstance(inner, BaseCheckpointSaver) else saver


def ledger_for(checkpointer: BaseCheckpointSaver | None) -> Ledger:
    if checkpointer is not None:
        checkpointer = unwrapped(checkpointer)
    if isinstance(checkpointer, GatedSaver):
        return checkpointer.ledger
    if checkpointer is None:
        return cast(Ledger, LedgerOfTheRun())
    if isinstance(checkpointer, InMemorySaver):
        return SqliteLedger(_kept_beside(checkpointer) or ":memory:")
    if isinstance(checkpointer, SqliteSaver):
        path = _file_of(checkpointer)
        if not path:
            return SqliteLedger(":memory:")
        try:
            return SqliteLedger(path)
        except LedgerError as exc:
            raise LedgerError(PORTED_FILE.format(path=path, error=exc)) from exc
    conninfo = _postgres_conninfo(checkpointer)
    if conninfo is not None:  # LangGraph's own Postgres saver: Aegra's and other servers' checkpointer
        from gatedloop.checkpoints.postgres import PostgresLedger, async_pool_of

        return PostgresLedger(conninfo, **async_pool_of(checkpointer))
    kind = type(checkpointer).__name__
    instead = INSTEAD.get(kind, "open_sqlite(path) or open_postgres(url)")
    raise ValueError(NO_DURABLE_LEDGER.format(saver=kind, instead=instead))


def _postgres_conninfo(saver: BaseCheckpointSaver) -> str | None:
    """The database a LangGraph `PostgresSaver` or `AsyncPostgresSaver` writes (its connection or pool, sync or
    async), with the password the connection used; None for any other saver."""
    if not type(saver).__module__.startswith("langgraph.checkpoint.postgres"):
        return None
    conn = getattr(saver, "conn", None)
    conninfo = getattr(conn, "conninfo", None)  # a pool
    if isinstance(conninfo, str):
        return conninfo
    info = getattr(conn, "info", None)  # a connection: its dsn leaves the password out
    if info is None:
        return None
    from psycopg.conninfo import make_conninfo

    password = getattr(info, "password", None)
    return make_conninfo(info.dsn, **({"password": password} if password else {}))


def _kept_beside(saver: InMemorySaver) -> str:
    """The ledger file for an in-memory saver that keeps its checkpoints in files (`PersistentDict`s), in their
    folder; "" for one that keeps nothing."""
    storage = saver.storage
    if isinstance(storage, PersistentDict) and storage.filename:
        return str(Path(storage.filename).with_name(KEPT_LEDGER_NAME))
    return ""


def _file_of(saver: SqliteSaver) -> str:
    """The file a SqliteSaver's connection writes ("" for an in-memory database)."""
    try:
        with saver.lock:
            rows = saver.conn.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as exc:  # a connection made in another thread with check_same_thread
        raise ValueError(
            f"cannot read which file this SqliteSaver writes ({exc}); pass ledger=SqliteLedger(<that file>)"
        ) from exc
    return next((str(file) for _, name, file in rows if name == "main"), "")


class LedgerOfTheRun:
    """The ledger of a graph compiled without a checkpointer, as LangGraph Server compiles the graphs it serves and
    then gives each run its checkpointer: the ledger `ledger_for` gives that checkpointer (one per checkpointer,
    kept), found through the running step's config whenever the ledger is used. So a served graph's approvals and
    claims live in the server's database without `ledger=`: gatedloop's checkpointer under `langgraph dev`, and
    LangGraph's own Postgres saver under Aegra and other servers with several workers (each worker finds the
    approvals the others recorded). A server checkpointer with no place for them fails the run with the reason
    (invariant 12: an approval kept in one worker's memory would be silently lost on the next); a use outside any
    run gets an in-memory ledger. Hand-written: LangGraph binds a checkpointer to a run, not to the nodes' own
    stores."""

    def __init__(self) -> None:
        self._ledgers: WeakKeyDictionary[BaseCheckpointSaver, Ledger] = WeakKeyDictionary()
        self._lock = threading.Lock()
        self._outside = SqliteLedger(":memory:")

    def current(self) -> Ledger:
        try:
            saver = running_checkpointer()
        except RuntimeError:  # not inside a run
            return self._outside
        if not isinstance(saver, BaseCheckpointSaver):
            return self._outside
        return self.of(saver)

    def knows(self, saver: BaseCheckpointSaver) -> bool:
        """Whether the ledger of runs over `saver` is made already (making it opens a file or a connection)."""
        with self._lock:
            return unwrapped(saver) in self._ledgers

    def of(self, saver: BaseCheckpointSaver) -> Ledger:
        """The ledger of runs over `saver`: what `current` finds inside such a run, for a caller about to start one."""
        saver = unwrapped(saver)
        with self._lock:
            ledger = self._ledgers.get(saver)
            if ledger is None:
                try:
                    ledger = ledger_for(saver)
                except ValueError as exc:
                    raise LedgerError(f"{exc} Under a server, build the graph with ledger=...") from exc
                self._ledgers[saver] = ledger
        return ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current(), name)


def concrete_ledger(ledger: Ledger) -> Ledger:
    """The ledger itself: the current run's when `ledger` is a `LedgerOfTheRun`."""
    return ledger.current() if isinstance(ledger, LedgerOfTheRun) else ledger
