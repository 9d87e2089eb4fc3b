"""Which ledger a checkpointer gets when `build_graph` is given none: never one that loses an approval silently.

The ledger must be as durable as the checkpoints (invariant 12): an approval recorded in memory is gone when the
process ends, and a thread resumed in another process would find its approved write "never validated". So:

- a gatedloop saver (`open_sqlite`, `open_async_sqlite`, `open_postgres`, ...) brings its own ledger;
- a plain `SqliteSaver` on a file gets gatedloop's ledger in that same file, on a connection of its own;
- an in-memory saver (`InMemorySaver`, or a `SqliteSaver` on ":memory:") gets an in-memory ledger, as durable as it;
- no checkpointer (LangGraph Server supplies one at run time) gets an in-memory ledger: pass `ledger=` for the
  server's database (`gatedloop.checkpoints.devserver`);
- any other saver is refused, with what to pass instead.
"""

from __future__ import annotations

import sqlite3

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from gatedloop.checkpoints.contract import GatedSaver
from gatedloop.checkpoints.ledger import Ledger, LedgerError, SqliteLedger

NO_DURABLE_LEDGER = (
    "build_graph cannot keep approvals and write outcomes durably with a {saver}: gatedloop's ledger must live where "
    "the checkpoints do, or a thread resumed in another process loses its approvals. Use gatedloop's saver for this "
    "database ({instead}), or pass ledger= a ledger in the same database (SqliteLedger(path) for a SQLite file, "
    "PostgresLedger for Postgres)."
)
INSTEAD = {
    "AsyncSqliteSaver": "gatedloop.checkpoints.open_async_sqlite(path)",
    "PostgresSaver": "gatedloop.checkpoints.postgres.open_postgres(url)",
    "AsyncPostgresSaver": "gatedloop.checkpoints.postgres.open_async_postgres(url)",
}
PORTED_FILE = (
    "{path} holds checkpoints of a plain SqliteSaver but no gatedloop ledger yet. If no gatedloop graph ever ran on "
    "it, pass ledger=SqliteLedger({path!r}, recreate=True) once (every write is then reconciled with its system "
    "before it runs); otherwise restore the ledger from a backup. ({error})"
)


def ledger_for(checkpointer: BaseCheckpointSaver | None) -> Ledger:
    if isinstance(checkpointer, GatedSaver):
        return checkpointer.ledger
    if checkpointer is None or isinstance(checkpointer, InMemorySaver):
        return SqliteLedger(":memory:")
    if isinstance(checkpointer, SqliteSaver):
        path = _file_of(checkpointer)
        if not path:
            return SqliteLedger(":memory:")
        try:
            return SqliteLedger(path)
        except LedgerError as exc:
            raise LedgerError(PORTED_FILE.format(path=path, error=exc)) from exc
    kind = type(checkpointer).__name__
    instead = INSTEAD.get(kind, "open_sqlite(path) or open_postgres(url)")
    raise ValueError(NO_DURABLE_LEDGER.format(saver=kind, instead=instead))


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
