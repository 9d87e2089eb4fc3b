"""gatedloop.checkpoints: LangGraph checkpointers (SQLite here, Postgres in postgres.py) that carry the execution
ledger and the approval evidence in the same database; contract.py says what gatedloop needs from a saver."""

from gatedloop.checkpoints.ledger import SqliteLedger, idempotency_key
from gatedloop.checkpoints.sqlite import open_async_sqlite, open_sqlite

__all__ = ["SqliteLedger", "idempotency_key", "open_async_sqlite", "open_sqlite"]
