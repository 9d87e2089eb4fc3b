"""Read a thread's history from disk once per process, not on every invoke.

A `DeltaChannel` (the conversation) is rebuilt at each load from its last snapshot plus every write since,
found by walking the checkpoint chain (`get_delta_channel_history`). For a thread whose next turn starts
where this process left it, nearly all of that was already read last time. The memo keeps, per thread, the
history at the last checkpoint loaded here; the next load walks back only to that checkpoint and appends
the writes stored on the way, exactly as the saver's own walk would: a write stored at an ancestor belongs
to the step that made its child, and a stored value at an ancestor is a new seed.

The walk is the SQLite savers' own two queries (LangGraph's `langgraph.checkpoint.sqlite._delta`: a recursive
CTE streaming the ancestors newest first, then the writes of the walked checkpoints, ordered by
`writes_sort_key`), with one more place to stop: the memoized checkpoint. One round trip each, however many
steps the thread took since (a `get_tuple` per step cost about seven aiosqlite calls, and 50 threads at once
spent half their database calls on it).

Correct by construction, or not used: a checkpoint id names one immutable checkpoint, so a memo entry is never
stale; a walk that never meets the memoized checkpoint is the saver's full walk, memoized in turn. Histories
are shared, not copied: LangGraph's reducers and gatedloop's nodes never mutate a message.

Each load is O(what was stored since the memoized checkpoint): the memo keeps the value the channel rebuilt at
that checkpoint (`ReplayedWrites.folded`) and hands it over as the seed, with only the writes stored since. A
snapshot stored since (a `DoublingDeltaChannel` writes one each time the history doubles) is not read while the
memoized checkpoint may still come (its id is older than the snapshot's): the memoized value and the writes in
between are that snapshot's value, as the same objects, where reading it would build every message anew. If the
walk does not meet the memoized checkpoint, the snapshots are read as the saver's walk reads them.
Hand-written: LangGraph reads the history anew on every load.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, get_checkpoint_id
from langgraph.checkpoint.sqlite._delta import (
    DELTA_STAGE1_SQL,
    build_delta_channels_writes_history,
    build_delta_stage2_sql,
)

from gatedloop.checkpoints.channels import ReplayedWrites

THREADS_KEPT = 256
WRITES_KEPT = 50_000
"""The memo keeps the most recently loaded threads, at most `THREADS_KEPT` of them and at most `WRITES_KEPT`
history entries in all (the newest thread is always kept). 16 threads made 50 concurrent threads miss it on
every load."""

Histories = dict[str, DeltaChannelHistory]
Stage2Row = tuple[str, str, str, int, str, bytes, str]


def _size(histories: Histories) -> int:
    """Entries held: the writes, and a rebuilt value handed over as a seed (the bound is on memory)."""
    return 1 + sum(len(h["writes"]) + _length(h.get("seed")) for h in histories.values())


def _length(seed: Any) -> int:
    return len(seed) if isinstance(seed, list | dict) else 0


class HistoryMemo:
    """The latest known history per (thread, namespace), bounded to the most recently used threads."""

    def __init__(self, threads: int = THREADS_KEPT, writes: int = WRITES_KEPT) -> None:
        self._threads, self._writes = threads, writes
        self._lock = threading.Lock()
        self._latest: OrderedDict[tuple[str, str], tuple[str, Histories]] = OrderedDict()
        self._kept = 0

    def latest(self, thread: tuple[str, str]) -> tuple[str, Histories] | None:
        """(checkpoint id, histories at it) last memoized for the thread."""
        with self._lock:
            return self._latest.get(thread)

    def put(self, thread: tuple[str, str], checkpoint_id: str, histories: Histories) -> None:
        with self._lock:
            old = self._latest.pop(thread, None)
            if old is not None:
                self._kept -= _size(old[1])
            self._latest[thread] = (checkpoint_id, histories)
            self._kept += _size(histories)
            while len(self._latest) > 1 and (len(self._latest) > self._threads or self._kept > self._writes):
                _, (_, dropped) = self._latest.popitem(last=False)
                self._kept -= _size(dropped)


class _Walk:
    """One load: the stage-1 rows (ancestors, newest first) consumed until every channel has its start, the
    memoized checkpoint (its history), or a snapshot (its value); then the stage-2 writes on top of it."""

    def __init__(self, memo: HistoryMemo, config: RunnableConfig, channels: Sequence[str], serde: Any) -> None:
        conf = config["configurable"]
        self.memo, self.channels, self.serde = memo, list(channels), serde
        self.thread = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        self.target = get_checkpoint_id(config)
        entry = memo.latest(self.thread)
        usable = entry is not None and all(ch in entry[1] for ch in self.channels)
        self.base: tuple[str, Histories] | None = entry if usable else None
        self.chain: dict[str, list[str]] = {ch: [] for ch in self.channels}
        self.seeds: dict[str, Any] = {}
        self.from_memo: set[str] = set()
        self.active = set(self.channels)
        self.walked: set[str] = set()
        self.deferred: list[tuple[str, bytes, dict[str, int]]] = []  # rows read only if the memo is not met

    def known(self) -> Histories | None:
        """The memoized histories when the target is the memoized checkpoint itself (no query at all)."""
        if self.base is not None and self.base[0] == self.target:
            return {ch: self.base[1][ch] for ch in self.channels}
        return None

    def stage1_params(self) -> tuple[str, ...]:
        assert self.target is not None
        thread_id, ns = self.thread
        return (thread_id, ns, self.target, thread_id, ns)

    def step(self, row: tuple[str, str, bytes]) -> bool:
        """Take one ancestor row (the first is the target itself); True once the walk can stop."""
        cid, type_tag, blob = row
        if not self.walked:
            if cid == self.target:
                self.walked.add(cid)
            return False
        if cid in self.walked:  # a chain that loops (LangGraph's walk stops there too)
            return True
        self.walked.add(cid)
        for ch in self.active:
            self.chain[ch].append(cid)  # this ancestor's writes made its child: they are part of the history
        if self.base is not None and cid == self.base[0]:
            self.deferred.clear()  # the memoized value and the writes since stand for any snapshot on the way
            self.from_memo = set(self.active)
            self.active.clear()
            return True
        if self.base is not None and cid > self.base[0]:  # newer than the memoized checkpoint: it may still come
            self.deferred.append((type_tag, blob, {ch: len(self.chain[ch]) for ch in self.active}))
            return False
        self.finish()
        if self.active:
            self._seed(type_tag, blob)
        return not self.active

    def finish(self) -> None:
        """The memoized checkpoint was not met: the deferred rows are read now, as the saver's walk reads them
        (a channel seeded at one holds the writes of that row and the newer ones only)."""
        deferred, self.deferred = self.deferred, []
        for type_tag, blob, chain_lengths in deferred:
            if self.active:
                self._seed(type_tag, blob, chain_lengths)

    def _seed(self, type_tag: str, blob: bytes, chain_lengths: Mapping[str, int] | None = None) -> None:
        values: Mapping[str, Any] = self.serde.loads_typed((type_tag, blob)).get("channel_values") or {}
        for ch in [ch for ch in self.active if ch in values]:
            self.seeds[ch] = values[ch]
            self.active.discard(ch)
            if chain_lengths is not None:
                del self.chain[ch][chain_lengths[ch] :]

    def stage2(self, has_task_path: bool) -> tuple[str, list[Any]]:
        """The writes query for the walked chain ('' when there is nothing to read)."""
        with_chain = [ch for ch in self.channels if self.chain[ch]]
        sql = build_delta_stage2_sql(has_task_path=has_task_path, chain_lens=[len(self.chain[ch]) for ch in with_chain])
        params: list[Any] = []
        for ch in with_chain:
            params.extend([self.thread[0], self.thread[1], ch, *self.chain[ch]])
        return sql, params

    def histories(self, rows: Iterable[Stage2Row]) -> Histories:
        found = build_delta_channels_writes_history(
            channels=self.channels,
            chain_by_ch=self.chain,
            seed_val_by_ch=self.seeds,
            seeded=set(self.seeds),
            stage2_rows=list(rows),
            serde=self.serde,
        )
        for ch, history in found.items():
            start = self.base[1][ch] if self.base is not None and ch in self.from_memo else None
            folded = getattr(start["writes"], "folded", None) if start is not None else None
            if start is None:
                history["writes"] = ReplayedWrites(history["writes"])
            elif folded is not None:  # the value rebuilt at the memoized checkpoint, then what was stored since
                found[ch] = {"seed": folded, "writes": ReplayedWrites(history["writes"])}
            else:
                found[ch] = {"writes": ReplayedWrites([*start["writes"], *history["writes"]])}
                if "seed" in start:
                    found[ch]["seed"] = start["seed"]
        self.memo.put(self.thread, str(self.target), found)
        return found


class _MemoOwner:
    """The saver's one memo, made on first use (the savers' own __init__ is LangGraph's)."""

    _history_memo: HistoryMemo

    def _memo(self) -> HistoryMemo:
        if not hasattr(self, "_history_memo"):
            self._history_memo = HistoryMemo()
        return self._history_memo


