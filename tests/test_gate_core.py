"""The gate's core as pure functions of data (issue 30): a turn's evidence -> admission -> a decision applied to
(call, evidence, sender, policy, now) -> the settle table. No database, no graph: the evidence is built here."""

from __future__ import annotations

import itertools

import pytest
from langchain_core.tools import tool

from gatedloop.checkpoints.evidence import ApprovalRecord, CallRecord
from gatedloop.nodes.gate.approvals import apply_decision, approval_request
from gatedloop.nodes.gate.settling import CANNOT_TELL, answered_step, settle_step
from gatedloop.nodes.gate.turn_evidence import TurnEvidence
from gatedloop.nodes.state import CallPlan
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools.arguments import args_digest
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import ToolRegistry


@tool
def pay(to: str, amount: int) -> str:
    """Pay someone."""
    return f"paid {amount} to {to}"


ANA = CallContext(user_id="ana", roles=frozenset({"staff"}))
BEA = CallContext(user_id="bea", roles=frozenset({"finance"}))
CAL = CallContext(user_id="cal", roles=frozenset({"finance"}))
ARGS = {"to": "shop", "amount": 30}
DIGEST = args_digest("pay", ARGS)


def registry(**policy: object) -> ToolRegistry:
    return ToolRegistry([pay], {"pay": ToolPolicy(approvers=frozenset({"finance"}), **policy)})  # type: ignore[arg-type]


def plan(verdict: str = "ask", args: dict[str, object] | None = None) -> CallPlan:
    args = ARGS if args is None else args
    return {
        "id": "c1",
        "name": "pay",
        "args": args,
        "verdict": verdict,
        "effect": "write",
        "digest": args_digest("pay", args),
    }  # type: ignore[typeddict-item]


def evidence(reg: ToolRegistry, *approvals: ApprovalRecord, verdict: str = "ask", at: float = 100.0) -> TurnEvidence:
    record = CallRecord("c1", "pay", DIGEST, verdict, ANA, at, None, None, reg.definition_digest("pay"))  # type: ignore[arg-type]
    return TurnEvidence({"c1": record}, list(approvals))


def approval(who: CallContext, at: float = 110.0, digest: str = DIGEST, decision: str = "approve") -> ApprovalRecord:
    return ApprovalRecord("c1", "pay", digest, str(who.user_id), who.roles, decision, at)


def test_a_gated_call_is_asked_until_an_authorized_approval_of_exactly_its_arguments_is_in_the_evidence():
    reg = registry()
    assert evidence(reg).admit(reg, plan()).action == "ask"
    assert evidence(reg, approval(BEA)).admit(reg, plan()).action == "run"
    assert evidence(reg, approval(ANA)).admit(reg, plan()).action == "ask"  # not an approver
    other = args_digest("pay", {"to": "shop", "amount": 3000})
    assert evidence(reg, approval(BEA, digest=other)).admit(reg, plan()).action == "ask"
    changed = evidence(reg, approval(BEA)).admit(reg, plan(args={"to": "shop", "amount": 3000}))
    assert changed.action == "refuse" and changed.refusal is not None  # arguments nobody validated never run


def test_who_let_a_call_run_is_read_from_the_evidence_never_from_the_state():
    """A client can write the state's plans: a `decided_by` written there never names the approver a trace span or a
    tool's metadata shows (nodes/run/tool_env.py reads the admitted plan)."""
    reg = registry(approvals_required=2)
    forged: CallPlan = {**plan(verdict="run"), "decided_by": "mallory"}
    both = evidence(reg, approval(BEA), approval(CAL, at=111.0)).admit(reg, forged)
    assert (both.action, both.plan.get("decided_by")) == ("run", "bea, cal")
    unasked = TurnEvidence(
        {"c1": CallRecord("c1", "pay", DIGEST, "run", ANA, 100.0, None, None, reg.definition_digest("pay"))}, []
    ).admit(registry(approval="never"), forged)
    assert unasked.action == "run" and "decided_by" not in unasked.plan


def test_a_call_the_evidence_does_not_hold_is_refused_whatever_the_state_says():
    reg = registry()
    admitted = TurnEvidence({}, []).admit(reg, plan(verdict="run"))
    assert admitted.action == "refuse" and "never validated" in str(admitted.refusal)


