"""Notices for reviewers: the notification outbox rows (checkpoints/outbox.py) for the requests a person must answer,
and for what became of them.

Two kinds ask, each queued when its `interrupt()` really puts the request to a person (it raises
`GraphInterrupt`; on resume it returns the answer, and nothing is written): `request` for an approval request
(nodes/approve.py) and `unknown` for a question about a write whose outcome is unknown (nodes/run/unknown.py).
Either is queued with its later steps where the tool's policy sets them (the expiry ladder): `reminder` and
`escalated`, due at their time, with the asking notice's payload (the escalation adds the backup roles).
Two close the loop: `decided` for each reviewer's accepted answer (who decided what; queued after the decision is
recorded, so a crash in between queues it on the node's re-run), and `finished` when a request a reviewer decided
ends (its status and what ran, from `finalize`).
Each row is one `INSERT ... ON CONFLICT DO NOTHING` keyed by (thread, request id, kind): a request asked again after
a refused answer writes nothing new. It is committed before the interrupt is
checkpointed; a crash in between re-runs the asking code, which builds the same request. Arguments are the
request's own, with `secret_args` masked; an approval request's notice also carries the thread's title as the
inbox's card shows it (`thread_title`, redacted of the thread's secrets), and each call whether its tool's policy
lets a reviewer grant its calls ahead of time (`grantable`: Slack's "Approve + grant"). With telemetry on, a
notice that asks keeps the asking run's trace context (`trace`, W3C `traceparent`; nodes/run/observed.py reads it
back when the answer comes). Nothing here touches the network: a deliverer (`gatedloop notify`) sends the rows.
The one change to a row is an approver's extension, which moves a `request` row's deadline (nodes/gate/extension.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage

from gatedloop.checkpoints.outbox import NotificationKind
from gatedloop.nodes.build.parts import LoopParts, Question
from gatedloop.nodes.state import CallPlan
from gatedloop.nodes.wire.hitl import (
    ANONYMOUS,
    GatedHITLRequest,
    LadderSteps,
    UnknownOutcomeRequest,
    approving_text,
)
from gatedloop.nodes.wire.masking import Redactor, thread_redactor, thread_title
from gatedloop.tools.policy import GATED_WRITE, CallContext

UNKNOWN_PREFIX = "unknown:"


def queue_approval_notice(
    parts: LoopParts, thread_id: str, request: GatedHITLRequest, messages: Sequence[BaseMessage]
) -> None:
    """Queued by `approve` rather than with the calls' registration in `validate`: the request id is computed
    there, and that node also makes requests `validate` never saw (an edit that needs more approvals, a call dropped
    at admission), so the notice names exactly the request a reviewer is shown. It carries the thread's `title`
    from its `messages`, as the inbox's card shows it (`thread_title`, redacted of the thread's secrets). Its body's
    `expires_at` is the first deadline a reviewer faces (its calls' earliest); its row stays open until the last
    (`open_until`): a call that expired leaves the others to decide, and their reminders to send."""
    actions = request["action_requests"]
    deadlines = [a["expires_at"] for a in actions if a["expires_at"] is not None]
    expires = min(deadlines) if deadlines else None
    open_until = max(deadlines) if deadlines else None
    payload = {
        "request_id": request["request_id"],
        "thread_id": thread_id,
        "requested_by": actions[0]["requested_by"],
        "requested_at": min(a["requested_at"] for a in actions),
        "expires_at": expires,
        "title": thread_title(messages, _secrets_of(parts, messages)),
        "actions": [
            {
                "tool": a["name"],
                "tool_call_id": a["tool_call_id"],
                "args": a["args"],
                "args_digest": a["args_digest"],
                "approvals_required": a["approvals_required"],
                "approvers": a["approvers"],
                "expires_at": a["expires_at"],
                "requested_at": a["requested_at"],
                "note": a.get("review_note"),
                "approving": approving_text(a, parts.registry.policy(a["name"]).effect),
                "grantable": parts.registry.policy(a["name"]).grantable,
            }
            for a in actions
        ],
    }
    _queue_question(parts, thread_id, "approval", payload, [a["name"] for a in actions], open_until)
    _queue_ladder(parts, thread_id, request["request_id"], actions, payload, open_until)


def _queue_question(
    parts: LoopParts,
    thread_id: str,
    question: Question,
    payload: dict[str, Any],
    tools: Sequence[str],
    open_until: float | None,
) -> None:
    """The notice that asks (`request` or `unknown`). With telemetry on, it keeps the asking run's trace context
    (`trace`: where the answer's span is put, whichever process answers), and a question asked for the first time
    is counted (a request asked again after a refused answer is the same row)."""
    telemetry = parts.telemetry
    if telemetry is not None:
        payload["trace"] = telemetry.trace_context()
    kind: NotificationKind = "request" if question == "approval" else "unknown"
    new = parts.ledger.record_notification(
        thread_id, payload["request_id"], kind, payload, created_at=parts.clock(), expires_at=open_until
    )
    if new and telemetry is not None:
        telemetry.asked(question, tools)


def _queue_ladder(
    parts: LoopParts,
    thread_id: str,
    request_id: str,
    steps: Sequence[LadderSteps],
    payload: dict[str, Any],
    expires: float | None,
) -> None:
    """The request's later steps, queued with it and due at their time (the deliverer sends a row once it is due,
    and skips it if the request was decided, or the question settled, by then): a reminder, and the escalation to
    the backup approvers. `steps`: each call's, as the request carries them (`ladder_steps`)."""
    reminders = [s["remind_at"] for s in steps if "remind_at" in s]
    if reminders:
        parts.ledger.record_notification(
            thread_id, request_id, "reminder", payload, created_at=min(reminders), expires_at=expires
        )
    escalations = [s for s in steps if "escalates_at" in s]
    if escalations:
        backup = sorted({role for s in escalations for role in s.get("backup_approvers", [])})
        parts.ledger.record_notification(
            thread_id,
            request_id,
            "escalated",
            {**payload, "backup_approvers": backup},
            created_at=min(s["escalates_at"] for s in escalations),
            expires_at=expires,
        )


def unknown_request_id(request: UnknownOutcomeRequest) -> str:
    """The question's name in the outbox: the calls it asks about (the wire format has no request id, and its
    interrupt id is LangGraph's, known only once the interrupt is raised)."""
    return UNKNOWN_PREFIX + ",".join(c["tool_call_id"] for c in request["calls"])


def queue_unknown_notice(
    parts: LoopParts, thread_id: str, request: UnknownOutcomeRequest, requested_by: str | None, asked_at: float
) -> None:
    """Queued by the settle task when it puts its question to a person (never on the common path: a write whose
    outcome is known, or reconciled, asks nobody). `requested_by` is the call's requester from the ledger's record,
    `asked_at` the task's first question. No expiry: the question waits for a person however long it takes; its
    reminder and escalation (`LadderSteps` of its calls, counted from `asked_at`) are queued with it, as an
    approval request's are."""
    request_id = unknown_request_id(request)
    payload = {
        "request_id": request_id,
        "thread_id": thread_id,
        "requested_by": requested_by,
        "requested_at": asked_at,
        "expires_at": None,
        "actions": [
            {
                "tool": c["name"],
                "tool_call_id": c["tool_call_id"],
                "args": c["args"],
                "idempotency_key": c["idempotency_key"],
                "reason": c["reason"],
            }
            for c in request["calls"]
        ],
    }
    _queue_question(parts, thread_id, "unknown_outcome", payload, [c["name"] for c in request["calls"]], None)
    _queue_ladder(parts, thread_id, request_id, request["calls"], payload, None)


def queue_decided_notice(
    parts: LoopParts, thread_id: str, request: GatedHITLRequest, reviewer: CallContext, decided: Sequence[CallPlan]
) -> None:
    """One per reviewer per request: what she decided for each call (arguments as they will run, masked), and
    whether the request still waits (a quorum, or a call left to decide), with the calls no one has decided yet
    and who may decide them (`waiting_for`: a request that mixes roles is decided one reviewer at a time)."""
    who = reviewer.user_id or ANONYMOUS
    answered = {plan["id"] for plan in decided}
    payload = {
        "request_id": request["request_id"],
        "thread_id": thread_id,
        "requested_by": request["action_requests"][0]["requested_by"],
        "decided_by": who,
        "decided_at": parts.clock(),
        "waiting": any(plan["verdict"] == "ask" for plan in decided),
        "waiting_for": [
            {"tool": a["name"], "tool_call_id": a["tool_call_id"], "approvers": a["approvers"]}
            for a in request["action_requests"]
            if a["tool_call_id"] not in answered
        ],
        "actions": [
            {
                "tool": plan["name"],
                "tool_call_id": plan["id"],
                "decision": plan.get("decision"),
                "args": parts.registry.policy(plan["name"]).masked(plan["args"]),
            }
            for plan in decided
        ],
    }
    parts.ledger.record_notification(
        thread_id, request["request_id"], "decided", payload, created_at=parts.clock(), expires_at=None, part=who
    )


def queue_finished_notice(
    parts: LoopParts, thread_id: str, reviewed: Sequence[str], status: str, detail: str | None, messages: Sequence[Any]
) -> None:
    """When a request that a reviewer decided ends: its status and each tool answer of the request (tool, call,
    whether it succeeded), so whoever approved hears what then happened. Named by the last request decided."""
    payload = {
        "request_id": reviewed[-1],
        "request_ids": list(reviewed),
        "thread_id": thread_id,
        "status": status,
        "detail": detail,
        "ran": [{"tool": m.name, "tool_call_id": m.tool_call_id, "status": m.status} for m in _answers(messages)],
    }
    parts.ledger.record_notification(
        thread_id, reviewed[-1], "finished", payload, created_at=parts.clock(), expires_at=None
    )


def _answers(messages: Sequence[BaseMessage]) -> list[ToolMessage]:
    """The tool answers since the request's message, read back from the end (a long thread is not walked)."""
    answers: list[ToolMessage] = []
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, ToolMessage):
            answers.append(message)
    return answers[::-1]


def _secrets_of(parts: LoopParts, messages: Sequence[BaseMessage]) -> Redactor:
    """The thread's secrets, to redact the notice's title; none to look for (no walk of the thread) when no tool
    of the graph has `secret_args` (a tool unknown to it is a GATED_WRITE, which has none either)."""
    if not any(policy.secret_args for policy in parts.registry.policies.values()):
        return Redactor([])
    return thread_redactor(messages, lambda name: parts.registry.policies.get(name, GATED_WRITE))
