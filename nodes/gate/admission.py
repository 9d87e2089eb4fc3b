"""Whether a call may run: decided from the registry and the ledger's evidence, never from the graph state.

The state says which calls the turn has and what their arguments are; everything else is derived here: the
tool's effect, whether it needs approval, its schema, roles and validator (checked again on the exact
arguments, as the requester), and whether enough authorized reviewers approved exactly those arguments in time, or
else a standing grant covers them (nodes/gate/grants.py), and what the write is charged against its policy's limits.
A call with no validation record, with arguments nobody validated or approved, or already answered, never runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gatedloop.checkpoints.approval_rounds import SENT_BACK as SENT_BACK_DECISION
from gatedloop.checkpoints.evidence import ApprovalRecord, CallRecord
from gatedloop.checkpoints.grants import Grant
from gatedloop.checkpoints.ledger import Audit, Evidence
from gatedloop.nodes.gate.grants import charges, covering_grants
from gatedloop.nodes.state import CallPlan, Verdict
from gatedloop.tools.arguments import args_digest
from gatedloop.tools.errors import ToolFailure, invalid_arguments
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import CheckedCall, ToolRegistry

NOT_VALIDATED = "Not run: this call was never validated."
ARGS_CHANGED = "Not run: the call's arguments differ from the ones that were validated and approved."
TOOL_CHANGED = (
    "Not run: the definition of {name} (its description, arguments or annotations) changed since this call was "
    "validated and approved; propose the call again to have it checked against the tool as it is now."
)
APPROVING_DECISIONS = ("approve", "edit")
EXTEND = "extend"
"""An approval record that extends a call's deadline (`nodes/gate/extension.py`); it approves nothing."""
SENT_BACK = SENT_BACK_DECISION
"""An approval record that sends a call back to a person when its write could not be claimed on the terms it was
admitted on: the grant that covered it lapsed (reviewer `grant:ID`), or a limit that asks would be gone past
(`limit:KEY`). It approves nothing; approvals before it no longer count (a reviewer who approved did not know of
the limit), and from then on the call needs a person, whatever its policy or grants say. Each begins a new round
of the call's decisions, in which a reviewer who decided before may decide again (checkpoints/approval_rounds.py)."""
LIMIT_SENDER = "limit:"


@dataclass(frozen=True)
class Admission:
    """A call's verdict, decided again from the evidence: `run` (plan has the registry's effect and the exact
    digest), `ask` (needs approvals), `answered` (already answered; do nothing), or `refuse` (answer it now with
    `refusal`, do not run)."""

    action: Verdict | Literal["refuse"]
    plan: CallPlan
    refusal: ToolFailure | None = None


def _refuse(plan: CallPlan, reason: str) -> Admission:
    return Admission("refuse", plan, invalid_arguments(reason))


