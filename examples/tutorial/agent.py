"""The tutorial's agent (docs/tutorial.md): a shop assistant that can look an order up and refund it.

`lookup_order` only reads; `refund` moves money, so a person approves it, and only someone in `finance`. The model
is scripted (offline, no API key); `GATEDLOOP_MODEL=openai:gpt-4.1-mini` or any other `provider:model` uses a real
one (`gatedloop.graph.models.load_model`).
"""

from __future__ import annotations

import os

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.graph import ToolPolicy, build_graph
from gatedloop.graph.models import load_model
from gatedloop.graph.scripted import ScriptedChatModel, call, reply

ORDERS = {"A-1001": {"status": "delivered", "paid": 42.0}}
REFUNDS: list[dict[str, object]] = []


@tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up by its id."""
    return ORDERS.get(order_id, {"error": "no such order"})


@tool
def refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an amount of an order to the customer's card."""
    REFUNDS.append({"order_id": order_id, "amount": amount})
    return {"refunded": amount, "order_id": order_id}


POLICIES = {
    "lookup_order": ToolPolicy(effect="read", approval="never"),
    "refund": ToolPolicy(
        effect="write",
        approval="always",
        approvers={"finance"},
        preview=lambda args: f"refunds {args['amount']:.2f} EUR on order {args['order_id']}",
    ),
}


def scripted(messages: list[BaseMessage]) -> AIMessage:
    """Look the order up, refund what was paid, then say what happened."""
    last = messages[-1]
    if isinstance(last, HumanMessage):
        return reply(calls=[call("lookup_order", {"order_id": "A-1001"}, f"look-{len(messages)}")])
    if isinstance(last, ToolMessage) and last.name == "lookup_order":
        return reply(calls=[call("refund", {"order_id": "A-1001", "amount": 42.0}, f"refund-{len(messages)}")])
    return reply(f"Done: {last.content}")


def make_graph(checkpointer=None):
    """The graph; with no checkpointer, as `langgraph.json` and Aegra want it (the server brings its own)."""
    name = os.environ.get("GATEDLOOP_MODEL")
    model = load_model(name) if name and name != "demo" else ScriptedChatModel(responder=scripted)
    return build_graph(model, [lookup_order, refund], policies=POLICIES, checkpointer=checkpointer, name="shop")


graph = make_graph()
"""For `langgraph dev` / Aegra: `"graphs": {"shop": "./agent.py:graph"}`."""
