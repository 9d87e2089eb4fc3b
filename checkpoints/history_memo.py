"""Read a thread's history from disk once per process, not on every invoke.

A `DeltaChannel` (the conversation) is rebuilt at each load from its last snapshot plus every write since,
found by walking the checkpoint chain (`get_delta_channel_history`). For a thread whose next turn starts
where this process left it, nearly all of that was already read last time. The memo keeps, per thread, the
history at the last checkpoint loaded or extended here; the next load walks back only to that checkpoint
(a few `get_tuple` calls for a turn) and appends the writes found on the way, exactly as the saver's own
walk would: a write stored at an ancestor belongs to the step that made its child, and a stored value at
an ancestor is a new seed.

Correct by construction, or not used: a checkpoint id names one immutable checkpoint, so a memo entry is
never stale; a walk that does not reach a memoized checkpoint within `MAX_WALK` steps, or finds one step
written by several tasks (whose order only the saver's `task_path` sort knows), falls back to the saver's
full walk, whose result is memoized in turn. Histories are shared, not copied: LangGraph's reducers and
gatedloop's nodes never mutate a message. Hand-written: LangGraph reads the history anew on every load.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Generator, Mapping, Sequence

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory, get_checkpoint_id

MAX_WALK = 64
THREADS_KEPT = 16

Histories = dict[str, DeltaChannelHistory]


class HistoryMemo:
    """The latest known history per (thread, namespace), bounded to the most recently used threads."""

    def __init__(self, threads: int = THREADS_KEPT) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._latest: OrderedDict[tuple[str, str], tuple[str, Histories]] = OrderedDict()

    def get(self, thread: tuple[str, str], checkpoint_id: str, channels: Sequence[str]) -> Histories | None:
        with self._lock:
            entry = self._latest.get(thread)
        if entry is None or entry[0] != checkpoint_id or any(ch not in entry[1] for ch in channels):
            return None
        return {ch: entry[1][ch] for ch in channels}

    def knows(self, thread: tuple[str, str]) -> bool:
        with self._lock:
            return thread in self._latest

    def put(self, thread: tuple[str, str], checkpoint_id: str, histories: Histories) -> None:
        with self._lock:
            self._latest[thread] = (checkpoint_id, histories)
            self._latest.move_to_end(thread)
            while len(self._latest) > self._threads:
                self._latest.popitem(last=False)


class _Walk:
    """The incremental walk from a target back to a memoized (or seeded) ancestor, one `get_tuple` at a time."""

    def __init__(self, memo: HistoryMemo, config: RunnableConfig, channels: Sequence[str]) -> None:
        conf = config["configurable"]
        self.memo, self.channels = memo, list(channels)
        self.thread = (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")))
        self.target = get_checkpoint_id(config)
        self.worth_walking = bool(self.target and channels and memo.knows(self.thread))  # else a full walk at once
        self.steps: list[CheckpointTuple] = []  # ancestors, newest first; each one's writes made its child

    def config_of(self, checkpoint_id: str) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": self.thread[0],
                "checkpoint_ns": self.thread[1],
                "checkpoint_id": checkpoint_id,
            }
        }

    def parent_of(self, tup: CheckpointTuple) -> str | None:
        return get_checkpoint_id(tup.parent_config) if tup.parent_config else None

    def base(self) -> Histories | None:
        """The history at the oldest walked ancestor, if the walk can stop there: memoized, or every channel
        has a stored value (a snapshot) at some walked ancestor (None: keep walking)."""
        oldest = self.steps[-1]
        known = self.memo.get(self.thread, oldest.config["configurable"]["checkpoint_id"], self.channels)
        if known is not None:
            return known
        if all(self._seeded_at(ch) is not None for ch in self.channels):
            return {ch: {"writes": []} for ch in self.channels}  # unused: every channel restarts at its seed
        return None

    def steps_back(self) -> Generator[RunnableConfig, CheckpointTuple | None, Histories | None]:
        """The walk, written once for the sync and the async saver: yields the config of each checkpoint it needs
        and is sent the saver's tuple for it; returns the histories, or None for the saver's full walk."""
        assert self.target is not None
        current = yield self.config_of(self.target)
        for _ in range(MAX_WALK):
            parent = self.parent_of(current) if current is not None else None
            if parent is None:
                return None
            current = yield self.config_of(parent)
            if current is None:
                return None
            self.steps.append(current)
            base = self.base()
            if base is not None:
                return self.extend(base)
        return None

    def _seeded_at(self, ch: str) -> int | None:
        """Index in `steps` of the newest walked ancestor that stores a value of `ch`."""
        for index, tup in enumerate(self.steps):
            if ch in (tup.checkpoint.get("channel_values") or {}):
                return index
        return None

    def extend(self, base: Histories) -> Histories | None:
        """Per channel: from its newest stored value on the walk (a snapshot taken since the memoized point)
        or else from `base`, plus the writes stored at each ancestor after that, oldest first. None if one
        step's writes to a channel came from more than one task."""
        out: Histories = {}
        for ch in self.channels:
            seeded = self._seeded_at(ch)
            if seeded is None:
                history: DeltaChannelHistory = {"writes": list(base[ch]["writes"])}
                if "seed" in base[ch]:
                    history["seed"] = base[ch]["seed"]
                newer = self.steps
            else:
                history = {"writes": [], "seed": self.steps[seeded].checkpoint["channel_values"][ch]}
                newer = self.steps[: seeded + 1]
            for tup in reversed(newer):
                mine = [w for w in tup.pending_writes or () if w[1] == ch]
                if len({w[0] for w in mine}) > 1:
                    return None
                history["writes"].extend(mine)
            out[ch] = history
        return out


class _MemoOwner:
    """The saver's one memo, made on first use (the savers' own __init__ is LangGraph's)."""

    _history_memo: HistoryMemo

    def _memo(self) -> HistoryMemo:
        if not hasattr(self, "_history_memo"):
            self._history_memo = HistoryMemo()
        return self._history_memo


class MemoizedHistorySync(_MemoOwner):
    """Mixin for a synchronous saver: `get_delta_channel_history` through the memo."""

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        walk = _Walk(self._memo(), config, channels)
        result = self._walk(walk) if walk.worth_walking else None
        if result is None:
            result = dict(super().get_delta_channel_history(config=config, channels=channels))  # type: ignore[misc]
        if walk.target:
            walk.memo.put(walk.thread, walk.target, result)
        return result

    def _walk(self, walk: _Walk) -> Histories | None:
        steps, tup = walk.steps_back(), None
        try:
            while True:  # the first send(None) starts the walk
                tup = self.get_tuple(steps.send(tup))  # type: ignore[attr-defined]
        except StopIteration as done:
            return done.value


class MemoizedHistoryAsync(_MemoOwner):
    """Mixin for an async saver: `aget_delta_channel_history` through the memo."""

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        walk = _Walk(self._memo(), config, channels)
        result = await self._walk(walk) if walk.worth_walking else None
        if result is None:
            full = await super().aget_delta_channel_history(config=config, channels=channels)  # type: ignore[misc]
            result = dict(full)
        if walk.target:
            walk.memo.put(walk.thread, walk.target, result)
        return result

    async def _walk(self, walk: _Walk) -> Histories | None:
        steps, tup = walk.steps_back(), None
        try:
            while True:  # the first send(None) starts the walk
                tup = await self.aget_tuple(steps.send(tup))  # type: ignore[attr-defined]
        except StopIteration as done:
            return done.value
