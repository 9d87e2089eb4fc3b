"""Extending an approval request's deadline: an approver gives a waiting request its time to live again.

Not an answer: nothing is decided and the request keeps waiting, so it is no interrupt answer either. The extension
is evidence, an approval record of type `extend` written with its audit row in one transaction, and the gate derives
every deadline from the records (`admission.expires_at`): an extension by someone who may not decide the call, or
made after the request had expired, changes no deadline. Each approver extends a request once. The request's outbox
notice is moved to the new deadline (`Outbox.extend_notification`) in the same commit as the evidence, so the
deliverer warns again before it. In a request of several calls a reviewer extends the calls she may extend (per call,
as she decides them: issue 51) and the others keep their deadlines, each with why; only when she may extend none is
the extension refused. The decision (`decide_extension`) reads what it is given and writes nothing;
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


class Extended(NamedTuple):
    """An extension as its reviewer is told it: the new deadline of the calls she extended (`extended`: "name (call
    id)"), and each call that keeps its deadline with why (`kept`)."""

    until: float
    extended: list[str]
    kept: dict[str, str]


class Extension(NamedTuple):
    """What an extension decided: its approval records of type `extend`, their audit rows, what its reviewer is told,
    and the request's last deadline after it (until when its notice stays open)."""

    records: list[ApprovalRecord]
    events: list[AuditEvent]
    told: Extended
    request_until: float


def extend_request(
    ledger: ExtensionLedger,
    policy_of: Callable[[str], ToolPolicy],
    thread_id: str,
    request: Mapping[str, Any],
    reviewer: CallContext,
    now: float,
) -> Extended:
    """Record `reviewer`'s extension of each call of the pending approval `request` she may extend; what she is told.
    Raises InvalidDecision, recording nothing, when she may extend none of them (she may not decide it, it has no
    expiry, it expired, or she extended it before)."""
    ids = [str(a["tool_call_id"]) for a in request.get("action_requests") or []]
    records, approvals = ledger.calls(thread_id, ids), ledger.approvals(thread_id, ids)
    extension = decide_extension(policy_of, records, approvals, request, reviewer, now)
    with ledger.one_commit() as view:
        view.extend_notification(thread_id, str(request.get("request_id")), extension.request_until)
        view.record_approvals(thread_id, extension.records, extension.events)
    return extension.told


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
    extended: dict[str, float] = {}
    kept: dict[str, str] = {}
    deadlines: list[float] = []  # every call's after the extension: the request's notice is open until the last
    for action in request.get("action_requests") or []:
        call_id, name = str(action["tool_call_id"]), str(action["name"])
        where = f"{name} ({call_id})"
        record, policy = records.get(call_id), policy_of(name)
        if record is None:
            kept[where] = "this call was never validated; nothing to extend"
            continue
        deadline = expires_at(policy, record, approvals)
        if deadline is not None:
            deadlines.append(deadline)
        try:
            who = _extender(policy, reviewer, record, where, approvals, deadline, now)
        except InvalidDecision as refused:
            kept[where] = str(refused).removeprefix(f"{where}: ")
            continue
        digest = str(action["args_digest"])
        extension = ApprovalRecord(call_id, name, digest, who, reviewer.roles, EXTEND, now)
        until = expires_at(policy, record, [*approvals, extension])
        assert until is not None and deadline is not None
        deadlines[-1] = until
        extensions.append(extension)
        detail = {"request_id": request.get("request_id"), "until": until, "roles": sorted(reviewer.roles)}
        events.append(AuditEvent(call_id, f"approval_extended:{who}:{digest[:8]}", detail, who))
        extended[where] = until
    if not extended:
        why = "; ".join(f"{where}: {reason}" for where, reason in kept.items())
        raise InvalidDecision(why or "no approval request is waiting; nothing to extend")
    told = Extended(min(extended.values()), list(extended), kept)
    return Extension(extensions, events, told, max(deadlines))


def _extender(
    policy: ToolPolicy,
    reviewer: CallContext,
    record: CallRecord,
    where: str,
    approvals: Sequence[ApprovalRecord],
    deadline: float | None,
    now: float,
) -> str:
    """Who extends this call (the reviewer as its rule counts her), or InvalidDecision saying why she may not."""
    if policy.approval_ttl_s is None or deadline is None:
        raise InvalidDecision(f"{where}: its requests do not expire (no approval_ttl_s); nothing to extend")
    who = decider(policy, reviewer, record.requester.user_id, where, now - record.requested_at)
    if now > deadline:
        raise InvalidDecision(f"{where}: the request expired; an expired request cannot be extended")
    if any(a.call_id == record.call_id and a.reviewer == who and a.decision == EXTEND for a in approvals):
        raise InvalidDecision(f"{where}: {who} extended this request already; another approver may extend it")
    return who