def admit(
    registry: ToolRegistry,
    plan: CallPlan,
    record: CallRecord | None,
    approvals: Sequence[ApprovalRecord],
    edited_args: Mapping[str, dict[str, Any]],
    grants: Sequence[Grant] = (),
    now: float = 0.0,
    used: tuple[str, str] | None = None,
) -> Admission:
    """`edited_args`: the ledger's latest recorded edit per call id (`Ledger.edited_args`). The record carries the
    tool definition the call was validated against (its pin). `grants`: the open grants of the call's tool at `now`
    (only where a grant may let it run: `execute`); a call they cover runs with them (`plan["grants"]`), to be
    taken with its claim. `used`: the (grant, digest) whose use the call's claim already took: its approval, so a
    write claimed under a grant since used up, revoked or expired is settled, not asked again."""
    name = plan["name"]
    if record is None or record.tool != name or record.verdict not in ("run", "ask") or name not in registry:
        return _refuse(plan, NOT_VALIDATED)
    if record.tool_digest is not None and record.tool_digest != registry.definition_digest(name):
        return Admission("refuse", plan, ToolFailure(TOOL_CHANGED.format(name=name), error_type="tool_changed"))
    args = _actual_args(registry.policy(name), plan, edited_args.get(plan["id"]))
    plan = {**plan, "args": args}
    # Recomputed, never taken from the plan: this is where arguments changed in the state since validation
    # (or approval) are caught.
    digest = args_digest(name, args)
    if record.answer_digest is not None:
        return Admission("answered", {**plan, "digest": digest})
    mine = [a for a in approvals if a.call_id == plan["id"]]
    edited = {a.args_digest for a in mine if a.decision == "edit"}
    if digest != record.args_digest and digest not in edited:
        return _refuse(plan, ARGS_CHANGED)
    if not isinstance(args, dict):  # validated arguments are an object; text in the state is never read here
        return _refuse(plan, ARGS_CHANGED)
    requester = record.requester
    checked = registry.check_call(name, registry.read(name, args), requester)
    if not isinstance(checked, CheckedCall):
        return Admission("refuse", plan, checked)
    policy = registry.policy(name)
    admitted: CallPlan = {**plan, "effect": policy.effect, "digest": digest}
    for carried in ("grants", "charges", "past_limit", "decided_by"):  # decided here, never taken from the state
        admitted.pop(carried, None)  # type: ignore[misc]
    approved = approvers_so_far(policy, record, mine, digest)
    if approved:  # who let it run, as the evidence says (a trace or a tool's metadata names them; never the state)
        admitted["decided_by"] = ", ".join(approved)
    sent_back = [a for a in mine if a.decision == SENT_BACK]
    changed = digest != record.args_digest
    needs = record.verdict == "ask" or changed or bool(sent_back) or policy.needs_approval(args, requester)
    if needs and len(approved) < policy.approvals_required:
        # A grant stands in for reviewers of the call as proposed: never of an edit, never of a call sent back to one.
        proposed = not (changed or plan.get("edited") or sent_back)
        granted = _granted(policy, admitted, requester, grants, now, used) if proposed else None
        if granted is None:
            return Admission("ask", admitted)
        if granted:
            admitted["grants"] = granted
    charged = charges(policy, args, requester)
    if isinstance(charged, str):
        return _refuse(plan, charged)
    if charged:
        admitted["charges"] = charged
        admitted["past_limit"] = any(a.reviewer.startswith(LIMIT_SENDER) for a in sent_back)
    return Admission("run", admitted)


def _granted(
    policy: ToolPolicy,
    plan: CallPlan,
    requester: CallContext,
    grants: Sequence[Grant],
    now: float,
    used: tuple[str, str] | None,
) -> list[str] | None:
    """What approves a call as proposed in its reviewers' place: the grant use its claim already took (`[]`: nothing
    more to take), else the grants that cover it now, for its claim to take a use of; None: nothing does, ask."""
    if used is not None and used[1] == plan["digest"]:
        return []
    return list(covering_grants(grants, policy, plan["name"], plan["args"], requester, now)) or None


def _actual_args(policy: ToolPolicy, plan: CallPlan, stored: dict[str, Any] | None) -> Any:
    """A reviewer's edit of a tool with `secret_args` is in the state masked (`for_state`); its arguments are the
    latest edit the ledger recorded, provided the state still shows that edit. Anything else is the state's, and
    the digest check below decides."""
    if not plan.get("edited") or not policy.secret_args or stored is None:
        return plan["args"]
    return stored if policy.masked(stored) == policy.masked(plan["args"]) else plan["args"]


def edited_ids(plans: Sequence[CallPlan]) -> list[str]:
    """The calls whose arguments a reviewer edited: the only ones whose recorded edit admission may need (no
    query at all on the usual step)."""
    return [p["id"] for p in plans if p.get("edited")]


def for_state(registry: ToolRegistry, plan: CallPlan) -> CallPlan:
    """The plan as the graph state holds it: an edited call of a tool with `secret_args` shows them masked, so a
    reviewer's value never enters the state, its streams or its checkpoints (the ledger keeps it). A call to a
    name that is no tool (answered by `validate`, never edited) has no policy and is returned as it is."""
    if not plan.get("edited") or plan["name"] not in registry or not isinstance(plan.get("args"), dict):
        return plan
    policy = registry.policy(plan["name"])
    if not policy.secret_args:
        return plan
    return {**plan, "args": policy.masked(plan["args"])}


def with_edited_args(registry: ToolRegistry, ledger: Evidence, thread_id: str, plan: CallPlan) -> CallPlan | None:
    """Inside a tool task, whose input LangGraph reports (`tasks`/`debug` streams) and so gets the plan as the
    state holds it (`for_state`): the plan with the arguments it runs with, or None when the ledger holds no edit
    with the plan's digest (never run a masked value)."""
    if for_state(registry, plan) is plan:
        return plan
    stored = ledger.edited_args(thread_id, [plan["id"]]).get(plan["id"])
    if stored is None or args_digest(plan["name"], stored) != plan["digest"]:
        return None
    return {**plan, "args": stored}


