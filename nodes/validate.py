"""The `validate` node: every proposed call is checked before anything runs or anyone is asked.

Per call, in order: the turn's call cap, the whitelist (exact name), the arguments (JSON, schema), roles
and business checks, then the tool-call budgets. A refused call is answered here with a structured
error and never reaches `approve` or `execute`. Nothing here raises on bad model output. A gated call that a live
standing grant covers is routed to run, not asked (`execute` admits it again, and its claim takes the grant's use).

A call no model response proposed (nodes/gate/proposals.py) is refused first. Each call is registered in the ledger
(tool, exact-argument digest, requester, verdict): the evidence `approve` and `execute` check instead of the
state. A call id registered before keeps its first record, so arguments changed in the state and sent through
`validate` again are refused, not re-validated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime

from gatedloop.checkpoints.evidence import AuditEvent
from gatedloop.checkpoints.grants import Grant
from gatedloop.nodes.build.parts import LoopParts, gate_node
from gatedloop.nodes.gate.answers import error_message, record_answers
from gatedloop.nodes.gate.call_arguments import checked_plan, plan_arguments, stored_form
from gatedloop.nodes.gate.grants import covering_grants
from gatedloop.nodes.gate.proposals import NOT_PROPOSED, register_turn, unproposed
from gatedloop.nodes.gate.turn_evidence import grantable_tools, open_grants
from gatedloop.nodes.run.facts import RunFacts
from gatedloop.nodes.state import CallPlan, GatedState, Status, Verdict, changes
from gatedloop.nodes.wire.identity import requester_of
from gatedloop.tools import errors
from gatedloop.tools.policy import CallContext
from gatedloop.tools.registry import CheckedCall

TOO_MANY_IN_TURN = "Not run: one turn may propose at most {limit} calls; propose fewer at a time."


def make_validate_node(parts: LoopParts):
    def validate(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        thread_id = RunFacts.of(runtime).thread_id
        counters = state["counters"]
        context = requester_of(state, runtime.context)
        stop = parts.stop_before_work(thread_id, counters, tokens=False)
        answers: list[ToolMessage] = []
        plans: list[CallPlan] = []
        planned_total = counters["tool_calls"]
        planned_per_tool = dict(counters["per_tool"])
        calls = state.get("calls") or []
        forged = unproposed(parts.ledger, thread_id, calls)
        grants, now = open_grants(parts.ledger, grantable_tools(parts.registry, calls))
        events: list[AuditEvent] = []  # written with the calls' registration, in one transaction
        for index, plan in enumerate(calls):
            refusal = (
                errors.ToolFailure(NOT_PROPOSED, error_type="permission_denied") if plan["id"] in forged else None
            ) or _turn_refusal(parts, plan, index, planned_total, planned_per_tool, stop)
            checked = refusal or parts.registry.check_call(plan["name"], plan_arguments(parts.registry, plan), context)
            if not isinstance(checked, CheckedCall):
                plans.append({**plan, "verdict": "answered"})
                answers.append(error_message(plan["id"], plan["name"], checked))
                detail = {"args": _shown(parts, plan["name"], stored_form(plan)), "error": checked.message}
                events.append(AuditEvent(plan["id"], "refused", detail, context.user_id))
                continue
            planned_total += 1
            planned_per_tool[plan["name"]] = planned_per_tool.get(plan["name"], 0) + 1
            plans.append(_accepted(parts, plan, checked, context, grants, now))
            detail = {
                "tool": plan["name"],
                "args": _shown(parts, plan["name"], checked.args),
                "verdict": plans[-1]["verdict"],
                "repair": checked.repair,
                **({"grants": plans[-1]["grants"]} if "grants" in plans[-1] else {}),
            }
            events.append(AuditEvent(plan["id"], "validated", detail, context.user_id))
        plans, answers = register_turn(parts.ledger, parts.registry, thread_id, plans, answers, context, events)
        update: dict[str, Any] = {"calls": plans, **record_answers(parts.ledger, thread_id, answers, "validate")}
        if any(p["verdict"] == "ask" for p in plans):
            update["counters"] = {**counters, "paused_at": parts.clock()}
        if stop:
            update.update(stop=stop[0], stop_detail=stop[1])
        return changes(state, update)

    return gate_node(parts, validate)


def _shown(parts: LoopParts, name: str, args: Any) -> Any:
    """Arguments as the audit trail may keep them: secret values masked."""
    if name in parts.registry and isinstance(args, dict):
        return parts.registry.policy(name).masked(args)
    return args


def _turn_refusal(
    parts: LoopParts,
    plan: CallPlan,
    index: int,
    planned_total: int,
    planned_per_tool: dict[str, int],
    stop: tuple[Status, str] | None,
) -> errors.ToolFailure | None:
    """Refusals that come from the loop's state rather than from the call itself."""
    if stop:
        return errors.stopped_before_run(*stop)
    limits = parts.limits
    if index >= limits.max_calls_per_turn:
        return errors.ToolFailure(
            TOO_MANY_IN_TURN.format(limit=limits.max_calls_per_turn), error_type="budget_exhausted"
        )
    if planned_total >= limits.max_tool_calls:
        return errors.ToolFailure(errors.BUDGET_EXHAUSTED.format(budget="tool-call"), error_type="budget_exhausted")
    if plan["name"] in parts.registry:
        cap = parts.registry.policy(plan["name"]).max_calls
        if cap is not None and planned_per_tool.get(plan["name"], 0) >= cap:
            budget = f"{plan['name']} call"
            return errors.ToolFailure(errors.BUDGET_EXHAUSTED.format(budget=budget), error_type="budget_exhausted")
    return None


def _accepted(
    parts: LoopParts, plan: CallPlan, checked: CheckedCall, context: CallContext, grants: Sequence[Grant], now: float
) -> CallPlan:
    policy = parts.registry.policy(plan["name"])
    verdict: Verdict = "ask" if policy.needs_approval(checked.args, context) else "run"
    accepted: CallPlan = {**checked_plan(plan, checked), "effect": policy.effect, "verdict": verdict}
    granted = covering_grants(grants, policy, plan["name"], checked.args, context, now) if verdict == "ask" else ()
    return {**accepted, "verdict": "run", "grants": list(granted)} if granted else accepted
