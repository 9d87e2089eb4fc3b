"""The `approve` node: one `interrupt()` per run of the node, listing the gated calls, and the reviewer's answer.

Who answers is the sender of the answer, bound to it when it entered the graph (nodes/gate/senders.py; under
LangGraph Server, the authenticated user), never whoever runs the node when LangGraph hands the answer back; checked
against the tool's `approvers`, `self_approval`, `approvals_required` and `approval_ttl_s`. An accepted
decision is recorded in the ledger, outside the state: that record, not anything in the state, is what lets
`execute` run a gated call. A refused answer (malformed or unauthorized) changes nothing but the audit trail: the
node ends and runs again with the same request and an `error`, so every interrupt is answered under the identity
of the call that answered it (a node that looped over several interrupts would replay earlier answers under the
latest caller's identity). Nothing before `interrupt()` has a side effect beyond idempotent ledger writes.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt

from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent, CallRecord
from gatedloop.nodes.gate.admission import (
    admit,
    approvers_so_far,
    audit_refusal,
    edited_ids,
    expired,
    expires_at,
    for_state,
)
from gatedloop.nodes.gate.answers import error_message, record_answers, result_message
from gatedloop.nodes.gate.call_arguments import checked_plan, edited_call
from gatedloop.nodes.gate.hitl import (
    ANONYMOUS,
    REPLACED,
    Decision,
    GatedActionRequest,
    GatedHITLRequest,
    InvalidDecision,
    ReviewConfig,
    approving_text,
    check_addressed,
    check_decisions,
    decider,
    ladder_steps,
)
from gatedloop.nodes.gate.senders import received
from gatedloop.nodes.parts import LoopParts
from gatedloop.nodes.run.notices import queue_approval_notice, queue_decided_notice
from gatedloop.nodes.running_step import current_thread_id
from gatedloop.nodes.state import CallPlan, GatedState, RequestCounters, Verdict
from gatedloop.tools import errors
from gatedloop.tools.arguments import digest, storable_text
from gatedloop.tools.policy import MASK, CallContext
from gatedloop.tools.registry import CheckedCall, describe_tool
from gatedloop.tools.results import responded_result

log = logging.getLogger("gatedloop.approve")

SHOWN_EVENT = "replaced_request_shown"
EXPIRED = "Not run: the approval request expired before a reviewer approved it."


def request_id(gated: list[CallPlan]) -> str:
    """Stable while the same calls with the same arguments are pending; any change makes a new request.
    Each plan's `digest` is the one admission computed from its arguments in this run of the node."""
    return "req-" + digest([[c["id"], c["digest"]] for c in gated])[:12]


def approval_request(
    parts: LoopParts,
    gated: list[CallPlan],
    records: dict[str, CallRecord],
    approvals: list[ApprovalRecord],
    error: str | None,
) -> GatedHITLRequest:
    actions: list[GatedActionRequest] = []
    configs: list[ReviewConfig] = []
    for plan in gated:
        policy = parts.registry.policy(plan["name"])
        record = records[plan["id"]]
        digest_now = plan["digest"]
        approved = approvers_so_far(policy, record, [a for a in approvals if a.call_id == plan["id"]], digest_now)
        shown = policy.masked(plan["args"])
        action: GatedActionRequest = {
            "name": plan["name"],
            "args": shown,
            "description": "",
            "tool_call_id": plan["id"],
            "args_digest": digest_now,
            "requested_by": record.requester.user_id,
            "requested_at": record.requested_at,
            "expires_at": expires_at(policy, record, approvals),
            "approvals_required": policy.approvals_required,
            "approved_by": approved,
            "approvers": sorted(policy.approvers) if policy.approvers is not None else None,
        }
        if policy.review_note:
            action["review_note"] = policy.review_note
        action.update(ladder_steps(policy, record.requested_at))
        preview = _preview(policy, shown, plan["name"])
        if preview:
            action["preview"] = preview
        action["description"] = _description(parts, action, error)
        actions.append(action)
        configs.append({"action_name": plan["name"], "allowed_decisions": list(policy.allowed_decisions)})
        if policy.needs_justification:
            configs[-1]["justification_required"] = list(policy.needs_justification)
    request: GatedHITLRequest = {
        "kind": "approval",
        "request_id": request_id(gated),
        "action_requests": actions,
        "review_configs": configs,
    }
    if error:
        request["error"] = error
    return request