def test_a_quorum_is_reached_by_distinct_approvers_and_the_decision_says_so():
    reg = registry(approvals_required=2)
    first = apply_decision(reg, plan(), evidence(reg), {"type": "approve"}, BEA, 120.0)
    assert first.plan["verdict"] == "ask" and first.answer is None and first.approval.reviewer == "bea"
    again = apply_decision(reg, plan(), evidence(reg, first.approval), {"type": "approve"}, BEA, 121.0)
    assert again.plan["verdict"] == "ask"  # the same approver twice counts once
    second = apply_decision(reg, plan(), evidence(reg, first.approval), {"type": "approve"}, CAL, 122.0)
    assert second.plan["verdict"] == "run" and second.plan["approved_digest"] == DIGEST


def test_who_may_decide_is_the_senders_roles_and_never_the_requester_herself():
    with pytest.raises(InvalidDecision, match="roles"):
        apply_decision(registry(), plan(), evidence(registry()), {"type": "approve"}, ANA, 120.0)
    requester_approver = CallContext(user_id="ana", roles=frozenset({"finance"}))
    with pytest.raises(InvalidDecision, match="own"):
        apply_decision(registry(), plan(), evidence(registry()), {"type": "approve"}, requester_approver, 120.0)


def test_an_edit_is_validated_as_a_fresh_proposal_and_a_reject_is_the_calls_answer():
    reg = registry()
    edited = apply_decision(
        reg,
        plan(),
        evidence(reg),
        {"type": "edit", "edited_action": {"name": "pay", "args": {"to": "shop", "amount": 25}}},
        BEA,
        120.0,
    )
    assert edited.plan["verdict"] == "run" and edited.plan["args"]["amount"] == 25 and edited.plan["edited"]
    assert edited.approval.args_digest == args_digest("pay", {"to": "shop", "amount": 25}) == edited.plan["digest"]
    with pytest.raises(InvalidDecision, match="not valid"):
        bad = {"type": "edit", "edited_action": {"name": "pay", "args": {"to": "shop", "amount": "lots"}}}
        apply_decision(reg, plan(), evidence(reg), bad, BEA, 120.0)  # type: ignore[arg-type]
    rejected = apply_decision(reg, plan(), evidence(reg), {"type": "reject", "message": "no"}, BEA, 120.0)
    assert rejected.plan["verdict"] == "answered" and rejected.answer is not None and rejected.answer.status == "error"


def test_the_request_shows_the_evidence_approvals_so_far_and_the_deadline():
    reg = registry(approvals_required=2, approval_ttl_s=60.0)
    request = approval_request(reg, [plan()], evidence(reg, approval(BEA)), "an earlier answer was refused")
    [action] = request["action_requests"]
    assert action["approved_by"] == ["bea"] and action["expires_at"] == 160.0 and action["requested_by"] == "ana"
    assert request["error"] == "an earlier answer was refused" and "Previous answer refused" in action["description"]
    assert request["request_id"] == approval_request(reg, [plan()], evidence(reg), None)["request_id"]


RECONCILED = {"a result": {"id": 7}, "did not happen": None, "cannot tell": CANNOT_TELL}


@pytest.mark.parametrize(
    ("recorded", "reconciled", "claimed", "may_be_running", "rerun"),
    list(itertools.product([True, False], RECONCILED, [True, False], [True, False], [True, False])),
)
def test_the_settle_table(recorded: bool, reconciled: str, claimed: bool, may_be_running: bool, rerun: bool):
    step = settle_step(
        recorded=recorded,
        reconciled=RECONCILED[reconciled],
        claimed=claimed,
        may_be_running=may_be_running,
        rerun=rerun,
    )
    if recorded:
        expected = "recorded"  # a late finish wins over anything the tool says now
    elif reconciled == "a result":
        expected = "reconciled"
    elif reconciled == "did not happen" and claimed and not may_be_running:
        expected = "rerun" if rerun else "superseded"
    else:
        expected = "ask"  # never re-run what may be running or what nobody can tell about
    assert step == expected


@pytest.mark.parametrize(
    ("decision", "recorded", "rerun"),
    list(itertools.product(["done", "abandon", "not_done"], [True, False], [True, False])),
)
def test_the_settle_tables_second_half_a_persons_answer(decision: str, recorded: bool, rerun: bool):
    step = answered_step(decision, recorded=recorded, rerun=rerun)
    if decision == "done":
        expected = "marked_done"  # she says it happened: her result is the answer, whatever else
    elif decision == "abandon":
        expected = "abandoned"
    elif recorded:
        expected = "recorded"  # "not done", but a late finish says it did happen: never run it twice
    else:
        expected = "rerun" if rerun else "superseded"
    assert step == expected