class MemoizedHistorySync(_MemoOwner):
    """Mixin for LangGraph's `SqliteSaver`: `get_delta_channel_history` through the memo."""

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        saver: Any = self
        walk = _Walk(self._memo(), config, channels, saver.serde)
        if not walk.target or not channels:
            return super().get_delta_channel_history(config=config, channels=channels)  # type: ignore[misc]
        known = walk.known()
        if known is not None:
            return known
        with saver.cursor(transaction=False) as cur:
            cur.execute(DELTA_STAGE1_SQL, walk.stage1_params())
            for row in cur:
                if walk.step(row):
                    break
            walk.finish()
            sql, params = walk.stage2(saver._has_task_path)
            rows = cur.execute(sql, params).fetchall() if sql else []
        return walk.histories(rows)


class MemoizedHistoryAsync(_MemoOwner):
    """Mixin for LangGraph's `AsyncSqliteSaver`: `aget_delta_channel_history` through the memo."""

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        saver: Any = self
        walk = _Walk(self._memo(), config, channels, saver.serde)
        if not walk.target or not channels:
            return await super().aget_delta_channel_history(config=config, channels=channels)  # type: ignore[misc]
        known = walk.known()
        if known is not None:
            return known
        await saver.setup()
        async with saver.lock, saver.conn.cursor() as cur:
            await cur.execute(DELTA_STAGE1_SQL, walk.stage1_params())
            async for row in cur:
                if walk.step(row):
                    break
            walk.finish()
            sql, params = walk.stage2(saver._has_task_path)
            if sql:
                await cur.execute(sql, params)
                rows = await cur.fetchall()
            else:
                rows = []
        return walk.histories(rows)
