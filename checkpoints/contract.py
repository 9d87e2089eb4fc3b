"""The saver contract: what gatedloop needs from a checkpointer beyond LangGraph's `BaseCheckpointSaver`.

A saver from `open_sqlite`/`open_async_sqlite` (checkpoints/sqlite.py) or `open_postgres`/`open_async_postgres`
(checkpoints/postgres.py) carries, besides the checkpoints, the execution ledger in the same database
(`ledger`), the thread lease that keeps a thread to one resumer at a time (`lease`) and the threads it holds
(`thread_ids`). Callers ask `isinstance(saver, GatedSaver)`; a plain LangGraph checkpointer is not one, and
gets what it got before the contract was declared: an in-memory ledger (`build_graph`) and no lease.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

from gatedloop.checkpoints.ledger import Ledger, SqlLedger

POSTGRES_PREFIXES = ("postgresql://", "postgres://")
"""A database named by one of these (`--db`, `GATEDLOOP_DB`, `GATEDLOOP_LEDGER`) is Postgres; else a SQLite file."""


@runtime_checkable
class GatedSaver(Protocol):
    """A checkpointer with gatedloop's ledger, lease and thread listing (both backends implement it)."""

    @property
    def ledger(self) -> Ledger: ...

    def lease(self, thread_id: str, *, wait_s: float = 0.0) -> AbstractContextManager[None]:
        """Hold the thread for the block; `ThreadBusy` if another holder keeps it longer than `wait_s`."""
        ...

    def thread_ids(self) -> list[str]:
        """Threads with a checkpoint, oldest activity first."""
        ...


class LedgerThreads:
    """Mixin for the savers: `thread_ids` read through the ledger's connection to the same database."""

    ledger: SqlLedger

    def thread_ids(self) -> list[str]:
        return self.ledger.thread_ids()
