"""A person's answer, reported to telemetry (`LoopParts.telemetry`, set only when OpenTelemetry is on:
gatedloop.graph.telemetry): which calls it decided, how, by whom, and how long the question waited.

Beside the notices (nodes/run/notices.py), for the same reason: putting a question to a person and getting the
answer are the gate's moments, which no callback sees. The process that asks keeps its trace context in the
question's notice (`trace`, in the ledger's outbox: never in the graph state, which a client can write), and the
process that gets the answer, maybe another one days later, reads it back (here, and before the run starts:
graph/resumed_trace.py), so the answering run and the answer's span continue the trace that asked: one trace per
turn. Tools, call ids, identities, roles, decisions and times are
reported; arguments never are.
"""

from __future__ import annotations

from collections.abc import Sequence

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.checkpoints.outbox import NotificationKind, notification_id
from gatedloop.nodes.build.parts import AnsweredCall, LoopParts
from gatedloop.nodes.run.notices import unknown_request_id
from gatedloop.nodes.state import CallPlan
from gatedloop.nodes.wire.hitl import ANONYMOUS, GatedActionRequest, GatedHITLRequest, UnknownOutcomeRequest
from gatedloop.tools.policy import CallContext


def report_decisions(
    parts: LoopParts, thread_id: str, request: GatedHITLRequest, reviewer: CallContext, decided: Sequence[CallPlan]
) -> None:
    """The calls of `request` this reviewer's answer decided (`decided`: their plans after it)."""
    telemetry = parts.telemetry
    if telemetry is None or not decided:
        return
    actions = {a["tool_call_id"]: a for a in request["action_requests"]}
    who = reviewer.user_id or ANONYMOUS
    calls = [_answered_call(actions[plan["id"]], plan, who) for plan in decided if plan["id"] in actions]
    asked_in = _asked_in(parts, thread_id, request["request_id"], "request")
    telemetry.answered("approval", request["request_id"], reviewer, calls, asked_in, parts.clock())


def _answered_call(action: GatedActionRequest, plan: CallPlan, who: str) -> AnsweredCall:
    decision = str(plan.get("decision"))
    others = [r for r in action["approved_by"] if r != who]
    approvals = {"approve": len(others) + 1, "edit": 1}.get(decision, len(others))  # an edit starts a new count
    return AnsweredCall(
        call_id=plan["id"],
        tool=plan["name"],
        requester=action["requested_by"],
        asked_at=action["requested_at"],
        approvers=tuple(action["approvers"]) if action["approvers"] is not None else None,
        approvals_required=action["approvals_required"],
        approvals=approvals,
        decision=decision,
        waiting=plan["verdict"] == "ask",
    )


def report_settlement(
    parts: LoopParts,
    thread_id: str,
    request: UnknownOutcomeRequest,
    requester: str | None,
    reviewer: CallContext,
    decision: str,
    asked_at: float,
) -> None:
    """A person's answer (`done`, `not_done`, `abandon`) to the question about a write whose outcome is unknown,
    first asked at `asked_at`."""
    telemetry = parts.telemetry
    if telemetry is None:
        return
    request_id = unknown_request_id(request)
    calls = []
    for asked in request["calls"]:
        approvers = parts.registry.policy(asked["name"]).approvers
        calls.append(
            AnsweredCall(
                call_id=asked["tool_call_id"],
                tool=asked["name"],
                requester=requester,
                asked_at=asked_at,
                approvers=tuple(sorted(approvers)) if approvers is not None else None,
                approvals_required=1,
                approvals=1,
                decision=decision,
                waiting=False,
            )
        )
    asked_in = _asked_in(parts, thread_id, request_id, "unknown")
    telemetry.answered("unknown_outcome", request_id, reviewer, calls, asked_in, parts.clock())


def _asked_in(parts: LoopParts, thread_id: str, request_id: str, kind: NotificationKind) -> dict[str, str] | None:
    return kept_trace(parts.ledger, thread_id, request_id, kind)


def kept_trace(ledger: Ledger, thread_id: str, request_id: str, kind: NotificationKind) -> dict[str, str] | None:
    """The trace context the asking process kept in the question's notice, if telemetry was on there (None for a
    question asked with it off, or by a version that kept none)."""
    notice = ledger.notification(notification_id(thread_id, request_id, kind))
    trace = notice.payload.get("trace") if notice is not None else None
    return {str(k): str(v) for k, v in trace.items()} if isinstance(trace, dict) and trace else None


def report_expiry(parts: LoopParts, thread_id: str, request: GatedHITLRequest, expired: Sequence[CallPlan]) -> None:
    """The calls of `request` that expired before anyone decided them: each one's span ends at its deadline
    (`expires_at`), verdict `expired`, with no decider."""
    telemetry = parts.telemetry
    if telemetry is None or not expired:
        return
    actions = {a["tool_call_id"]: a for a in request["action_requests"]}
    asked_in = _asked_in(parts, thread_id, request["request_id"], "request")
    for plan in expired:
        action = actions.get(plan["id"])
        if action is None:
            continue
        call = _answered_call(action, {**plan, "decision": "expired", "verdict": "answered"}, "")
        deadline = action["expires_at"] if action["expires_at"] is not None else parts.clock()
        telemetry.answered("approval", request["request_id"], None, [call], asked_in, deadline)