def _description(parts: LoopParts, action: GatedActionRequest, error: str | None) -> str:
    """What a client that shows only `description` (Agent Chat UI) must still tell the reviewer. A refusal is a
    paragraph of its own after the facts: Agent Chat UI renders `description` as Markdown, which runs single lines
    together (the facts read as one paragraph; the refusal must not read as part of its last line)."""
    lines = [
        describe_tool(parts.registry.tools[action["name"]]),
        "",
        f"Tool: {action['name']}",
        "Args: " + json.dumps(action["args"], ensure_ascii=False),
        f"Requested by: {action['requested_by'] or 'unknown'}",
    ]
    if action.get("review_note"):
        lines.append(action["review_note"])
    if action["approvers"] is not None:
        lines.append(f"Approvers: one of the roles {', '.join(action['approvers'])}")
    if "escalates_at" in action:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(action["escalates_at"]))
        lines.append(f"From {when} also: one of the roles {', '.join(action.get('backup_approvers', []))}")
    if action["approvals_required"] > 1:
        done = action["approved_by"]
        lines.append(
            f"Approvals: {len(done)} of {action['approvals_required']}" + (f" ({', '.join(done)})" if done else "")
        )
    if action["expires_at"] is not None:
        lines.append("Expires: " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(action["expires_at"])))
    lines.append("If approved: " + approving_text(action, parts.registry.policy(action["name"]).effect))
    if error:
        lines += ["", f"Previous answer refused: {error}"]
    return "\n".join(lines)


def _preview(policy: Any, shown: dict[str, Any], name: str) -> str | None:
    if policy.preview is None:
        return None
    try:
        return str(policy.preview(shown)).strip()[:300] or None
    except Exception:
        log.warning("the preview of %s raised; the request is shown without it", name, exc_info=True)
        return None


def make_approve_node(parts: LoopParts):
    def approve(state: GatedState) -> dict[str, Any]:
        thread_id = current_thread_id()
        calls = state.get("calls") or []
        gated_ids = [c["id"] for c in calls if c["verdict"] == "ask"]
        records = parts.ledger.calls(thread_id, gated_ids)
        approvals = parts.ledger.approvals(thread_id, gated_ids)
        edited_args = parts.ledger.edited_args(thread_id, edited_ids(calls))
        now = parts.clock()
        plans: dict[str, CallPlan] = {c["id"]: c for c in calls}
        answers: list[ToolMessage] = []
        gated: list[CallPlan] = []
        for call_id in gated_ids:
            plan = plans[call_id]
            admission = admit(parts.registry, plan, records.get(call_id), approvals, edited_args)
            if admission.refusal is not None:  # tampered, never validated, or its tool changed since
                audit_refusal(parts.ledger, thread_id, plan, admission.refusal, parts.registry)
                answers.append(error_message(call_id, plan["name"], admission.refusal))
                plans[call_id] = {**plan, "verdict": "answered"}
            else:
                # Everything else stays in the request, even a call this node's own earlier run already decided
                # (a crash between its ledger writes and its checkpoint): the request a resumed node rebuilds
                # must be the one the pending answer was given to. Re-applying a decision is idempotent.
                gated.append({**admission.plan, "verdict": "ask"} if admission.action != "answered" else admission.plan)
        live = [p for p in gated if not _expired(parts, p, records, now, approvals)]
        if not live:
            for plan in gated:
                plans[plan["id"]] = _expire(parts, thread_id, plan, answers)
            return _update(parts, state, thread_id, list(plans.values()), answers, error=None)
        request = approval_request(parts, gated, records, approvals, state.get("review_error"))
        replaced = _replaced(parts, thread_id, request, records)
        if replaced:
            request["replaced"] = True
        try:
            answer, reviewer, _ = received(interrupt(request))
        except GraphInterrupt:  # the request is put to a person now (on resume `interrupt` returns instead)
            queue_approval_notice(parts, thread_id, request, state["messages"])
            raise
        try:
            if replaced and not _shown_to(parts, thread_id, request, reviewer):
                check_addressed(answer, request)
            decisions = check_decisions(request, answer)
            applied = {
                plan["id"]: _apply(parts, plan, records[plan["id"]], approvals, decisions[plan["id"]], reviewer)
                for plan in gated
            }
        except InvalidDecision as exc:
            _audit_refused(parts, thread_id, request, reviewer, answer, str(exc))
            if str(exc).startswith(REPLACED):  # this sender has now been shown the request that replaced theirs
                parts.ledger.record(thread_id, gated[0]["id"], _shown_event(request, reviewer), {})
            return _update(parts, state, thread_id, list(plans.values()), answers, error=str(exc))
        fresh = [
            applied[p["id"]][2]
            for p in live
            if not any(_same(a, applied[p["id"]][2]) for a in approvals if a.call_id == p["id"])
        ]
        events: list[AuditEvent] = []  # written with the approvals, in one transaction
        for plan in gated:
            if plan not in live:
                plans[plan["id"]] = _expire(parts, thread_id, plan, answers)
                continue
            new_plan, message, approval = applied[plan["id"]]
            plans[plan["id"]] = new_plan
            if message is not None:
                answers.append(message)
            earlier = [a for a in approvals if a.call_id == plan["id"]]
            if approval not in fresh:
                continue  # this reviewer already gave this decision on these arguments: it counts once
            note = decisions[plan["id"]].get("note")
            justification = decisions[plan["id"]].get("justification")
            detail = {
                "request_id": request["request_id"],
                "decision": approval.decision,
                "args": parts.registry.policy(plan["name"]).masked(new_plan["args"]),
                "proposed": parts.registry.policy(plan["name"]).masked(plan["args"]),
                "roles": sorted(approval.roles),
                **({"note": note} if note else {}),
                **({"justification": justification} if justification else {}),
            }
            event = "decision" if not earlier else f"decision:{approval.reviewer}:{approval.args_digest[:8]}"
            events.append(AuditEvent(plan["id"], event, detail, approval.reviewer))
        # An edit's secret values are kept before the approval that lets them run (the state shows them masked).
        parts.ledger.record_edited_args(thread_id, _secret_edits(parts, live, applied))
        parts.ledger.record_approvals(thread_id, fresh, events)  # one transaction: a crash keeps all or none
        decided = [plans[p["id"]] for p in live]
        queue_decided_notice(parts, thread_id, request, reviewer, decided)
        return _update(parts, state, thread_id, list(plans.values()), answers, error=None, decided=request)

    return approve