def approvers_so_far(
    policy: ToolPolicy, record: CallRecord, approvals: Sequence[ApprovalRecord], digest: str
) -> list[str]:
    """Distinct reviewers who approved (or edited to) exactly `digest`, authorized under the current policy and
    before the request expired. The same reviewer twice counts once; an edit restarts the count, and so does the call
    being sent back to a person (`SENT_BACK`)."""
    counted: list[str] = []
    for approval in approvals:
        if approval.decision == SENT_BACK and approval.call_id == record.call_id:
            counted = []
            continue
        if approval.args_digest != digest or approval.decision not in APPROVING_DECISIONS:
            continue
        reviewer = CallContext(user_id=approval.reviewer, roles=approval.roles)
        if policy.reviewer_refusal(reviewer, record.requester.user_id, approval.at - record.requested_at) is not None:
            continue
        if expired(policy, record, approval.at, approvals):
            continue
        if approval.reviewer not in counted:
            counted.append(approval.reviewer)
    return counted


def expires_at(policy: ToolPolicy, record: CallRecord, approvals: Sequence[ApprovalRecord] = ()) -> float | None:
    """The call's approval deadline: `approval_ttl_s` after it was asked, renewed by each extension (`EXTEND`) an
    authorized reviewer recorded before the deadline then in force (the time to live again, from the extension)."""
    if policy.approval_ttl_s is None:
        return None
    ttl = policy.approval_ttl_s
    extensions = sorted(
        a.at for a in approvals if a.call_id == record.call_id and _authorized_extension(policy, record, a)
    )
    return extended_deadline(record.requested_at + ttl, ttl, extensions)


def extended_deadline(deadline: float, ttl: float, extensions: Sequence[float]) -> float:
    """A deadline renewed by extensions made at these times; one made after the deadline then in force is void."""
    for at in sorted(extensions):
        if at <= deadline:
            deadline = max(deadline, at + ttl)
    return deadline


def shown_deadlines(
    calls: Iterable[tuple[str, float | None, float | None]], approvals: Sequence[ApprovalRecord]
) -> dict[str, float]:
    """Each call's deadline from what its request showed, (call id, requested_at, expires_at) per call, and the
    recorded extensions: for the deliverer and the inbox, which know the request as shown, not its policy (who may
    extend was checked when the extension was recorded; the gate checks again). Calls that never expire are left out."""
    return {
        call_id: extended_deadline(
            until, until - at, [a.at for a in approvals if a.call_id == call_id and a.decision == EXTEND]
        )
        for call_id, at, until in calls
        if at is not None and until is not None
    }


def request_deadline_at(deadlines: Iterable[float], now: float) -> float | None:
    """A request's deadline as shown at `now`: the earliest of its calls' still ahead (a call that expired no longer
    holds the request's time: the others may still be decided), else the latest (it expired); None if none expires."""
    found = sorted(deadlines)
    ahead = [d for d in found if d > now]
    return ahead[0] if ahead else (found[-1] if found else None)


def _authorized_extension(policy: ToolPolicy, record: CallRecord, approval: ApprovalRecord) -> bool:
    if approval.decision != EXTEND:
        return False
    reviewer = CallContext(user_id=approval.reviewer, roles=approval.roles)
    return policy.reviewer_refusal(reviewer, record.requester.user_id, approval.at - record.requested_at) is None


def expired(policy: ToolPolicy, record: CallRecord, now: float, approvals: Sequence[ApprovalRecord] = ()) -> bool:
    deadline = expires_at(policy, record, approvals)
    return deadline is not None and now > deadline


def audit_refusal(ledger: Audit, thread_id: str, plan: CallPlan, refusal: ToolFailure, registry: ToolRegistry) -> None:
    """A refusal worth an operator's attention goes to the audit trail: a tool that changed under a call."""
    if refusal.error_type == "tool_changed":
        now = registry.definition_digest(plan["name"]) if plan["name"] in registry else None
        ledger.record(thread_id, plan["id"], "tool_definition_changed", {"tool": plan["name"], "now": now})
