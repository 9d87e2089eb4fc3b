"""Rounds of a call's decisions: a decision counts once per (call, arguments, reviewer, decision, round).

A write whose claim cannot take its terms (a standing grant lapsed, a limit that asks a person would be gone past)
is sent back to a person: a `sent_back` record in `gatedloop_approvals`, after which earlier approvals no longer
count (nodes/gate/admission.py). The reviewer who approved before must then be able to approve again, so the
approvals table keeps each decision once per *round*, the number of the call's `sent_back` records before it
(`sent_back_round`, part of its UNIQUE key). The ledger assigns it in the INSERT itself (`ROUND_OF_INSERT`): the
database counts the records committed before the row, so no writer has to know it, and a replayed answer in the same
round conflicts with its first recording and counts once.

A database made before rounds gets the column once, by the first process that opens it for writing: SQLite cannot
change a UNIQUE constraint, so the table is copied into the new one in one transaction (`sqlite_rounds_upgrade`,
the rows keep their `seq`); Postgres adds the column and swaps the constraint under `prepare_database`'s lock
(`POSTGRES_ROUNDS_UPGRADE`). Every old row is round 0, which it was. A file opened read-only is never changed: a
temporary view adds the column, as 0, in front of its table (`sqlite_rounds_view`). The evidence chain hashes the
column only when it is not 0 (checkpoints/chain.py, `ChainedTable.added`), so rows chained before it keep their
hashes.
"""

from __future__ import annotations

import sqlite3

SENT_BACK = "sent_back"
"""The decision of the gate's record of a call sent back to a person (nodes/gate/admission.py says when)."""
ROUND_COLUMN = "sent_back_round"
ROUND_UNIQUE = "gatedloop_approvals_once_per_round"
ROUND_KEY = f"thread_id, call_id, args_digest, reviewer, decision, {ROUND_COLUMN}"

APPROVALS_TABLE = f"""CREATE TABLE IF NOT EXISTS gatedloop_approvals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    roles TEXT NOT NULL,
    decision TEXT NOT NULL,
    at REAL NOT NULL,
    {ROUND_COLUMN} INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT {ROUND_UNIQUE} UNIQUE ({ROUND_KEY})
);
"""
"""The column is last, where Postgres's `ADD COLUMN` puts it too, so both backends list the same columns."""

ROUND_OF_INSERT = (
    f"(SELECT COUNT(*) FROM gatedloop_approvals r WHERE r.thread_id=? AND r.call_id=? AND r.decision='{SENT_BACK}')"
)
"""The round of a decision being inserted (parameters: thread id, call id)."""

OLD_COLUMNS = "seq, thread_id, call_id, tool, args_digest, reviewer, roles, decision, at"
COPY_OLD_ROWS = (
    f"INSERT INTO gatedloop_approvals_upgraded ({OLD_COLUMNS}) SELECT {OLD_COLUMNS} FROM gatedloop_approvals"
)


def sqlite_rounds_upgrade(conn: sqlite3.Connection) -> None:
    """A file made before rounds: the approvals copied into a table with the column (0 for each) and the new UNIQUE
    key, in one transaction; nothing if it has them."""
    if not _lacks_rounds(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _lacks_rounds(conn):  # another process may have upgraded it while this one waited for the lock
            row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='gatedloop_approvals'").fetchone()
            conn.execute(APPROVALS_TABLE.replace("gatedloop_approvals", "gatedloop_approvals_upgraded", 1))
            conn.execute(COPY_OLD_ROWS)
            conn.execute("DROP TABLE gatedloop_approvals")
            conn.execute("ALTER TABLE gatedloop_approvals_upgraded RENAME TO gatedloop_approvals")
            if row is not None:  # AUTOINCREMENT: the seq of a row deleted before (a pruned thread) is never given again
                conn.execute("DELETE FROM sqlite_sequence WHERE name='gatedloop_approvals'")
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('gatedloop_approvals', ?)", row)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def sqlite_rounds_view(conn: sqlite3.Connection) -> None:
    """On a read-only connection to a file made before rounds: a temporary view (SQLite resolves an unqualified
    name in `temp` before `main`) that reads its approvals with the column, as 0."""
    if _lacks_rounds(conn):
        conn.execute(
            f"CREATE TEMP VIEW gatedloop_approvals AS SELECT *, 0 AS {ROUND_COLUMN} FROM main.gatedloop_approvals"
        )


def _lacks_rounds(conn: sqlite3.Connection) -> bool:
    columns = [row[1] for row in conn.execute("PRAGMA main.table_info('gatedloop_approvals')")]
    return bool(columns) and ROUND_COLUMN not in columns


POSTGRES_ROUNDS_CHECK = (
    "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass('gatedloop_approvals') AND contype = 'u'"
)
"""The UNIQUE constraints of *this* search path's approvals table (as `outbox.POSTGRES_KIND_CHECK`)."""


def postgres_rounds_upgrade(unique_names: list[str]) -> list[str]:
    """The statements that give a Postgres database made before rounds the column and the new UNIQUE key (`[]`:
    it has them), from its table's UNIQUE constraints' names; run in one transaction under `prepare_database`'s
    lock. Postgres named the old key itself, so it is dropped by the name found."""
    if ROUND_UNIQUE in unique_names:
        return []
    return [
        f"ALTER TABLE gatedloop_approvals ADD COLUMN IF NOT EXISTS {ROUND_COLUMN} INTEGER NOT NULL DEFAULT 0",
        *(f'ALTER TABLE gatedloop_approvals DROP CONSTRAINT "{name}"' for name in unique_names),
        f"ALTER TABLE gatedloop_approvals ADD CONSTRAINT {ROUND_UNIQUE} UNIQUE ({ROUND_KEY})",
    ]
