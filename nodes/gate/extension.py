"""Extending an approval request's deadline: an approver gives a waiting request its time to live again.

Not an answer: nothing is decided and the request keeps waiting, so it is no interrupt answer either. The extension
is evidence, an approval record of type `extend` written with its audit row in one transaction, and the gate derives
every deadline from the records (`admission.expires_at`): an extension by someone who may not decide the call, or
made after the request had expired, changes no deadline. Each approver extends a request once. The request's outbox
notice is moved to the new deadline first (`Outbox.extend_notification`), so the deliverer warns again before it; a
crash between the two leaves a notice later than the evidence, which costs nothing (the deliverer judges every
notice by the evidence), never an extension the deliverer does not see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent
from gatedloop.checkpoints.ledger import Evidence, Outbox
from gatedloop.nodes.gate.admission import EXTEND, expires_at
from gatedloop.nodes.gate.hitl import InvalidDecision, decider
from gatedloop.tools.policy import CallContext, ToolPolicy


class ExtensionLedger(Evidence, Outbox, Protocol):
    """What an extension touches: the evidence it records, and the outbox notice whose deadline it moves."""


def extend_request(
    ledger: ExtensionLedger,
    policy_of: Callable[[str], ToolPolicy],
    thread_id: str,
    request: Mapping[str, Any],
    reviewer: CallContext,
    now: float,
) -> float:
    """Record `reviewer`'s extension of every call of the pending approval `request`; the new deadline (the
    earliest of its calls'). Raises InvalidDecision, recording nothing, when she may not decide a call, a call has
    no expiry, the request has expired, or she extended it before."""
    actions = request.get("action_requests") or []
    ids = [str(a["tool_call_id"]) for a in actions]
    records, approvals = ledger.calls(thread_id, ids), ledger.approvals(thread_id, ids)
    extensions: list[ApprovalRecord] = []
    events: list[AuditEvent] = []
    deadlines: list[float] = []
    for action in actions:
        call_id, name = str(action["tool_call_id"]), str(action["name"])
        where = f"{name} ({call_id})"
        record, policy = records.get(call_id), policy_of(name)
        if record is None:
            raise InvalidDecision(f"{where}: this call was never validated; nothing to extend")
        if policy.approval_ttl_s is None:
            raise InvalidDecision(f"{where}: its requests do not expire (no approval_ttl_s); nothing to extend")
        who = decider(policy, reviewer, record.requester.user_id, where, now - record.requested_at)
        deadline = expires_at(policy, record, approvals)
        assert deadline is not None  # the policy has a time to live
        if now > deadline:
            raise InvalidDecision(f"{where}: the request expired; an expired request cannot be extended")
        digest = str(action["args_digest"])
        if any(a.call_id == call_id and a.reviewer == who and a.decision == EXTEND for a in approvals):
            raise InvalidDecision(f"{where}: {who} extended this request already; another approver may extend it")
        extension = ApprovalRecord(call_id, name, digest, who, reviewer.roles, EXTEND, now)
        until = expires_at(policy, record, [*approvals, extension])
        assert until is not None
        extensions.append(extension)
        detail = {"request_id": request.get("request_id"), "until": until, "roles": sorted(reviewer.roles)}
        events.append(AuditEvent(call_id, f"approval_extended:{who}:{digest[:8]}", detail, who))
        deadlines.append(until)
    if not extensions:
        raise InvalidDecision("no approval request is waiting; nothing to extend")
    ledger.extend_notification(thread_id, str(request.get("request_id")), min(deadlines))
    ledger.record_approvals(thread_id, extensions, events)
    return min(deadlines)
