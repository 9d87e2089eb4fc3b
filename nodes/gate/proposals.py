"""Which calls a model really proposed: recorded by `model` as each response arrives, checked by `validate`.

`validate` reads the turn's calls from the state, which `update_state` (or LangGraph Server's state API) can
write as if it were the `model` node's output; without this record a call no model proposed (say a payment small
enough to need no approval) would be validated and run. Only the `model` node records proposals, so a call in the
state (or in an assistant turn written into the history) that no model response carried is refused.

`validate` then registers the turn's calls (`register_turn`): each call's tool, exact-argument digest, requester
and verdict, the evidence `approve` and `execute` admit from. A call id registered before keeps its first record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import ToolMessage

from gatedloop.checkpoints.evidence import AuditEvent, NewCall, Proposal
from gatedloop.checkpoints.ledger import Evidence
from gatedloop.nodes.gate.answers import error_message
from gatedloop.nodes.gate.call_arguments import proposed_digest
from gatedloop.nodes.state import CallPlan
from gatedloop.tools import errors
from gatedloop.tools.policy import CallContext
from gatedloop.tools.registry import ToolRegistry

NOT_PROPOSED = "Not run: no model response proposed this call."
VALIDATED_BEFORE = "Not run: this call id was already validated with other arguments."


def record_proposals(ledger: Evidence, thread_id: str, plans: Sequence[CallPlan]) -> None:
    """Record the plans `model` just built, with the digest it computed as their arguments entered."""
    if plans:
        ledger.record_proposals(thread_id, [Proposal(p["id"], p["name"], p["digest"]) for p in plans])


def unproposed(ledger: Evidence, thread_id: str, plans: Sequence[CallPlan]) -> set[str]:
    """Ids of the plans no model response proposed with this tool and these arguments. Each digest is
    recomputed from the state's plan, never taken from it: this check is where changed arguments are caught."""
    recorded = ledger.proposals(thread_id, [p["id"] for p in plans])
    return {
        p["id"]
        for p in plans
        if (found := recorded.get(p["id"])) is None
        or (found.tool, found.args_digest) != (p["name"], proposed_digest(p))
    }


def register_turn(
    ledger: Evidence,
    registry: ToolRegistry,
    thread_id: str,
    plans: list[CallPlan],
    answers: list[ToolMessage],
    requester: CallContext,
    events: list[AuditEvent],
) -> tuple[list[CallPlan], list[ToolMessage]]:
    """Register the turn's calls (with their audit `events`); an accepted call whose id was registered before with
    other arguments is refused."""
    new = [
        NewCall(p["id"], p["name"], p["digest"], _verdict(p), requester, registry.definition_digest(p["name"]))
        if p["verdict"] != "answered"
        else NewCall(p["id"], p["name"], "", "refused", requester)
        for p in plans
    ]
    records = ledger.register_calls(thread_id, new, events)
    checked: list[CallPlan] = []
    for plan in plans:
        record = records.get(plan["id"])
        clash = record is None or record.tool != plan["name"] or record.args_digest != plan["digest"]
        if plan["verdict"] != "answered" and clash:
            refusal = errors.invalid_arguments(VALIDATED_BEFORE)
            answers.append(error_message(plan["id"], plan["name"], refusal))
            plan = {**plan, "verdict": "answered"}
        checked.append(plan)
    return checked, answers


def _verdict(plan: CallPlan) -> Any:
    return {"run": "run", "ask": "ask"}.get(plan["verdict"], "refused")