def _update(
    parts: LoopParts,
    state: GatedState,
    thread_id: str,
    plans: list[CallPlan],
    answers: list[ToolMessage],
    error: str | None,
    decided: GatedHITLRequest | None = None,
) -> dict[str, Any]:
    update: dict[str, Any] = {"calls": [for_state(parts.registry, p) for p in plans], "review_error": error}
    if error is None:
        counters: RequestCounters = {**state["counters"]}
        reviewed = counters.get("reviewed") or []
        if decided is not None and decided["request_id"] not in reviewed:
            counters["reviewed"] = [*reviewed, decided["request_id"]]
        paused_at = counters.get("paused_at")
        if paused_at is not None and not any(p["verdict"] == "ask" for p in plans):
            counters["waited_s"] += max(0.0, parts.clock() - paused_at)
            counters["paused_at"] = None
        update["counters"] = counters
    return {**update, **record_answers(parts.ledger, thread_id, answers, "approve")}


def _secret_edits(
    parts: LoopParts, live: list[CallPlan], applied: dict[str, tuple[CallPlan, ToolMessage | None, ApprovalRecord]]
) -> list[tuple[str, str, dict[str, Any]]]:
    edits = []
    for plan in live:
        new_plan, _, approval = applied[plan["id"]]
        if approval.decision == "edit" and parts.registry.policy(plan["name"]).secret_args:
            edits.append((plan["id"], approval.args_digest, new_plan["args"]))
    return edits


def _expire(parts: LoopParts, thread_id: str, plan: CallPlan, answers: list[ToolMessage]) -> CallPlan:
    """Answer a call nobody approved in time; the model is told."""
    answers.append(error_message(plan["id"], plan["name"], errors.ToolFailure(EXPIRED, error_type="approval_expired")))
    parts.ledger.record(thread_id, plan["id"], "approval_expired", {"tool": plan["name"]})
    return {**plan, "verdict": "answered"}


def _replaced(parts: LoopParts, thread_id: str, request: GatedHITLRequest, records: dict[str, CallRecord]) -> bool:
    """This request replaced one a new message left unanswered (ledger evidence, never the state)."""
    started = min(records[a["tool_call_id"]].requested_at for a in request["action_requests"])
    return parts.ledger.replaced_request(thread_id, started)


