"""How the state's growing fields are stored in checkpoints: `DeltaChannel`s whose snapshots double, and their folds.

A `DeltaChannel` stores each step's write and rebuilds the value by folding the writes since its last snapshot
(`messages` with `fold_messages`, `seen_reads` with `merge_seen`, both declared in nodes/state.py). The fold is
where a long thread's load time goes, so it reuses what it computed for the same history before (`_ByIdentity`).
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Self, cast

from langchain_core.messages import BaseMessage, RemoveMessage, convert_to_messages
from langgraph.channels import DeltaChannel
from langgraph.graph.message import add_messages


class DoublingDeltaChannel(DeltaChannel):
    """A `DeltaChannel` whose snapshot interval grows with its value.

    LangGraph snapshots a `DeltaChannel` every `snapshot_frequency` updates. With a fixed interval the
    snapshots of a growing value cost O(n) bytes per step (a full copy every k steps); here the interval is
    half the value's size (at least `snapshot_frequency`): when each update adds an item, a snapshot is due
    once the value has doubled since the last one. Snapshots then cost O(1) bytes per step amortized (their
    sizes sum to at most twice the value), and a load replays at most half the value's items as writes.
    Hand-written: LangGraph offers only the fixed interval.
    """

    __slots__ = ("min_interval",)

    def __init__(self, reducer: Any, typ: Any = None, *, snapshot_frequency: int = 100) -> None:
        super().__init__(reducer, typ, snapshot_frequency=snapshot_frequency)

    @property
    def snapshot_frequency(self) -> int:
        """Read by LangGraph when it decides whether this step's checkpoint carries a snapshot."""
        size = len(self.value) if self.is_available() else 0
        return max(self.min_interval, size // 2)

    @snapshot_frequency.setter
    def snapshot_frequency(self, value: int) -> None:
        self.min_interval = value

    def copy(self) -> Self:
        new = super().copy()
        new.min_interval = self.min_interval  # the base class passes the grown interval to the constructor
        return new

    def from_checkpoint(self, checkpoint: Any) -> Self:
        new = super().from_checkpoint(checkpoint)
        new.min_interval = self.min_interval
        return new

    def replay_writes(self, writes: Sequence[Any]) -> None:
        super().replay_writes(writes)
        if isinstance(writes, ReplayedWrites) and self.is_available():
            writes.folded = self.value

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DoublingDeltaChannel)
            and self.min_interval == other.min_interval
            and self.reducer == other.reducer
        )


class ReplayedWrites(list[Any]):
    """A history's writes as the history memo (checkpoints/history_memo.py) hands them to LangGraph. The
    `DoublingDeltaChannel` that replays them keeps the value they rebuilt in `folded`, so the memo's next load
    of the thread starts from that value and replays only the writes stored since, not the whole stretch since
    the last snapshot again. A channel's value is never changed in place (the reducers build new ones)."""

    folded: Any = None


def fold_messages(history: list[BaseMessage] | None, writes: Sequence[Any]) -> list[BaseMessage]:
    """DeltaChannel reducer: `add_messages` applied write by write (batching-invariant).

    Messages that arrive without an id get one from their position, so replaying writes from the
    checkpoint rebuilds the same ids every time (add_messages alone would draw fresh uuids). The id ->
    position index of the list being extended is reused from the previous fold (`_ID_INDEXES`), so a
    step that adds one message costs O(1) in index work instead of rebuilding it from the whole history;
    so does a load that replays the steps this process folded on the same index (`_FOLDS`).
    """
    merged: list[BaseMessage] = list(history or [])
    position = _ID_INDEXES.get(history) if history else None
    done = _FOLDS.get(history) if history is not None and len(writes) > REPLAY else None
    if done is not None and len(done[0]) <= len(writes) and all(map(operator.is_, done[0], writes)):
        merged, position = list(done[1]), done[2]  # a load replaying the same stored writes as last time, and more
        todo = writes[len(done[0]) :]
    else:
        todo = writes
    if position is None:
        position = _index(merged)
    for write in todo:
        incoming = _as_messages(write)
        for offset, message in enumerate(incoming):
            if message.id is None:
                message.id = f"msg-{len(merged) + offset}"
        if any(isinstance(m, RemoveMessage) for m in incoming):
            merged = cast(list[BaseMessage], add_messages(cast(Any, merged), cast(Any, incoming)))
            position = _index(merged)
            continue
        for message in incoming:
            at = position.get(message.id)
            if at == len(merged):  # a list sharing the index appended it at this very place (a load replaying a
                merged.append(message)  # step this process made): not in `merged`, or the index would say where
                continue
            if at is not None and not (at < len(merged) and merged[at].id == message.id):
                position = _index(merged)  # shared with a list that grew differently (a fork): rebuild
                at = position.get(message.id)
            if at is not None:
                merged[at] = message
            else:
                position[message.id] = len(merged)
                merged.append(message)
    _ID_INDEXES.put(merged, position)
    if history is not None and len(writes) > REPLAY:
        _FOLDS.put(history, (tuple(writes), merged, position))
    return merged


def _index(messages: list[BaseMessage]) -> dict[str | None, int]:
    return {m.id: i for i, m in enumerate(messages)}


def _as_messages(write: Any) -> list[BaseMessage]:
    """A write as messages. Messages pass through; anything else (`("user", "...")` input) is converted once
    per write object, so replaying the same stored writes again does not build new messages each time."""
    items = write if isinstance(write, list) else [write]
    if all(isinstance(m, BaseMessage) for m in items):
        return items
    converted = _CONVERTED.get(write)
    if converted is None:
        converted = convert_to_messages(items)
        _CONVERTED.put(write, converted)
    return converted


class _ByIdentity:
    """A small LRU map keyed by object identity (the key object is kept alive with its entry, so its id is
    never reused while the entry exists). Bounded, so it never keeps more than a few histories alive.

    Three uses in `fold_messages`: the id -> position index of each recently folded message list (a fold
    extends the index of the list it starts from in place and hands it on to the list it returns; lists
    sharing an index share their prefix, every id any of them holds is in it, and an entry, once added, is
    never changed, so each of them holds an id at its indexed position or not at all: a miss is exact, a hit
    is checked against the list, and a hit just past a list's end is an id it does not hold), the messages
    converted from each non-message write, and the result of the last replay from each snapshot (the write
    objects it folded, the list, its index). Hand-written: LangGraph's DeltaChannel gives the reducer only the
    value, and `add_messages` rebuilds its index and converts every write on every call.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.entries: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, key: Any) -> Any:
        with self.lock:
            entry = self.entries.get(id(key))
        return entry[1] if entry is not None and entry[0] is key else None

    def put(self, key: Any, value: Any) -> None:
        with self.lock:
            self.entries[id(key)] = (key, value)
            self.entries.move_to_end(id(key))
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)


_ID_INDEXES = _ByIdentity(64)
_CONVERTED = _ByIdentity(8192)
_FOLDS = _ByIdentity(64)
REPLAY = 8  # a fold of more writes than this is a load's replay, worth remembering


def merge_seen(seen: dict[str, Any] | None, writes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """DeltaChannel reducer for `seen_reads`: later entries for a read replace earlier ones (batching-invariant)."""
    merged = dict(seen or {})
    for write in writes:
        merged.update(write)
    return merged
