"""The newcomer's case of issue 51 as a graph: one turn proposes a refund, decided by `finance`, and an email to the
customer, decided by `support`; each write appends its effect to the list it is given, in the order it runs."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool

from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

POLICIES = {
    "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"})),
    "send_email": ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"})),
}


def desk_graph(saver: Any, effects: list[str], policies: dict[str, ToolPolicy] = POLICIES) -> Any:
    """The desk on `saver`: refund `r1` (order A-1001) and send_email `e1` (to ana), then "done"."""

    @tool
    def refund(order: str, amount: float) -> str:
        """Refund an order."""
        effects.append(f"refund {order}")
        return "refunded"

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        effects.append(f"email {to}")
        return "sent"

    calls = [
        call("refund", {"order": "A-1001", "amount": 40}, "r1"),
        call("send_email", {"to": "ana", "body": "ok"}, "e1"),
    ]
    model = ScriptedChatModel(script=[reply(calls=calls), reply("done")])
    return build_graph(model, [refund, send_email], policies=policies, checkpointer=saver)
