"""The `approve` node: one `interrupt()` per run of the node, listing the gated calls, and the reviewer's answer.

The node reads the state, asks the gate and returns the update: the turn is admitted from its evidence
(nodes/gate/turn_evidence.py), the request built and each decision applied by the gate (nodes/gate/approvals.py),
whose rules are the tool's `approvers`, `self_approval`, `approvals_required` and `approval_ttl_s`, judged for the
answer's sender (bound to it when it entered the graph: nodes/wire/senders.py; under LangGraph Server, the
authenticated user), never whoever runs the node when LangGraph hands the answer back. An accepted decision is
recorded in the ledger, outside the state: that record, not anything in the state, is what lets `execute` run a
gated call. A refused answer (malformed or unauthorized) changes nothing but the audit trail: the node ends and
runs again with the same request and an `error`, so every interrupt is answered under the identity of the call
that answered it (a node that looped over several interrupts would replay earlier answers under the latest
caller's identity). Nothing before `interrupt()` has a side effect beyond idempotent ledger writes.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from gatedloop.nodes.build.parts import LoopParts, gate_node
from gatedloop.nodes.gate.admission import for_state
from gatedloop.nodes.gate.answers import record_answers
from gatedloop.nodes.gate.approvals import (
    Applied,
    apply_decision,
    approval_request,
    expire,
    expired_call,
    held_until_all_decided,
    record_decisions,
    refuse_answer,
    replaced_request,
    shown_to,
)
from gatedloop.nodes.gate.turn_evidence import admit_turn
from gatedloop.nodes.run.facts import RunFacts
from gatedloop.nodes.run.notices import queue_approval_notice, queue_decided_notice
from gatedloop.nodes.run.observed import report_decisions, report_expiry
from gatedloop.nodes.state import CallPlan, GatedState, RequestCounters, changes
from gatedloop.nodes.wire.hitl import GatedHITLRequest, InvalidDecision, check_addressed, check_decisions
from gatedloop.nodes.wire.senders import received


def make_approve_node(parts: LoopParts):
    registry = parts.registry

    def approve(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        thread_id = RunFacts.of(runtime).thread_id
        calls = state.get("calls") or []
        turn = admit_turn(registry, parts.ledger, thread_id, calls, "ask")
        evidence = turn.evidence
        now = parts.clock()
        plans: dict[str, CallPlan] = {c["id"]: c for c in calls}
        answers: list[ToolMessage] = list(turn.refused)
        gated: list[CallPlan] = []
        held: list[CallPlan] = []
        for plan, admission in turn.admissions:
            if admission is None:
                continue
            if admission.refusal is not None:  # tampered, never validated, or its tool changed since
                plans[plan["id"]] = {**plan, "verdict": "answered"}
            elif admission.action != "ask" and "decision" in plan:
                # Decided by an earlier answer (the state says so and the evidence agrees): held, no longer
                # answerable, until every call of the request is decided (invariant 15).
                held.append({**admission.plan, "verdict": "run" if admission.action == "run" else "answered"})
            else:
                # Everything else stays in the request, even a call this node's own earlier run already decided
                # (a crash between its ledger writes and its checkpoint): the request a resumed node rebuilds
                # must be the one the pending answer was given to. Re-applying a decision is idempotent.
                gated.append({**admission.plan, "verdict": "ask"} if admission.action != "answered" else admission.plan)
        request = approval_request(registry, gated, evidence, state.get("review_error"), held, calls)
        live = [p for p in gated if not expired_call(registry, evidence, p, now)]
        if not live:
            with parts.one_commit() as expiring:
                for plan in gated:
                    plans[plan["id"]] = _expired(expiring, thread_id, plan, answers)
                plans.update({p["id"]: p for p in held})
                report_expiry(expiring, thread_id, request, gated)
                return _update(expiring, state, thread_id, list(plans.values()), answers, error=None)
        replaced = replaced_request(parts.ledger, request, evidence, thread_id)
        if replaced:
            request["replaced"] = True
        try:
            answer, reviewer, _ = received(interrupt(request))
        except GraphInterrupt:  # the request is put to a person now (on resume `interrupt` returns instead)
            with parts.one_commit() as asking:  # its notice and the later steps' (the ladder): one commit
                queue_approval_notice(asking, thread_id, request, state["messages"])
            raise
        with parts.one_commit() as answering:  # the answer's evidence, audit rows and notice: one commit
            try:
                if replaced and not shown_to(answering.ledger, thread_id, request, reviewer):
                    check_addressed(answer, request)
                decisions = check_decisions(request, answer)
                applied: dict[str, Applied] = {
                    plan["id"]: apply_decision(
                        registry, plan, evidence, decisions[plan["id"]], reviewer, answering.clock()
                    )
                    for plan in gated
                    if plan["id"] in decisions
                }
            except InvalidDecision as exc:
                refuse_answer(answering.ledger, thread_id, request, reviewer, answer, str(exc))
                return _update(answering, state, thread_id, list(plans.values()), answers, error=str(exc))
            for plan in gated:
                if plan not in live:
                    plans[plan["id"]] = _expired(answering, thread_id, plan, answers)
                elif plan["id"] in applied:
                    new_plan, answer_now, _ = applied[plan["id"]]
                    plans[plan["id"]] = new_plan
                    if answer_now is not None:
                        answers.append(answer_now)
                else:
                    plans[plan["id"]] = plan  # not named by this answer: still waits for its own reviewers
            plans.update({p["id"]: p for p in held})  # their verdicts from the evidence, not the state's hold
            plans.update(held_until_all_decided(plans, [*live, *held]))
            live_decisions = {p["id"]: applied[p["id"]] for p in live if p["id"] in applied}
            record_decisions(answering.ledger, registry, thread_id, request, live_decisions, decisions, evidence)
            decided = [plans[p["id"]] for p in live if p["id"] in applied]
            queue_decided_notice(answering, thread_id, request, reviewer, decided)
            report_decisions(answering, thread_id, request, reviewer, decided)
            report_expiry(answering, thread_id, request, [p for p in gated if p not in live])
            return _update(answering, state, thread_id, list(plans.values()), answers, error=None, decided=request)

    return gate_node(parts, approve)


def _expired(parts: LoopParts, thread_id: str, plan: CallPlan, answers: list[ToolMessage]) -> CallPlan:
    answered, answer = expire(parts.ledger, thread_id, plan)
    answers.append(answer)
    return answered


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
    return changes(state, {**update, **record_answers(parts.ledger, thread_id, answers, "approve")})
