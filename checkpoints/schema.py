"""What a database holds, read without changing it (`gatedloop doctor`): LangGraph's checkpoint tables, gatedloop's
ledger tables, and the schema version where there is one.

gatedloop keeps no version number of its own: its tables are created with `CREATE TABLE IF NOT EXISTS` (and one
CHECK upgraded in place) by whichever process opens the database for writing, so a database is as current as the
set of tables it has. LangGraph's Postgres saver numbers its migrations (`checkpoint_migrations`); its SQLite saver
does not, so on SQLite the tables are the whole story.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from gatedloop.checkpoints.ledger import SCHEMA

LEDGER_TABLES = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA))
SQLITE_CHECKPOINT_TABLES = ("checkpoints", "writes")
POSTGRES_CHECKPOINT_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations")
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class SchemaReport:
    """The tables found, what is missing of either schema, and the migration versions (Postgres)."""

    engine: str
    missing_checkpoint_tables: tuple[str, ...]
    missing_ledger_tables: tuple[str, ...]
    migration: int | None = None
    """LangGraph's newest applied checkpoint migration (None: SQLite, or none applied yet)."""
    latest_migration: int | None = None
    """The newest migration the installed langgraph-checkpoint-postgres knows."""

    @property
    def fresh(self) -> bool:
        """Nothing of either schema yet: a database no gatedloop has opened."""
        return len(self.missing_ledger_tables) == len(LEDGER_TABLES) and bool(self.missing_checkpoint_tables)


def _missing(expected: tuple[str, ...], found: set[str]) -> tuple[str, ...]:
    return tuple(name for name in expected if name not in found)


def sqlite_schema(path: str) -> SchemaReport:
    """The SQLite file's tables, opened read-only (sqlite3.Error if it cannot be read as a database)."""
    conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        found = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()
    engine = f"SQLite {sqlite3.sqlite_version}, journal {mode}"
    return SchemaReport(engine, _missing(SQLITE_CHECKPOINT_TABLES, found), _missing(LEDGER_TABLES, found))


def postgres_schema(url: str) -> SchemaReport:
    """The Postgres database's tables on its search path, and LangGraph's migration version (psycopg.Error if the
    server cannot be reached)."""
    import psycopg
    from langgraph.checkpoint.postgres.base import BasePostgresSaver

    with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        found = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            )
        }
        migration = None
        if "checkpoint_migrations" in found:
            row = conn.execute("SELECT max(v) FROM checkpoint_migrations").fetchone()
            migration = row[0] if row else None
    engine = f"Postgres {version[0] if version else '?'}"
    return SchemaReport(
        engine,
        _missing(POSTGRES_CHECKPOINT_TABLES, found),
        _missing(LEDGER_TABLES, found),
        migration,
        len(BasePostgresSaver.MIGRATIONS) - 1,
    )
