"""The `approve` node: one `interrupt()` per model turn listing the gated calls, and the reviewer's answer.

This node re-runs from the top when resumed, so nothing before `interrupt()` has a side effect. A
malformed answer is not applied: the same request is asked again with an `error` saying what was wrong
(raising here would leave LangGraph replaying the bad resume value forever), and callers that want an
exception use `gatedloop.graph.resume`, which checks the answer before it reaches the graph.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import interrupt

from gatedloop.graph.state import CallPlan, GatedState, RequestCounters
from gatedloop.nodes.hitl import (
    Decision,
    GatedActionRequest,
    GatedHITLRequest,
    InvalidDecision,
    ReviewConfig,
    check_decisions,
)
from gatedloop.nodes.parts import (
    LoopParts,
    call_context,
    current_thread_id,
    error_message,
    result_message,
    with_messages,
)
from gatedloop.tools import errors
from gatedloop.tools.arguments import args_digest
from gatedloop.tools.policy import CallContext
from gatedloop.tools.registry import CheckedCall, describe_tool

STALE_ARGS = "the pending arguments changed after they were validated; review them again"


def approval_request(parts: LoopParts, gated: list[CallPlan]) -> GatedHITLRequest:
    actions: list[GatedActionRequest] = []
    configs: list[ReviewConfig] = []
    for plan in gated:
        tool = parts.registry.tools[plan["name"]]
        actions.append(
            {
                "name": plan["name"],
                "args": plan["args"],
                "description": f"{describe_tool(tool)}\n\nTool: {plan['name']}\nArgs: "
                + json.dumps(plan["args"], ensure_ascii=False),
                "tool_call_id": plan["id"],
                "args_digest": plan["digest"],
            }
        )
        allowed = [str(d) for d in parts.registry.policy(plan["name"]).allowed_decisions]
        configs.append({"action_name": plan["name"], "allowed_decisions": allowed})
    return {"kind": "approval", "action_requests": actions, "review_configs": configs}


def make_approve_node(parts: LoopParts):
    def approve(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        thread_id = current_thread_id()
        calls = state.get("calls") or []
        gated = [c for c in calls if c["verdict"] == "ask"]
        context = call_context(runtime.context)
        request = approval_request(parts, gated)
        error = STALE_ARGS if any(args_digest(c["name"], c["args"]) != c["digest"] for c in gated) else None
        while True:
            answer = interrupt(request if error is None else {**request, "error": error})
            try:
                if any(args_digest(c["name"], c["args"]) != c["digest"] for c in gated):
                    raise InvalidDecision(STALE_ARGS)
                decisions = check_decisions(answer, request["action_requests"], request["review_configs"])
                decided = {
                    plan["id"]: _apply(parts, plan, d, context) for plan, d in zip(gated, decisions, strict=True)
                }
                break
            except InvalidDecision as exc:
                error = str(exc)
        plans: list[CallPlan] = []
        answers: list[ToolMessage] = []
        for plan in calls:
            if plan["id"] not in decided:
                plans.append(plan)
                continue
            new_plan, message = decided[plan["id"]]
            plans.append(new_plan)
            if message is not None:
                answers.append(message)
            parts.ledger.record(
                thread_id,
                plan["id"],
                "decision",
                {"decision": new_plan.get("decision"), "args": new_plan["args"], "proposed": plan["args"]},
                actor=new_plan.get("decided_by"),
            )
        counters: RequestCounters = {**state["counters"]}
        paused_at = counters.get("paused_at")
        if paused_at is not None:
            counters["waited_s"] += max(0.0, parts.clock() - paused_at)
            counters["paused_at"] = None
        return {"calls": plans, "counters": counters, **with_messages(answers)}

    return approve


def _apply(
    parts: LoopParts, plan: CallPlan, decision: Decision, context: CallContext
) -> tuple[CallPlan, ToolMessage | None]:
    """One decision applied to one gated call; an edit is validated again like a fresh proposal."""
    who = decision.get("reviewer", "unknown")
    base: CallPlan = {**plan, "decided_by": who, "decision": decision["type"]}
    kind = decision["type"]
    if kind == "approve":
        return {**base, "verdict": "run", "approved_digest": plan["digest"]}, None
    if kind == "edit":
        edited_args = decision["edited_action"]["args"]
        checked = parts.registry.check_call(plan["name"], edited_args, context)
        if not isinstance(checked, CheckedCall):
            raise InvalidDecision(f"the edited arguments for {plan['name']} are not valid: {checked.message}")
        digest = args_digest(plan["name"], checked.args)
        edited: CallPlan = {**base, "args": checked.args, "digest": digest, "approved_digest": digest, "edited": True}
        return {**edited, "verdict": "run"}, None
    if kind == "reject":
        reason = decision.get("message") or errors.REJECTED
        return {**base, "verdict": "answered"}, error_message(plan["id"], plan["name"], "rejected_by_reviewer", reason)
    body = json.dumps({"ok": True, "answered_by": "reviewer", "result": decision.get("message")}, ensure_ascii=False)
    return {**base, "verdict": "answered"}, result_message(plan["id"], plan["name"], body)
