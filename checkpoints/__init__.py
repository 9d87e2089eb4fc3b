"""gatedloop.checkpoints: SQLite checkpointers with the execution ledger in the same file."""

from gatedloop.checkpoints.ledger import SqliteLedger, idempotency_key
from gatedloop.checkpoints.sqlite import open_async_sqlite, open_sqlite

__all__ = ["SqliteLedger", "idempotency_key", "open_async_sqlite", "open_sqlite"]
