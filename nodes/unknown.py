"""Writes whose outcome is unknown: ask the authoritative system, and if it cannot tell, ask a person.

Never replayed blindly. `reconcile(args, idempotency_key)` returns the result if the write happened,
None if it did not, and raises if it cannot tell. A person answers `done` (with a result), `not_done`
(run it now) or `abandon` (the loop stops with `needs_attention`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, NotRequired, TypedDict

from gatedloop.checkpoints.ledger import idempotency_key
from gatedloop.graph.state import CallPlan
from gatedloop.nodes.hitl import InvalidDecision
from gatedloop.nodes.parts import LoopParts
from gatedloop.nodes.running import Outcome, _ok

log = logging.getLogger("gatedloop.reconcile")

UNKNOWN_DECISIONS = ("done", "not_done", "abandon")
CANNOT_TELL = object()

Resolution = Literal["done", "not_done", "ask"]


class UnknownCall(TypedDict):
    tool_call_id: str
    name: str
    args: dict[str, Any]
    idempotency_key: str
    reason: str


class UnknownOutcomeRequest(TypedDict):
    kind: Literal["unknown_outcome"]
    calls: list[UnknownCall]
    allowed_decisions: list[str]
    error: NotRequired[str]


def reconcile(parts: LoopParts, thread_id: str, plan: CallPlan) -> Any:
    """The tool's own answer to 'did this write happen?': a result, None, or CANNOT_TELL."""
    policy = parts.registry.policy(plan["name"])
    if policy.reconcile is None:
        return CANNOT_TELL
    try:
        return policy.reconcile(dict(plan["args"]), idempotency_key(thread_id, plan["id"]))
    except Exception:
        log.warning("reconcile for %s (call %s) could not tell", plan["name"], plan["id"], exc_info=True)
        return CANNOT_TELL


def reconciled_outcome(parts: LoopParts, result: Any) -> Outcome:
    return _ok(result, parts.limits.max_result_chars)


def unknown_request(thread_id: str, pending: list[tuple[CallPlan, Outcome]]) -> UnknownOutcomeRequest:
    return {
        "kind": "unknown_outcome",
        "calls": [
            {
                "tool_call_id": plan["id"],
                "name": plan["name"],
                "args": plan["args"],
                "idempotency_key": idempotency_key(thread_id, plan["id"]),
                "reason": str(outcome.get("unknown", "unknown")),
            }
            for plan, outcome in pending
        ],
        "allowed_decisions": list(UNKNOWN_DECISIONS),
    }


def check_unknown_answer(answer: Any, count: int) -> list[dict[str, Any]]:
    if not isinstance(answer, dict) or not isinstance(answer.get("decisions"), list):
        raise InvalidDecision('the answer must be {"decisions": [...]}, one per call of unknown outcome')
    decisions = answer["decisions"]
    if len(decisions) != count:
        raise InvalidDecision(f"expected {count} decision(s), got {len(decisions)}")
    reviewer = answer.get("reviewer")
    checked = []
    for index, decision in enumerate(decisions):
        if not isinstance(decision, dict) or decision.get("type") not in UNKNOWN_DECISIONS:
            raise InvalidDecision(f"decision {index}: type must be one of {list(UNKNOWN_DECISIONS)}")
        if decision["type"] == "done" and "result" not in decision:
            raise InvalidDecision(f'decision {index}: "done" needs the "result" the write produced')
        checked.append({**decision, "reviewer": decision.get("reviewer", reviewer) or "unknown"})
    return checked
