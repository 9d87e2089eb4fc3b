"""An approval request and its answer, as the gate decides them: the request built from the turn's evidence, each
decision applied to (the call, its evidence, the answer's sender, the policy, now) as a pure function, and the
evidence the answer leaves (decisions, refusals, expiries), written here so the `approve` node never touches the
ledger. Who answers is the sender bound to the answer when it entered (nodes/wire/senders.py), never whoever runs the
node when LangGraph hands the answer back.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from langchain_core.messages import ToolMessage

from gatedloop.checkpoints.evidence import ApprovalRecord, AuditEvent
from gatedloop.checkpoints.ledger import Audit, Evidence
from gatedloop.nodes.gate.admission import EXTEND, SENT_BACK, approvers_so_far, expired, expires_at
from gatedloop.nodes.gate.answers import error_message, result_message
from gatedloop.nodes.gate.call_arguments import checked_plan, edited_call
from gatedloop.nodes.gate.turn_evidence import TurnEvidence
from gatedloop.nodes.state import CallPlan, Verdict
from gatedloop.nodes.wire.hitl import (
    ANONYMOUS,
    REPLACED,
    DecidedAction,
    Decision,
    GatedActionRequest,
    GatedHITLRequest,
    InvalidDecision,
    ReviewConfig,
    approving_text,
    decider,
    ladder_steps,
)
from gatedloop.tools import errors
from gatedloop.tools.arguments import digest, storable_text
from gatedloop.tools.blocking import call_blocking
from gatedloop.tools.policy import MASK, CallContext, ToolPolicy
from gatedloop.tools.registry import CheckedCall, ToolRegistry, describe_tool
from gatedloop.tools.results import responded_result

log = logging.getLogger("gatedloop.approve")

SHOWN_EVENT = "replaced_request_shown"
EXPIRED = "Not run: the approval request expired before a reviewer approved it."


class DecisionsLedger(Evidence, Audit, Protocol):
    """What an answer to an approval request leaves: decisions and edits (evidence), refusals and expiries (audit)."""


class Applied(NamedTuple):
    """One decision applied to one call: the call's new plan, its answer if the decision is one (reject, respond),
    and the approval record that is the decision's evidence."""

    plan: CallPlan
    answer: ToolMessage | None
    approval: ApprovalRecord


def request_id(gated: Sequence[CallPlan], rounds: Mapping[str, int] | None = None) -> str:
    """Stable while the same calls with the same arguments are pending; any change makes a new request, and so
    does a call sent back to a person (`rounds`: how many times each was): the request a limit sends back is not the
    one its reviewers approved, and must reach them (its notice) as a new one. Each plan's `digest` is the one
    admission computed from its arguments in this run of the node."""
    rounds = rounds or {}
    keys = [[c["id"], c["digest"], *([rounds[c["id"]]] if rounds.get(c["id"]) else [])] for c in gated]
    return "req-" + digest(keys)[:12]


