"""What the gate did with each call of a clicked request, for the Slack message that reports the click.

A button says what a reviewer asked for, not what happened: an approval that came after the deadline counts for
nothing, a first approval of a quorum runs nothing, a rejection ends the call. So the message is read from the
gate's own record, after the answer was applied: the call's decisions and an expiry (the audit trail), the approvals
counted as the gate counts them (`approvers_so_far` under the tool's policy, the deadline by `expires_at`), and the
write's outcome in the execution ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gatedloop.checkpoints.evidence import ApprovalRecord, CallRecord
from gatedloop.checkpoints.ledger import Ledger, LedgerEntry
from gatedloop.graph.display import DECISION_WORDS, audit_text, day_and_clock
from gatedloop.graph.pending import DecidedCall, PendingCall
from gatedloop.nodes.gate.admission import APPROVING_DECISIONS, approvers_so_far, expires_at
from gatedloop.tools.policy import ToolPolicy

EXPIRED_EVENT = "approval_expired"


@dataclass(frozen=True)
class CallOutcome:
    """One call after a click: what the gate did, in words; `too_late`: how its deadline passed before the answer
    (which the gate then did not count), None if it did not."""

    name: str
    call_id: str
    text: str
    too_late: str | None = None

    def line(self) -> str:
        return f"{self.name} ({self.call_id}): {self.text}"


@dataclass(frozen=True)
class _Record:
    """One call's part of the gate's record."""

    call: CallRecord
    events: list[dict[str, Any]]
    approvals: list[ApprovalRecord]
    entry: LedgerEntry | None


def call_outcomes(
    ledger: Ledger, policy: Callable[[str], ToolPolicy], thread_id: str, calls: Sequence[PendingCall | DecidedCall]
) -> list[CallOutcome]:
    """Each call's outcome as the ledger records it now (read once per click). `calls`: every call of the request,
    those still asked and those an earlier answer decided (held for the others), so the message tells each."""
    ids = [c.tool_call_id for c in calls]
    records = ledger.calls(thread_id, ids)
    audit = ledger.audit(thread_id)
    approvals = ledger.approvals(thread_id, ids)
    outcomes = []
    for call in calls:
        record = records.get(call.tool_call_id)
        if record is None:
            outcomes.append(CallOutcome(call.name, call.tool_call_id, "the ledger has no record of it"))
            continue
        found = _Record(
            record,
            [e for e in audit if e["call_id"] == call.tool_call_id],
            [a for a in approvals if a.call_id == call.tool_call_id],
            ledger.get(thread_id, call.tool_call_id),
        )
        outcomes.append(_outcome(call, found, policy(call.name)))
    return outcomes


def too_late_notice(outcome: CallOutcome) -> str:
    """What the reviewer whose click came after the deadline is told, privately."""
    return (
        f"Too late: {outcome.name} ({outcome.call_id}): {outcome.too_late} before your answer came; your answer was"
        " not counted and nothing ran."
    )


def _outcome(call: PendingCall | DecidedCall, found: _Record, policy: ToolPolicy) -> CallOutcome:
    def said(text: str, too_late: str | None = None) -> CallOutcome:
        return CallOutcome(call.name, call.tool_call_id, text, too_late)

    if any(e["event"] == EXPIRED_EVENT for e in found.events):
        deadline = expires_at(policy, found.call, found.approvals)
        closed = f"its approval window closed at {day_and_clock(deadline)}" if deadline else "its request expired"
        return said(f"too late: {closed}, nothing ran", too_late=closed)
    decisions = [e for e in found.events if e["event"] == "decision" or e["event"].startswith("decision:")]
    if not decisions and isinstance(call, PendingCall):  # still asked: its own reviewers have not decided it
        return said(f"waiting for {call.deciders()}")
    if not decisions:
        return said("no decision is recorded for it")
    detail = decisions[-1].get("detail") or {}
    kind = str(detail.get("decision"))
    words = DECISION_WORDS.get(kind, kind)
    if kind not in APPROVING_DECISIONS:
        reason = f" (“{detail['message']}”)" if detail.get("message") else ""
        return said(f"{words} by {decisions[-1].get('actor')}{reason}, not run")
    return said(_approved(words, found, policy, decisions[-1]))


def _approved(words: str, found: _Record, policy: ToolPolicy, decision: dict[str, Any]) -> str:
    """An approved call: ran (and how it ended), waiting for more approvals, or answered without running."""
    approving = [a.args_digest for a in found.approvals if a.decision in APPROVING_DECISIONS]
    digest = found.entry.args_digest if found.entry is not None else (approving or [found.call.args_digest])[-1]
    counted = approvers_so_far(policy, found.call, found.approvals, digest)
    by = f" (approved by {', '.join(counted)})"
    executed = [e.get("detail") or {} for e in found.events if e["event"] == "executed"]
    if found.entry is not None or executed:
        return _ran(words, found.entry, executed[-1] if executed else {}, by)
    missing = policy.approvals_required - len(counted)
    if missing > 0:
        more = f"{missing} more approval" + ("s" if missing > 1 else "")
        so_far = f"so far: {', '.join(counted) or 'none'}; {policy.approvals_required} needed"
        return f"{words}, waiting for {more} ({so_far})"
    after = found.events.index(decision) + 1
    why = [i for i in range(after, len(found.events)) if not found.events[i]["event"].startswith("decision")]
    if found.call.answer_digest is not None and why:
        return f"{words}{by}, not run: {audit_text(found.events[why[-1]], found.events[: why[-1]])}"
    return f"{words}{by}, not run yet"


def _ran(words: str, entry: LedgerEntry | None, executed: dict[str, Any], by: str) -> str:
    """How the call the approval let run ended: a write by its execution ledger entry, a read (never claimed) by
    its `executed` audit row."""
    state = entry.state if entry is not None else ("done" if executed.get("outcome") == "ok" else "failed")
    if state == "done":
        return f"{words} and ran{by}"
    if state == "failed":
        error = executed.get("error_type")
        return f"{words} and ran{by}, but it failed" + (f" ({error})" if error else "")
    if state == "abandoned":
        return f"{words} and started{by}, its outcome never known (abandoned)"
    return f"{words} and started{by}, its outcome not known yet"
