"""Before the model is asked anything: no foreign answer, no open call (invariants 1 and 9).

A client may send a `ToolMessage` as input (Agent Chat UI answers a pending call "Successfully handled tool
call." before posting a new message), and `update_state` can write one: such answers are removed, never taken
as a call's result. A call still open when a new message arrives is answered here: one that never started is
`superseded` (not run); a write that finished is answered with its recorded outcome; a write that was claimed
when its process died is settled (reconcile, else a person), and never run now. The model then sees each
assistant turn followed directly by its answers. This happens before any stop is weighed: a stop never answers a
started write "not run". The time a person took to settle one is `ClosedHistory.waited_s`, not work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage, ToolMessage

from gatedloop.checkpoints.evidence import SUPERSEDED_SOURCE, Answer
from gatedloop.checkpoints.ledger import Claims, Evidence, Ledger, LedgerEntry
from gatedloop.nodes.gate.answers import (
    OpenCall,
    answer_digest,
    error_message,
    record_answers,
    tool_message,
)
from gatedloop.nodes.gate.checked_histories import CheckedHistories
from gatedloop.nodes.gate.outcomes import UnknownReason, stored_outcome, unknown
from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors

log = logging.getLogger("gatedloop.model")


@dataclass
class ClosedHistory:
    """The `messages` update that closes the history, and the history as the model must see it."""

    update: list[BaseMessage] = field(default_factory=list)
    view: list[BaseMessage] = field(default_factory=list)
    proposed: set[str] = field(default_factory=set)
    """Every call id the thread has seen: a new response may not reuse one."""
    left_open: bool = False
    waited_s: float = 0.0


def close_open_calls(
    histories: CheckedHistories,
    ledger: Ledger,
    settle_task: Any,
    thread_id: str,
    messages: Sequence[BaseMessage],
) -> ClosedHistory:
    """`settle_task` settles a write whose process died (nodes/run/unknown.py: `make_settle_task`). The whole
    `Ledger`, as the history check takes it: a served graph's `LedgerOfTheRun` resolves to the run's ledger there."""
    checked = histories.check(ledger, thread_id, messages)
    foreign = checked.check.foreign
    if foreign and not ledger.answer_digests(thread_id) and _adopt(ledger, thread_id, foreign):
        checked = histories.check(ledger, thread_id, messages)
    check = checked.check
    for message in check.foreign:
        log.warning(
            "thread %s: removed an answer to call %s that gatedloop did not give", thread_id, message.tool_call_id
        )
        detail = {"content_chars": len(str(message.content)), "message_id": message.id}
        ledger.record(thread_id, message.tool_call_id, f"foreign_answer_removed:{answer_digest(message)[:8]}", detail)
    answers: list[ToolMessage] = []
    left_open = False
    waited_s = 0.0
    for call in check.open_calls:
        answer, settled = _close(ledger, settle_task, thread_id, call)
        answers.append(answer)
        left_open = left_open or bool(settled.get("left_open"))
        waited_s += settled.get("waited_s", 0.0)
    removals: list[BaseMessage] = [RemoveMessage(id=m.id) for m in check.foreign if m.id]
    update = [*removals, *record_answers(ledger, thread_id, answers, SUPERSEDED_SOURCE).get("messages", [])]
    return ClosedHistory(update, checked.view(answers), checked.proposed, left_open, waited_s)


def _adopt(ledger: Evidence, thread_id: str, foreign: Sequence[ToolMessage]) -> bool:
    """A thread from before answers were recorded: its existing answers are adopted once (trust on first use),
    unless the ledger already knows any of their calls."""
    if ledger.calls(thread_id, [m.tool_call_id for m in foreign]):
        return False
    first: dict[str, ToolMessage] = {}
    for message in foreign:
        first.setdefault(message.tool_call_id, message)
    ledger.record_answers(
        thread_id, [Answer(m.tool_call_id, m.name or "", answer_digest(m), "adopted") for m in first.values()]
    )
    return True


def recorded_answer(entry: LedgerEntry | None, call: OpenCall) -> ToolMessage | None:
    """A call left open whose write finished (`model` and `finalize` both close such calls): its recorded outcome,
    reused, never run again. None when the ledger has no finished outcome for it."""
    if entry is None or entry.state == "claimed":
        return None
    outcome = stored_outcome(entry.state, entry.result)
    return tool_message(call.id, call.name, outcome["status"], outcome["content"])


def _close(ledger: Ledger, settle_task: Any, thread_id: str, call: OpenCall) -> tuple[ToolMessage, dict[str, Any]]:
    """The call's answer, and the settle task's result for a write whose outcome was unknown (else empty)."""
    entry = ledger.get(thread_id, call.id)
    if entry is None:
        ledger.record(thread_id, call.id, "superseded", {"how": "never started"})
        return error_message(call.id, call.name, errors.ToolFailure(errors.SUPERSEDED, error_type="superseded")), {}
    recorded = recorded_answer(entry, call)
    if recorded is not None:
        return recorded, {}
    plan: CallPlan = {
        "id": call.id,
        "name": call.name,
        "args": call.args if isinstance(call.args, dict) else {},
        "verdict": "run",
        "effect": "write",
        "digest": entry.args_digest,
    }
    settled = settle_task(thread_id, plan, unknown("claimant_died", entry.attempts), False).result()
    outcome = settled["outcome"]
    return tool_message(call.id, call.name, outcome["status"], outcome["content"]), settled


def leftover_answers(
    claims: Claims, thread_id: str, open_calls: Sequence[OpenCall], status: str, detail: str | None
) -> tuple[list[ToolMessage], bool]:
    """`finalize`'s last line for invariant 1: an answer for each call still open as the request ends with
    `status`, and whether one of them is a write that started and never finished (its outcome unknown: finalize
    asks nobody, so the request then needs attention). A finished write gets its recorded outcome; a call that
    never started, "not run" with the stop's reason."""
    answers: list[ToolMessage] = []
    started_unknown = False
    for call in open_calls:
        entry = claims.get(thread_id, call.id)
        recorded = recorded_answer(entry, call)
        if recorded is not None:
            answers.append(recorded)
        elif entry is not None:  # claimed: it started, and nobody knows whether it happened
            why: UnknownReason = "claimant_running" if claims.claimant_alive(entry.claimant) else "claimant_died"
            answers.append(tool_message(call.id, call.name, "unknown", unknown(why, entry.attempts)["content"]))
            started_unknown = True
        else:
            answers.append(error_message(call.id, call.name, errors.stopped_before_run(status, detail or status)))
    return answers, started_unknown