def approval_request(
    registry: ToolRegistry,
    gated: Sequence[CallPlan],
    evidence: TurnEvidence,
    error: str | None,
    held: Sequence[CallPlan] = (),
    turn: Sequence[CallPlan] = (),
) -> GatedHITLRequest:
    """The request for the gated calls, from their evidence: who asked and when, who approved so far, the
    deadline, what approving does; `error` is why the previous answer was refused. `held` are the request's calls
    an earlier answer decided: shown as decided, and part of the request's id, so the id stays the same while its
    calls are decided one reviewer at a time (`turn`: the turn's calls, for their order)."""
    actions: list[GatedActionRequest] = []
    configs: list[ReviewConfig] = []
    decided = [_decided_action(plan, evidence) for plan in held]
    for plan in gated:
        policy = registry.policy(plan["name"])
        record = evidence.records[plan["id"]]
        digest_now = plan["digest"]
        approved = approvers_so_far(policy, record, evidence.approvals_of(plan["id"]), digest_now)
        shown = policy.masked(plan["args"])
        action: GatedActionRequest = {
            "name": plan["name"],
            "args": shown,
            "description": "",
            "tool_call_id": plan["id"],
            "args_digest": digest_now,
            "requested_by": record.requester.user_id,
            "requested_at": record.requested_at,
            "expires_at": expires_at(policy, record, evidence.approvals),
            "approvals_required": policy.approvals_required,
            "approved_by": approved,
            "approvers": sorted(policy.approvers) if policy.approvers is not None else None,
        }
        if policy.review_note:
            action["review_note"] = policy.review_note
        action.update(ladder_steps(policy, record.requested_at))
        if plan["id"] in evidence.sent_back:
            action["sent_back"] = evidence.sent_back[plan["id"]]
        preview = _preview(policy, shown, plan["name"])
        if preview:
            action["preview"] = preview
        action["description"] = _description(registry, action, error, decided)
        actions.append(action)
        configs.append({"action_name": plan["name"], "allowed_decisions": list(policy.allowed_decisions)})
        if policy.needs_justification:
            configs[-1]["justification_required"] = list(policy.needs_justification)
    members = {p["id"]: p for p in [*gated, *held]}
    in_order = [members[c["id"]] for c in turn if c["id"] in members] if turn else list(members.values())
    rounds = {p["id"]: sum(a.decision == SENT_BACK for a in evidence.approvals_of(p["id"])) for p in in_order}
    request: GatedHITLRequest = {
        "kind": "approval",
        "request_id": request_id(in_order, rounds),
        "action_requests": actions,
        "review_configs": configs,
    }
    if decided:
        request["decided"] = decided
    if error:
        request["error"] = error
    return request


def _decided_action(plan: CallPlan, evidence: TurnEvidence) -> DecidedAction:
    """A held call as the request shows it: its decision and who made it, from the evidence."""
    records = [a for a in evidence.approvals_of(plan["id"]) if a.decision not in (EXTEND, SENT_BACK)]
    kind = records[-1].decision if records else str(plan.get("decision"))
    deciders = list(dict.fromkeys(a.reviewer for a in records if a.decision == kind))
    return {"tool_call_id": plan["id"], "name": plan["name"], "decision": kind, "decided_by": deciders}


def held_until_all_decided(plans: Mapping[str, CallPlan], request: Sequence[CallPlan]) -> dict[str, CallPlan]:
    """A request's calls go on together (invariant 15): while any of them still waits for a decision, the decided
    ones wait too (verdict `ask`, keeping their `decision`, so the next run of `approve` shows them as decided);
    once none waits, each gets the verdict its decision gave it."""
    current = [plans[p["id"]] for p in request]
    if not any(p["verdict"] == "ask" for p in current):
        return {p["id"]: p for p in current}
    return {p["id"]: {**p, "verdict": "ask"} for p in current}


def _description(
    registry: ToolRegistry, action: GatedActionRequest, error: str | None, decided: Sequence[DecidedAction]
) -> str:
    """What a client that shows only `description` (Agent Chat UI) must still tell the reviewer: who may decide
    the call, and the request's calls already decided (no longer among its actions, they run only with this one). A
    refusal is a paragraph of its own after the facts: Agent Chat UI renders `description` as Markdown, which runs
    single lines together (the facts read as one paragraph; the refusal must not read as part of its last line)."""
    lines = [
        describe_tool(registry.tools[action["name"]]),
        "",
        f"Tool: {action['name']}",
        "Args: " + json.dumps(action["args"], ensure_ascii=False),
        f"Requested by: {action['requested_by'] or 'unknown'}",
    ]
    if action.get("review_note"):
        lines.append(action["review_note"])
    if action.get("sent_back"):
        lines.append(f"Sent back to a person: {action['sent_back']}")
    if action["approvers"] is not None:
        lines.append(f"Approvers: one of the roles {', '.join(action['approvers'])}")
    else:
        lines.append("Approvers: any reviewer")
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
    lines.append("If approved: " + approving_text(action, registry.policy(action["name"]).effect))
    if decided:
        held = ", ".join(
            f"{d['name']} ({d['decision']} by {', '.join(d['decided_by']) or 'a reviewer'})" for d in decided
        )
        lines.append(f"Already decided in this request: {held}; nothing of it runs before every call is decided")
    if error:
        lines += ["", f"Previous answer refused: {error}"]
    return "\n".join(lines)


