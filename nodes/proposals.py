"""Which calls a model really proposed: recorded by `model` as each response arrives, checked by `validate`.

`validate` reads the turn's calls from the state, which `update_state` (or LangGraph Server's state API) can
write as if it were the `model` node's output; without this record a call no model proposed (say a payment small
enough to need no approval) would be validated and run. Only the `model` node records proposals, so a call in the
state (or in an assistant turn written into the history) that no model response carried is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gatedloop.checkpoints.evidence import Proposal
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.nodes.state import CallPlan
from gatedloop.tools.arguments import args_digest

NOT_PROPOSED = "Not run: no model response proposed this call."
UNREADABLE = "unreadable"


def proposal_digest(name: Any, args: Any) -> str:
    """The plan's tool and arguments as `model` built them. Never raises on model output: arguments that cannot
    be digested (nested too deep, unencodable text) all get one marker, and `validate` refuses them anyway."""
    try:
        return args_digest(str(name), args)
    except (RecursionError, ValueError, TypeError):
        return UNREADABLE


def record_proposals(ledger: Ledger, thread_id: str, plans: Sequence[CallPlan]) -> None:
    if plans:
        ledger.record_proposals(
            thread_id, [Proposal(p["id"], p["name"], proposal_digest(p["name"], p["args"])) for p in plans]
        )


def unproposed(ledger: Ledger, thread_id: str, plans: Sequence[CallPlan]) -> set[str]:
    """Ids of the plans no model response proposed with this tool and these arguments."""
    recorded = ledger.proposals(thread_id, [p["id"] for p in plans])
    return {
        p["id"]
        for p in plans
        if (found := recorded.get(p["id"])) is None
        or (found.tool, found.args_digest) != (p["name"], proposal_digest(p["name"], p["args"]))
    }
