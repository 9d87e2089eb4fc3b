"""Extending an approval request's deadline: an approver gives a waiting request its time to live again.

Not an answer: nothing is decided and the request keeps waiting, so it is no interrupt answer either. The extension
is evidence, an approval record of type `extend` written with its audit row in one transaction, and the gate derives
every deadline from the records (`admission.expires_at`): an extension by someone who may not decide the call, or
made after the request had expired, changes no deadline. Each approver extends a request once. The request's outbox
notice is moved to the new deadline (`Outbox.extend_notification`) in the same commit as the evidence, so the
deliverer warns again before it. The decision (`decide_extension`) reads what it is given and writes nothing;
`extend_request` reads, decides, then writes it all in one commit (issue 52).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent, CallRecord
from gatedloop.checkpoints.ledger import Evidence, Outbox
from gatedloop.nodes.gate.admission import EXTEND, expires_at
from gatedloop.nodes.wire.hitl import InvalidDecision, decider
from gatedloop.tools.policy import CallContext, ToolPolicy


class ExtensionLedger(Evidence, Outbox, Protocol):
    """What an extension touches: the evidence it records, and the outbox notice whose deadline it moves."""

    def one_commit(self) -> AbstractContextManager[ExtensionLedger]: ...


class Extension(NamedTuple):
    """What an extension decided: its approval records of type `extend`, their audit rows, the new deadline."""

    records: list[ApprovalRecord]
    events: list[AuditEvent]
    until: float


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
    ids = [str(a["tool_call_id"]) for a in request.get("action_requests") or []]
    records, approvals = ledger.calls(thread_id, ids), ledger.approvals(thread_id, ids)
    extension = decide_extension(policy_of, records, approvals, request, reviewer, now)
    with ledger.one_commit() as view:
        view.extend_notification(thread_id, str(request.get("request_id")), extension.until)
        view.record_approvals(thread_id, extension.records, extension.events)
    return extension.until


def decide_extension(
    policy_of: Callable[[str], ToolPolicy],
    records: Mapping[str, CallRecord],
    approvals: Sequence[ApprovalRecord],
    request: Mapping[str, Any],
    reviewer: CallContext,
    now: float,
) -> Extension:
    """The extension `reviewer` makes of `request`, from its calls' `records` and `approvals` (pure)."""
    extensions: list[ApprovalRecord] = []
    events: list[AuditEvent] = []
    deadlines: list[float] = []
    for action in request.get("action_requests") or []:
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
    return Extension(extensions, events, min(deadlines))