def _preview(policy: ToolPolicy, shown: dict[str, Any], name: str) -> str | None:
    if policy.preview is None:
        return None
    try:
        return str(call_blocking(policy.preview, shown)).strip()[:300] or None
    except Exception:
        log.warning("the preview of %s raised; the request is shown without it", name, exc_info=True)
        return None


def apply_decision(
    registry: ToolRegistry,
    plan: CallPlan,
    evidence: TurnEvidence,
    decision: Decision,
    reviewer: CallContext,
    now: float,
) -> Applied:
    """One decision applied to one gated call, after checking that this reviewer may make it (InvalidDecision
    otherwise); an edit is validated again, as the requester, like a fresh proposal. Pure: nothing is recorded."""
    policy = registry.policy(plan["name"])
    record = evidence.records[plan["id"]]
    who = decider(
        policy, reviewer, record.requester.user_id, f"{plan['name']} ({plan['id']})", now - record.requested_at
    )
    kind = decision["type"]
    base: CallPlan = {**plan, "decided_by": who, "decision": kind}
    digest_now = plan["digest"]

    def evidence_of(args_digest_: str) -> ApprovalRecord:
        return ApprovalRecord(plan["id"], plan["name"], args_digest_, who, reviewer.roles, kind, now)

    if kind == "approve":
        approval = evidence_of(digest_now)
        mine = evidence.approvals_of(plan["id"])
        done = approvers_so_far(policy, record, [*mine, approval], digest_now)
        verdict: Verdict = "run" if len(done) >= policy.approvals_required else "ask"
        return Applied({**base, "verdict": verdict, "approved_digest": digest_now}, None, approval)
    if kind == "edit":
        edited_args = _unmasked(decision["edited_action"]["args"], plan["args"], policy.secret_args)
        checked = edited_call(registry, plan["name"], edited_args, record.requester)
        if not isinstance(checked, CheckedCall):
            raise InvalidDecision(f"the edited arguments for {plan['name']} are not valid: {checked.message}")
        edited = checked_plan(base, checked)  # new arguments: their digest, computed once
        verdict = "run" if policy.approvals_required <= 1 else "ask"
        approved: CallPlan = {**edited, "approved_digest": edited["digest"], "edited": True, "verdict": verdict}
        return Applied(approved, None, evidence_of(edited["digest"]))
    if kind == "reject":
        reason = rejection_reason(decision)
        message = error_message(plan["id"], plan["name"], errors.ToolFailure(reason, error_type="rejected_by_reviewer"))
        return Applied({**base, "verdict": "answered"}, message, evidence_of(digest_now))
    body = responded_result(decision.get("message"))
    answer = result_message(plan["id"], plan["name"], body)
    return Applied({**base, "verdict": "answered"}, answer, evidence_of(digest_now))


def rejection_reason(decision: Decision) -> str:
    """What the model is told of a rejection, and what its audit row keeps as the reason."""
    return decision.get("message") or errors.REJECTED


def _unmasked(edited: dict[str, Any], original: dict[str, Any], secret: frozenset[str]) -> dict[str, Any]:
    """A reviewer never sees secret values, so an edit that sends the mask back keeps the original value."""
    return {k: original[k] if k in secret and v == MASK and k in original else v for k, v in edited.items()}


def expired_call(registry: ToolRegistry, evidence: TurnEvidence, plan: CallPlan, now: float) -> bool:
    """Past the call's approval deadline (extensions included) with no approval that let it run in time."""
    return expired(registry.policy(plan["name"]), evidence.records[plan["id"]], now, evidence.approvals)


def expire(ledger: Audit, thread_id: str, plan: CallPlan) -> tuple[CallPlan, ToolMessage]:
    """A call nobody approved in time: answered (the model is told), and audited."""
    answer = error_message(plan["id"], plan["name"], errors.ToolFailure(EXPIRED, error_type="approval_expired"))
    ledger.record(thread_id, plan["id"], "approval_expired", {"tool": plan["name"]})
    return {**plan, "verdict": "answered"}, answer


def replaced_request(ledger: Evidence, request: GatedHITLRequest, evidence: TurnEvidence, thread_id: str) -> bool:
    """This request replaced one a new message left unanswered (ledger evidence, never the state)."""
    started = min(evidence.records[a["tool_call_id"]].requested_at for a in request["action_requests"])
    return ledger.replaced_request(thread_id, started)


