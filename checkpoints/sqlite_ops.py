"""delete_for_runs, copy_thread and prune on LangGraph's SQLite tables (and gatedloop's ledger beside them).

`langgraph-checkpoint-sqlite` implements none of the three, so they are written here against its schema
(`checkpoints`, `writes`; values inline in the checkpoint blob). Each operation is a generator of
statements (see `pruning`), run in one `BEGIN IMMEDIATE` transaction by `run_sync` (sqlite3) or
`run_async` (aiosqlite): nothing is half done, and no other writer interleaves.

None of them deletes ledger, audit or cancel rows: the evidence of a write that started outlives any
checkpoint, so a call re-proposed after a rollback or a prune is reported from the ledger, never re-run.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from functools import partial
from typing import Any

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import TASKS

from gatedloop.checkpoints.ledger import copy_ledger_rows, refuse_taken_copy_target
from gatedloop.checkpoints.pruning import (
    Statements,
    Stored,
    deleted_subgraph_calls,
    kept_chain,
    refuse_cut_history,
    stored_from,
)

CHECKPOINT_COLUMNS = "checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata"


def _marks(count: int) -> str:
    return ",".join("?" * count)


def _stored(serde: SerializerProtocol, row: Sequence[Any]) -> Stored:
    checkpoint_id, parent_id, type_tag, blob, metadata = row
    checkpoint = serde.loads_typed((type_tag, blob))
    meta = json.loads(metadata) if metadata is not None else {}
    return stored_from(checkpoint_id, parent_id, checkpoint, meta, list(checkpoint.get("channel_values") or {}))


def _load(serde: SerializerProtocol, thread_id: str, ns: str, checkpoint_id: str) -> Statements[Stored | None]:
    rows = yield (
        f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id=? AND checkpoint_ns=? AND checkpoint_id=?",
        (thread_id, ns, checkpoint_id),
        True,
    )
    return _stored(serde, rows[0]) if rows else None


def _has_sends(thread_id: str, ns: str, checkpoint_id: str) -> Statements[bool]:
    rows = yield (
        "SELECT 1 FROM writes WHERE thread_id=? AND checkpoint_ns=? AND checkpoint_id=? AND channel=? LIMIT 1",
        (thread_id, ns, checkpoint_id, TASKS),
        True,
    )
    return bool(rows)


def _delete_checkpoint(thread_id: str, ns: str, checkpoint_id: str) -> Statements[None]:
    key = (thread_id, ns, checkpoint_id)
    yield "DELETE FROM writes WHERE thread_id=? AND checkpoint_ns=? AND checkpoint_id=?", key, False
    yield "DELETE FROM checkpoints WHERE thread_id=? AND checkpoint_ns=? AND checkpoint_id=?", key, False


def delete_for_runs(run_ids: Sequence[str], serde: SerializerProtocol) -> Statements[None]:
    """The checkpoints whose metadata names one of the runs, with their writes; refused (`DeltaHistoryCut`)
    when a checkpoint that stays rebuilds a DeltaChannel from one of them."""
    if not run_ids:
        return
    rows = yield (
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints"
        f" WHERE json_extract(CAST(metadata AS TEXT), '$.run_id') IN ({_marks(len(run_ids))})",
        list(run_ids),
        True,
    )
    doomed = {(t, ns, cid) for t, ns, cid in rows}
    survivors: list[tuple[str, Stored]] = []
    for thread_id, ns, checkpoint_id in sorted(doomed):
        children = yield (
            f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints"
            " WHERE thread_id=? AND checkpoint_ns=? AND parent_checkpoint_id=?",
            (thread_id, ns, checkpoint_id),
            True,
        )
        survivors += [(thread_id, _stored(serde, c)) for c in children if (thread_id, ns, c[0]) not in doomed]
    refuse_cut_history(survivors)
    for key in sorted(doomed):
        yield from _delete_checkpoint(*key)


def copy_thread(source: str, target: str) -> Statements[None]:
    """Every checkpoint and write of `source` under `target` (metadata's `thread_id` rewritten, as the
    LangGraph API's own fallback does), and its ledger and audit rows (see `copy_ledger_rows`)."""
    yield from refuse_taken_copy_target(source, target, "?")
    yield (
        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,"
        " metadata) SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,"
        " CASE WHEN json_type(CAST(metadata AS TEXT), '$.thread_id') IS NOT NULL"
        " THEN CAST(json_set(CAST(metadata AS TEXT), '$.thread_id', ?) AS BLOB) ELSE metadata END"
        " FROM checkpoints WHERE thread_id=?",
        (target, target, source),
        False,
    )
    yield (
        "INSERT INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)"
        " SELECT ?, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value"
        " FROM writes WHERE thread_id=?",
        (target, source),
        False,
    )
    yield from copy_ledger_rows(source, target, "?")


def delete_threads(thread_ids: Sequence[str]) -> Statements[None]:
    """`prune(strategy="delete")`: every checkpoint and write of the threads."""
    marks = _marks(len(thread_ids))
    yield f"DELETE FROM writes WHERE thread_id IN ({marks})", list(thread_ids), False
    yield f"DELETE FROM checkpoints WHERE thread_id IN ({marks})", list(thread_ids), False


def keep_latest(thread_id: str, serde: SerializerProtocol) -> Statements[None]:
    """`prune(strategy="keep_latest")` of one thread; see `pruning.kept_chain` for what each namespace keeps."""
    head_rows = yield (
        "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints WHERE thread_id=? GROUP BY checkpoint_ns",
        (thread_id,),
        True,
    )
    heads: dict[str, Stored] = {}
    kept: dict[str, list[str]] = {}
    for ns, head_id in head_rows:
        head = yield from _load(serde, thread_id, ns, head_id)
        assert head is not None
        heads[ns] = head
        kept[ns] = yield from kept_chain(head, partial(_load, serde, thread_id, ns), partial(_has_sends, thread_id, ns))
    saved_roots: set[str] = set()
    for root in {h.root for ns, h in heads.items() if ":" in ns and h.root}:
        found = yield (
            "SELECT 1 FROM checkpoints WHERE thread_id=? AND checkpoint_ns='' AND checkpoint_id=?",
            (
                thread_id,
                root,
            ),
            True,
        )
        if found:
            saved_roots.add(str(root))
    calls = deleted_subgraph_calls(heads, kept, saved_roots)
    for ns in sorted(calls):
        yield "DELETE FROM writes WHERE thread_id=? AND checkpoint_ns=?", (thread_id, ns), False
        yield "DELETE FROM checkpoints WHERE thread_id=? AND checkpoint_ns=?", (thread_id, ns), False
    for ns, ids in kept.items():
        if ns in calls:
            continue
        rows = yield (
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id=? AND checkpoint_ns=?",
            (thread_id, ns),
            True,
        )
        unkept = [cid for (cid,) in rows if cid not in ids]
        for checkpoint_id in unkept:
            yield from _delete_checkpoint(thread_id, ns, checkpoint_id)
        if unkept:
            yield (
                "UPDATE checkpoints SET parent_checkpoint_id=NULL WHERE thread_id=? AND checkpoint_ns=?"
                f" AND checkpoint_id IN ({_marks(len(ids))}) AND parent_checkpoint_id NOT IN ({_marks(len(ids))})",
                (thread_id, ns, *ids, *ids),
                False,
            )


def run_sync(conn: sqlite3.Connection, statements: Statements[None]) -> None:
    """Run the statements in one immediate transaction on a sqlite3 connection (rolled back on error)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        try:
            sql, params, fetch = next(statements)
            while True:
                cursor = conn.execute(sql, params)
                sql, params, fetch = statements.send(cursor.fetchall() if fetch else [])
        except StopIteration:
            pass
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


async def run_async(conn: aiosqlite.Connection, statements: Statements[None]) -> None:
    """`run_sync` on an aiosqlite connection."""
    await conn.execute("BEGIN IMMEDIATE")
    try:
        try:
            sql, params, fetch = next(statements)
            while True:
                cursor = await conn.execute(sql, params)
                rows = list(await cursor.fetchall()) if fetch else []
                sql, params, fetch = statements.send(rows)
        except StopIteration:
            pass
    except BaseException:
        await conn.rollback()
        raise
    await conn.commit()
