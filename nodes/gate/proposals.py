"""Which calls a model really proposed: recorded by `model` as each response arrives, checked by `validate`.

`validate` reads the turn's calls from the state, which `update_state` (or LangGraph Server's state API) can
write as if it were the `model` node's output; without this record a call no model proposed (say a payment small
enough to need no approval) would be validated and run. Only the `model` node records proposals, so a call in the
state (or in an assistant turn written into the history) that no model response carried is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from gatedloop.checkpoints.evidence import Proposal
from gatedloop.checkpoints.ledger import Evidence
from gatedloop.nodes.gate.call_arguments import proposed_digest
from gatedloop.nodes.state import CallPlan

NOT_PROPOSED = "Not run: no model response proposed this call."


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