def shown_to(ledger: Audit, thread_id: str, request: GatedHITLRequest, sender: CallContext) -> bool:
    """Whether this sender was shown the replacing request (their own answer that named nothing was refused with
    it): only then may their answer that names nothing apply to it. Another sender's refusal shows it to nobody
    else, so an answer its sender may not give never changes what someone else's stale answer applies to."""
    event = _shown_event(request, sender)
    return any(row["event"] == event for row in ledger.audit(thread_id))


def _shown_event(request: GatedHITLRequest, sender: CallContext) -> str:
    return f"{SHOWN_EVENT}:{request['request_id']}:{sender.user_id or ANONYMOUS}"


def refuse_answer(
    ledger: Audit, thread_id: str, request: GatedHITLRequest, reviewer: CallContext, answer: Any, error: str
) -> None:
    """A refused answer is evidence too: who tried what, and why it was refused (kept once per distinct attempt,
    so a node re-run after a crash does not duplicate it). A refusal that shows its sender the request that
    replaced theirs (`REPLACED`) records that they have now been shown it."""
    first = request["action_requests"][0]["tool_call_id"]
    attempt = digest([request["request_id"], reviewer.user_id, error, storable_text(answer)])[:8]
    ledger.record(
        thread_id,
        first,
        f"answer_refused:{attempt}",
        {"request_id": request["request_id"], "error": error, "roles": sorted(reviewer.roles)},
        actor=reviewer.user_id or ANONYMOUS,
    )
    if error.startswith(REPLACED):
        ledger.record(thread_id, first, _shown_event(request, reviewer), {})


def record_decisions(
    ledger: DecisionsLedger,
    registry: ToolRegistry,
    thread_id: str,
    request: GatedHITLRequest,
    applied: Mapping[str, Applied],
    decisions: Mapping[str, Decision],
    evidence: TurnEvidence,
) -> None:
    """The decisions on the live calls, as evidence: each reviewer's decision on given arguments counts once in a
    round of the call (a repeat is not recorded again; a call sent back to a person since begins a new round, in
    which her decision counts again), with its audit row; an edit's secret values are kept before the approval that
    lets them run (the state shows them masked). The approvals and their audit rows are one transaction: a crash
    keeps all or none."""
    fresh: list[ApprovalRecord] = []
    events: list[AuditEvent] = []
    edits: list[tuple[str, str, dict[str, Any]]] = []
    shown = {a["tool_call_id"]: a["args"] for a in request["action_requests"]}
    for call_id, (new_plan, _, approval) in applied.items():
        policy = registry.policy(new_plan["name"])
        if approval.decision == "edit" and policy.secret_args:
            edits.append((call_id, approval.args_digest, new_plan["args"]))
        earlier = evidence.approvals_of(call_id)
        round_now = sum(a.decision == SENT_BACK for a in earlier)
        if any(_same(a, approval) and a.sent_back_round == round_now for a in earlier):
            continue  # this reviewer already gave this decision on these arguments in this round: it counts once
        fresh.append(approval)
        note = decisions[call_id].get("note")
        justification = decisions[call_id].get("justification")
        reason = rejection_reason(decisions[call_id]) if approval.decision == "reject" else None
        detail = {
            "request_id": request["request_id"],
            "decision": approval.decision,
            "args": policy.masked(new_plan["args"]),
            "proposed": shown[call_id],
            "roles": sorted(approval.roles),
            **({"note": note} if note else {}),
            **({"justification": justification} if justification else {}),
            **({"message": reason} if reason else {}),
        }
        event = "decision" if not earlier else f"decision:{approval.reviewer}:{approval.args_digest[:8]}"
        if round_now:  # a decision of a later round is an audit row of its own too
            event += f":{round_now}"
        events.append(AuditEvent(call_id, event, detail, approval.reviewer))
    ledger.record_edited_args(thread_id, edits)
    ledger.record_approvals(thread_id, fresh, events)


def _same(a: ApprovalRecord, b: ApprovalRecord) -> bool:
    return (a.reviewer, a.decision, a.args_digest) == (b.reviewer, b.decision, b.args_digest)