def _shown_to(parts: LoopParts, thread_id: str, request: GatedHITLRequest, sender: CallContext) -> bool:
    """Whether this sender was shown the replacing request (their own answer that named nothing was refused with
    it): only then may their answer that names nothing apply to it. Another sender's refusal shows it to nobody
    else, so an answer its sender may not give never changes what someone else's stale answer applies to."""
    event = _shown_event(request, sender)
    return any(row["event"] == event for row in parts.ledger.audit(thread_id))


def _shown_event(request: GatedHITLRequest, sender: CallContext) -> str:
    return f"{SHOWN_EVENT}:{request['request_id']}:{sender.user_id or ANONYMOUS}"


def _expired(
    parts: LoopParts, plan: CallPlan, records: dict[str, CallRecord], now: float, approvals: list[ApprovalRecord]
) -> bool:
    return expired(parts.registry.policy(plan["name"]), records[plan["id"]], now, approvals)


def _same(a: ApprovalRecord, b: ApprovalRecord) -> bool:
    return (a.reviewer, a.decision, a.args_digest) == (b.reviewer, b.decision, b.args_digest)


def _audit_refused(
    parts: LoopParts, thread_id: str, request: GatedHITLRequest, reviewer: CallContext, answer: Any, error: str
) -> None:
    """A refused answer is evidence too: who tried what, and why it was refused (kept once per distinct attempt,
    so a node re-run after a crash does not duplicate it)."""
    first = request["action_requests"][0]["tool_call_id"]
    attempt = digest([request["request_id"], reviewer.user_id, error, storable_text(answer)])[:8]
    parts.ledger.record(
        thread_id,
        first,
        f"answer_refused:{attempt}",
        {"request_id": request["request_id"], "error": error, "roles": sorted(reviewer.roles)},
        actor=reviewer.user_id or ANONYMOUS,
    )


def _apply(
    parts: LoopParts,
    plan: CallPlan,
    record: CallRecord,
    approvals: list[ApprovalRecord],
    decision: Decision,
    reviewer: CallContext,
) -> tuple[CallPlan, ToolMessage | None, ApprovalRecord]:
    """One decision applied to one gated call, after checking that this reviewer may make it; an edit is
    validated again, as the requester, like a fresh proposal."""
    policy = parts.registry.policy(plan["name"])
    now = parts.clock()
    who = decider(
        policy, reviewer, record.requester.user_id, f"{plan['name']} ({plan['id']})", now - record.requested_at
    )
    kind = decision["type"]
    base: CallPlan = {**plan, "decided_by": who, "decision": kind}
    digest_now = plan["digest"]

    def evidence(args_digest_: str) -> ApprovalRecord:
        return ApprovalRecord(plan["id"], plan["name"], args_digest_, who, reviewer.roles, kind, now)

    if kind == "approve":
        approval = evidence(digest_now)
        mine = [a for a in approvals if a.call_id == plan["id"]]
        done = approvers_so_far(policy, record, [*mine, approval], digest_now)
        verdict: Verdict = "run" if len(done) >= policy.approvals_required else "ask"
        return {**base, "verdict": verdict, "approved_digest": digest_now}, None, approval
    if kind == "edit":
        edited_args = _unmasked(decision["edited_action"]["args"], plan["args"], policy.secret_args)
        checked = edited_call(parts.registry, plan["name"], edited_args, record.requester)
        if not isinstance(checked, CheckedCall):
            raise InvalidDecision(f"the edited arguments for {plan['name']} are not valid: {checked.message}")
        edited = checked_plan(base, checked)  # new arguments: their digest, computed once
        verdict = "run" if policy.approvals_required <= 1 else "ask"
        approved: CallPlan = {**edited, "approved_digest": edited["digest"], "edited": True, "verdict": verdict}
        return approved, None, evidence(edited["digest"])
    if kind == "reject":
        reason = decision.get("message") or errors.REJECTED
        message = error_message(plan["id"], plan["name"], errors.ToolFailure(reason, error_type="rejected_by_reviewer"))
        return {**base, "verdict": "answered"}, message, evidence(digest_now)
    body = responded_result(decision.get("message"))
    return {**base, "verdict": "answered"}, result_message(plan["id"], plan["name"], body), evidence(digest_now)


def _unmasked(edited: dict[str, Any], original: dict[str, Any], secret: frozenset[str]) -> dict[str, Any]:
    """A reviewer never sees secret values, so an edit that sends the mask back keeps the original value."""
    return {k: original[k] if k in secret and v == MASK and k in original else v for k, v in edited.items()}
