"""The history check and the model's view, carried from one step of a thread to the next.

Every `model` step (and `finalize`) checks the whole history for foreign answers and open calls and builds the
view the model is shown. Done from scratch, both read every answer's recorded digest from the ledger and walk
every message: a step's cost grew with the thread. Here a thread's last check is kept and, when the history a step
receives starts with the messages checked last time (the same objects, which LangGraph's channels and the savers'
history memo keep between steps, or equal ones), only the messages added since are checked, against the digests
of their calls alone. Anything else (another process's history, a removal, an edit) is checked from scratch.
Nothing a step does walks the whole history in Python: the objects that differ from those checked are found at C
speed (`map(operator.is_not, ...)`), and only they are compared by value and replaced in the view.

A checked answer stays authentic: its recorded digest is never replaced once its message is in a checkpoint
(`EvidenceStore.record_answers`). A history with a foreign answer is never kept, so it is checked afresh, as is
everything after it.
"""

from __future__ import annotations

import itertools
import operator
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage, ToolMessage

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.ledger_for import concrete_ledger
from gatedloop.nodes.gate.answers import HistoryCheck, HistoryScan, model_view


@dataclass
class CheckedHistory:
    """One step's check: what was found, and the calls ever proposed (a new response may not reuse one)."""

    check: HistoryCheck
    proposed: set[str]
    closed_view: list[BaseMessage]  # the model's view of the history up to `tail`
    tail: Sequence[BaseMessage]

    def view(self, answers: Sequence[ToolMessage] = ()) -> list[BaseMessage]:
        """The history as the model must see it, with `answers` (given to calls left open) each after its call."""
        return [*self.closed_view, *model_view([*self.tail, *answers], self.check.foreign)]


@dataclass
class _Kept:
    ledger: Ledger  # the check holds against this ledger's digests only (a served graph may run on several)
    messages: list[BaseMessage]  # exactly the history checked: holding them keeps their identities unique
    scan: HistoryScan
    closed_view: list[BaseMessage] = field(default_factory=list)  # the model view of messages[:viewed]
    viewed: int = 0
    view_at: dict[int, int] = field(default_factory=dict)  # id() of each message in closed_view -> its position

    def extend_view(self, view: Sequence[BaseMessage]) -> None:
        self.view_at.update((id(m), at) for at, m in enumerate(view, start=len(self.closed_view)))
        self.closed_view.extend(view)

    def show(self, replaced: dict[int, BaseMessage]) -> None:
        """The view shows the objects the state holds now: each checked message only equal to its new object (by
        `id()` of the checked one, which `messages` keeps alive until this returns) is replaced where it stands."""
        for old, new in replaced.items():
            at = self.view_at.pop(old, None)
            if at is not None:
                self.closed_view[at] = new
                self.view_at[id(new)] = at


class CheckedHistories:
    """The last check of up to `threads` threads (least recently used dropped), per built graph."""

    def __init__(self, threads: int = 256):
        self._threads = threads
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, ledger: Ledger, thread_id: str, messages: Sequence[BaseMessage]) -> CheckedHistory:
        """The check of the history `messages` a step received."""
        ledger = concrete_ledger(ledger)
        with self._lock:  # taken out while in use: a concurrent step of the same thread checks from scratch
            kept = self._kept.pop(thread_id, None)
        replaced = _extended(messages, kept.messages) if kept is not None and kept.ledger is ledger else None
        if kept is not None and replaced is not None:
            kept.show(replaced)
            added = messages[len(kept.messages) :]
            call_ids = [m.tool_call_id for m in added if isinstance(m, ToolMessage)]
            kept.scan.extend(added, ledger.answer_digests(thread_id, call_ids) if call_ids else {})
            if not kept.scan.foreign:
                return self._keep(thread_id, list(messages), kept)
        scan = HistoryScan()
        scan.extend(messages, ledger.answer_digests(thread_id))
        if scan.foreign:
            return CheckedHistory(scan.result(), set(scan.proposed), [], messages)
        return self._keep(thread_id, list(messages), _Kept(ledger, [], scan))

    def _keep(self, thread_id: str, messages: list[BaseMessage], kept: _Kept) -> CheckedHistory:
        """Keep the check of `messages` (no foreign answer in it) for the thread's next step."""
        scan = kept.scan
        if scan.closed_at > kept.viewed:  # the view of a closed stretch never changes: extend it once
            kept.extend_view(model_view(messages[kept.viewed : scan.closed_at]))
            kept.viewed = scan.closed_at
        kept.messages = messages
        with self._lock:
            self._kept[thread_id] = kept
            while len(self._kept) > self._threads:
                self._kept.popitem(last=False)
        closed_view = list(kept.closed_view)  # a copy: the kept one grows with the thread's next steps
        return CheckedHistory(scan.result(), set(scan.proposed), closed_view, messages[scan.closed_at :])


def _extended(messages: Sequence[BaseMessage], checked: list[BaseMessage]) -> dict[int, BaseMessage] | None:
    """Whether `messages` starts with the `checked` messages, in order: the same objects, or equal ones (a new
    invoke reads the previous invoke's last messages back from the checkpoint as new objects). None if not; else
    the new object for each checked one that is only equal (by `id()` of the checked one)."""
    if len(messages) < len(checked):
        return None
    replaced: dict[int, BaseMessage] = {}
    for at in itertools.compress(itertools.count(), map(operator.is_not, checked, messages)):
        old, new = checked[at], messages[at]
        if old != new:
            return None
        replaced[id(old)] = new
    return replaced
