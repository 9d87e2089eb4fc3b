"""delete_for_runs, copy_thread and prune on LangGraph's Postgres tables (and gatedloop's ledger beside them).

`langgraph-checkpoint-postgres` has `prune`, but refuses `keep_latest` on a thread that uses a DeltaChannel
(gatedloop's messages do), and has neither `delete_for_runs` nor `copy_thread`. These reuse its prune
statements (what is deleted once the kept ids are known, including the blobs only deleted checkpoints
referenced) and its statement runners; only the choice of what to keep (`pruning.kept_chain`) is ours.
Each operation runs in one transaction; `keep_latest` on one REPEATABLE READ snapshot per thread, as
LangGraph's, so a run appending to the thread meanwhile is neither seen nor deleted.

None of them deletes ledger, audit or cancel rows (see `sqlite_ops`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from langgraph.checkpoint.postgres.base import (
    PRUNE_BLOBS_SQL,
    PRUNE_CHECKPOINTS_SQL,
    PRUNE_DELETE_THREADS_SQL,
    PRUNE_PARENTS_SQL,
    PRUNE_REFERENCED_BLOBS_SQL,
    PRUNE_SNAPSHOT_SQL,
    PRUNE_SUBGRAPH_CALLS_SQL,
    PRUNE_UNKEPT_SQL,
    PRUNE_WRITES_SQL,
    _garbage_blobs,
)
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

# A channel's value is stored inline (a primitive) or as a blob at the version the checkpoint names; a
# `_DeltaSnapshot` is a blob (with an inline `true` marker). As LangGraph's delta-history walk reads them.
STORED_COLUMNS = """c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint, c.metadata, ARRAY(
    SELECT v.key FROM jsonb_each(c.checkpoint -> 'channel_values') AS v WHERE v.value <> 'null'::jsonb
    UNION
    SELECT b.channel FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS cv
    JOIN checkpoint_blobs b ON b.thread_id = c.thread_id AND b.checkpoint_ns = c.checkpoint_ns
        AND b.channel = cv.key AND b.version = cv.value
    WHERE b.type <> 'empty'
) AS valued"""

HEADS_SQL = """SELECT DISTINCT ON (checkpoint_ns) checkpoint_ns, checkpoint_id FROM checkpoints
WHERE thread_id = %s ORDER BY checkpoint_ns DESC, checkpoint_id DESC"""

DELETE_CHECKPOINTS_SQL = """WITH deleted AS (
    DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = ANY(%s)
    RETURNING checkpoint -> 'channel_versions' AS versions
)
SELECT DISTINCT v.key AS channel, v.value AS version
FROM deleted CROSS JOIN LATERAL jsonb_each_text(deleted.versions) AS v
"""

COPY_CHECKPOINTS_SQL = """INSERT INTO checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
    SELECT %s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
        CASE WHEN metadata ? 'thread_id' THEN jsonb_set(metadata, '{thread_id}', to_jsonb(%s::text))
        ELSE metadata END
    FROM checkpoints WHERE thread_id = %s"""

COPY_BLOBS_SQL = """INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %s, checkpoint_ns, channel, version, type, blob
    FROM checkpoint_blobs WHERE thread_id = %s"""

COPY_WRITES_SQL = """INSERT INTO checkpoint_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
    SELECT %s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
    FROM checkpoint_writes WHERE thread_id = %s"""


def _stored(row: dict[str, Any]) -> Stored:
    return stored_from(
        row["checkpoint_id"], row["parent_checkpoint_id"], row["checkpoint"], row["metadata"], row["valued"]
    )


def _load(thread_id: str, ns: str, checkpoint_id: str) -> Statements[Stored | None]:
    rows = yield (
        f"SELECT {STORED_COLUMNS} FROM checkpoints c"
        " WHERE c.thread_id = %s AND c.checkpoint_ns = %s AND c.checkpoint_id = %s",
        (thread_id, ns, checkpoint_id),
        True,
    )
    return _stored(rows[0]) if rows else None


def _has_sends(thread_id: str, ns: str, checkpoint_id: str) -> Statements[bool]:
    rows = yield (
        "SELECT 1 AS found FROM checkpoint_writes"
        " WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s AND channel = %s LIMIT 1",
        (thread_id, ns, checkpoint_id, TASKS),
        True,
    )
    return bool(rows)


def _drop_blobs(thread_id: str, ns: str, freed: list[Any]) -> Statements[None]:
    """The blobs that deleted checkpoints referenced and no remaining one does."""
    if not freed:
        return
    referenced = yield PRUNE_REFERENCED_BLOBS_SQL, (thread_id, ns), True
    for channel, versions in _garbage_blobs(freed, referenced).items():
        yield PRUNE_BLOBS_SQL, (thread_id, ns, channel, versions), False


def delete_for_runs(run_ids: Sequence[str]) -> Statements[None]:
    """The checkpoints whose metadata names one of the runs, their writes and the blobs only they used;
    refused (`DeltaHistoryCut`) when a checkpoint that stays rebuilds a DeltaChannel from one of them."""
    if not run_ids:
        return
    rows = yield (
        "SELECT thread_id, checkpoint_ns, checkpoint_id FROM checkpoints WHERE metadata ->> 'run_id' = ANY(%s)",
        (list(run_ids),),
        True,
    )
    groups: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        groups.setdefault((row["thread_id"], row["checkpoint_ns"]), []).append(row["checkpoint_id"])
    survivors: list[tuple[str, Stored]] = []
    for (thread_id, ns), ids in sorted(groups.items()):
        children = yield (
            f"SELECT {STORED_COLUMNS} FROM checkpoints c WHERE c.thread_id = %s AND c.checkpoint_ns = %s"
            " AND c.parent_checkpoint_id = ANY(%s) AND c.checkpoint_id <> ALL(%s)",
            (thread_id, ns, ids, ids),
            True,
        )
        survivors += [(thread_id, _stored(child)) for child in children]
    refuse_cut_history(survivors)
    for (thread_id, ns), ids in sorted(groups.items()):
        yield PRUNE_WRITES_SQL, (thread_id, ns, ids), False
        freed = yield DELETE_CHECKPOINTS_SQL, (thread_id, ns, ids), True
        yield from _drop_blobs(thread_id, ns, freed)


def copy_thread(source: str, target: str) -> Statements[None]:
    """Every checkpoint, blob and write of `source` under `target` (metadata's `thread_id` rewritten), and
    its ledger and audit rows (see `copy_ledger_rows`)."""
    yield from refuse_taken_copy_target(source, target, "%s")
    yield COPY_CHECKPOINTS_SQL, (target, target, source), False
    yield COPY_BLOBS_SQL, (target, source), False
    yield COPY_WRITES_SQL, (target, source), False
    yield from copy_ledger_rows(source, target, "%s")


def delete_threads(thread_ids: Sequence[str]) -> Statements[None]:
    """`prune(strategy="delete")`: every checkpoint, blob and write of the threads."""
    for statement in PRUNE_DELETE_THREADS_SQL:
        yield statement, (list(thread_ids),), False


def keep_latest(thread_id: str) -> Statements[None]:
    """`prune(strategy="keep_latest")` of one thread, on one snapshot; see `pruning.kept_chain`."""
    yield PRUNE_SNAPSHOT_SQL, (), False
    head_rows = yield HEADS_SQL, (thread_id,), True
    heads: dict[str, Stored] = {}
    kept: dict[str, list[str]] = {}
    for row in head_rows:
        ns = row["checkpoint_ns"]
        head = yield from _load(thread_id, ns, row["checkpoint_id"])
        assert head is not None
        heads[ns] = head
        kept[ns] = yield from kept_chain(head, partial(_load, thread_id, ns), partial(_has_sends, thread_id, ns))
    roots = sorted({str(h.root) for ns, h in heads.items() if ":" in ns and h.root})
    saved = yield (
        "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' AND checkpoint_id = ANY(%s)",
        (thread_id, roots),
        True,
    )
    calls = deleted_subgraph_calls(heads, kept, {r["checkpoint_id"] for r in saved})
    if calls:
        for statement in PRUNE_SUBGRAPH_CALLS_SQL:
            yield statement, (thread_id, sorted(calls)), False
    for ns, ids in kept.items():
        if ns in calls:
            continue
        unkept = yield PRUNE_UNKEPT_SQL, (thread_id, ns, ids), True
        if unkept:
            yield PRUNE_WRITES_SQL, (thread_id, ns, [r["checkpoint_id"] for r in unkept]), False
        freed = yield PRUNE_CHECKPOINTS_SQL, (thread_id, ns, ids), True
        yield PRUNE_PARENTS_SQL, (thread_id, ns, ids, ids), False
        yield from _drop_blobs(thread_id, ns, freed)
