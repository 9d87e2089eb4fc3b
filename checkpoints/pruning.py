"""What `prune(strategy="keep_latest")` and `delete_for_runs` may remove when messages are a `DeltaChannel`.

A `DeltaChannel` stores its full value only every `snapshot_frequency` updates (a `_DeltaSnapshot`); in
between, a checkpoint stores nothing for it and loading walks the parent chain, replaying the writes of
each ancestor until one that stores a value (`BaseCheckpointSaver.get_delta_channel_history`). So the
latest checkpoint alone cannot be loaded: `keep_latest` keeps it plus every ancestor up to the nearest
stored value of each of its DeltaChannels (with their writes), the first safe option LangGraph's
`prune` docstring names. It needs no reducer, so it works for any graph; what is kept is bounded by
`snapshot_frequency` (100 updates by default). Which channels are DeltaChannels is read from the
checkpoint metadata LangGraph keeps for them (`counters_since_delta_snapshot`).

LangGraph's own savers refuse `keep_latest` on such threads (Postgres) or do not prune at all (SQLite);
this module is the storage-independent part of ours. Each backend reads checkpoints with statements that
the generators here yield, one at a time, in the pattern of `langgraph.checkpoint.postgres.base`: a
generator yields `(sql, params, fetch)` and is sent back the rows, so the same logic runs on a sync or an
async connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
Statement = tuple[str, Sequence[Any], bool]
Statements = Generator[Statement, list[Any], T]

PRUNE_STRATEGIES = ("keep_latest", "delete")
DELTA_COUNTERS = "counters_since_delta_snapshot"
# LangGraph.js marks the threads of its DeltaChannel graphs this way and keeps no counters.
DELTA_JS_MARKER = "delta_writes_versioned"
# Checkpoints before format 4 read pending sends from their parent's writes.
SENDS_FROM_PARENT_BELOW = 4


class DeltaHistoryCut(ValueError):
    """Deleting these checkpoints would leave a kept one whose DeltaChannel value could not be rebuilt."""


@dataclass(frozen=True)
class Stored:
    """What pruning needs to know about one stored checkpoint."""

    checkpoint_id: str
    parent_id: str | None
    format_version: int
    versioned: frozenset[str]
    """Channels with a version (written at least once on this branch)."""
    valued: frozenset[str]
    """Channels whose value this checkpoint stores (a `_DeltaSnapshot` counts)."""
    delta: frozenset[str]
    """DeltaChannels of the graph, from the metadata LangGraph keeps for them."""
    root: str | None
    """The root-graph checkpoint a subgraph call started from (`metadata["parents"][""]`)."""

    def history_needed(self) -> set[str]:
        """DeltaChannels whose value is rebuilt from ancestors when this checkpoint is loaded."""
        return set((self.delta & self.versioned) - self.valued)


def stored_from(
    checkpoint_id: str,
    parent_id: str | None,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any] | None,
    valued: Sequence[str],
) -> Stored:
    metadata = metadata or {}
    versioned = frozenset(checkpoint.get("channel_versions") or {})
    delta = versioned if metadata.get(DELTA_JS_MARKER) else frozenset(metadata.get(DELTA_COUNTERS) or {})
    parents = metadata.get("parents") or {}
    return Stored(
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        format_version=int(checkpoint.get("v") or 0),
        versioned=versioned,
        valued=frozenset(valued),
        delta=delta,
        root=parents.get("") if isinstance(parents, Mapping) else None,
    )


def prune_transactions(
    thread_ids: Sequence[str],
    strategy: str,
    delete_threads: Callable[[list[str]], Statements[None]],
    keep_latest: Callable[[str], Statements[None]],
) -> list[Statements[None]]:
    """What `prune` runs on either backend, one transaction each: all threads at once for `delete`, one thread
    at a time for `keep_latest`. Arguments are checked as by LangGraph's `PostgresSaver.prune`: a bare string is
    refused, an unknown strategy too."""
    if isinstance(thread_ids, str):
        raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(f"Unknown prune strategy: {strategy!r}")
    ids = [str(t) for t in thread_ids]
    if not ids:
        return []
    return [delete_threads(ids)] if strategy == "delete" else [keep_latest(thread_id) for thread_id in ids]


Loader = Callable[[str], Statements["Stored | None"]]
HasSends = Callable[[str], Statements[bool]]


def kept_chain(head: Stored, load: Loader, has_sends: HasSends) -> Statements[list[str]]:
    """The checkpoint ids of one namespace that `keep_latest` keeps: the head, the parent it reads pending
    sends from (formats before 4), and every ancestor up to the nearest stored value of each DeltaChannel
    the head rebuilds from history (or to the root, when no snapshot was taken yet)."""
    kept = [head.checkpoint_id]
    seeking = head.history_needed()
    cursor = head.parent_id
    if cursor is not None and head.format_version < SENDS_FROM_PARENT_BELOW and (yield from has_sends(cursor)):
        kept.append(cursor)
    while seeking and cursor is not None:
        ancestor = yield from load(cursor)
        if ancestor is None:
            break
        if ancestor.checkpoint_id not in kept:
            kept.append(ancestor.checkpoint_id)
        seeking -= ancestor.valued
        cursor = ancestor.parent_id
    return kept


def deleted_subgraph_calls(
    heads: Mapping[str, Stored], kept: Mapping[str, list[str]], saved_roots: set[str]
) -> set[str]:
    """Subgraph-call namespaces (a task id after ':') that go with a root checkpoint being deleted, as in
    LangGraph's Postgres prune; a call whose root is not saved (yet) keeps its latest checkpoint."""
    root_kept = set(kept.get("", ()))
    return {
        ns
        for ns, head in heads.items()
        if ":" in ns and head.root is not None and head.root in saved_roots and head.root not in root_kept
    }


def refuse_cut_history(survivors: Sequence[tuple[str, Stored]]) -> None:
    """`delete_for_runs` check: a surviving checkpoint whose parent is deleted must not rebuild a
    DeltaChannel from history, or its state would silently lose that channel's value."""
    cut = sorted(f"{thread_id}/{s.checkpoint_id}" for thread_id, s in survivors if s.history_needed())
    if cut:
        raise DeltaHistoryCut(
            "deleting these runs would remove checkpoints that later checkpoints rebuild their DeltaChannel "
            f"values from ({', '.join(cut[:5])}); delete the later runs too, or prune the thread instead"
        )


def run_on_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], saver: str) -> T:
    """An async saver's method called from another thread, as LangGraph's own sync bridges do."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise asyncio.InvalidStateError(
            f"Synchronous calls to {saver} are only allowed from a different thread; use the async method"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
