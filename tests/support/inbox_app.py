"""The approval inbox on a SQLite file, for the browser tests: the demo tools, with `reserve_seat` approvable only
by the `events` role (so role filtering shows), plus `pay_invoice`, whose `card` is a secret argument and whose
requests expire after ten minutes, and a support desk's `refund` (decided by `finance`) and `send_email` (by
`support`); served by uvicorn in this process. The demo model gains three scenarios: "Pay invoice INV-1 with card
4111..." (a secret in the user's words, the call and the tool's result), "Reserve seats in WS-101 for Alice and Bob"
(two gated calls in one request) and "Refund order A-1001 and email ana@example.com" (one request that mixes
roles).

    python tests/support/inbox_app.py DB PORT AUTH_JSON      (the token configuration of `gatedloop.graph.auth`)

`app_parts(db)` builds the same tools, policies and graph for the test process that starts the threads.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints import open_sqlite
from gatedloop.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.demo.model import demo_responder
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools.policy import ToolPolicy

EVENTS_ROLE = "events"
PAY_TTL_S = 600.0


@tool
def pay_invoice(invoice_id: str, card: str) -> dict[str, Any]:
    """Pay an invoice with a card."""
    return {"paid": invoice_id, "receipt": f"charged card {card}"}  # echoes its secret, as careless tools do


@tool
def refund(order: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {order}"


@tool
def send_email(to: str, body: str) -> str:
    """Send an email."""
    return f"sent to {to}"


def tools_and_policies(db: str) -> tuple[list[Any], dict[str, Any], DemoStore]:
    store = DemoStore(Path(db).with_name("demo-data.sqlite"))
    policies = demo_policies(store)
    policies["reserve_seat"] = dataclasses.replace(policies["reserve_seat"], approvers=frozenset({EVENTS_ROLE}))
    policies["pay_invoice"] = ToolPolicy(
        effect="write", approval="always", secret_args=frozenset({"card"}), approval_ttl_s=PAY_TTL_S
    )
    policies["refund"] = ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}))
    policies["send_email"] = ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"}))
    return [*build_demo_tools(store), pay_invoice, refund, send_email], policies, store


def responder(messages: list[BaseMessage]) -> AIMessage:
    """The demo model, plus paying an invoice, reserving several seats in one turn, and a refund with its email."""
    question = str(next(m for m in reversed(messages) if isinstance(m, HumanMessage)).content)
    answered = isinstance(messages[-1], ToolMessage)
    words = question.split()
    if question.startswith("Pay invoice"):
        if answered:
            return reply(f"Done: {messages[-1].content}")
        return reply(calls=[call("pay_invoice", {"invoice_id": words[2], "card": words[-1]}, "call_pay")])
    if question.startswith("Reserve seats in"):
        if answered:
            return reply("Reserved what the reviewer allowed.")
        people = question.split(" for ", 1)[1].split(" and ")
        seats = [
            call("reserve_seat", {"event_id": words[3], "participant": p}, f"call_seat_{i}")
            for i, p in enumerate(people)
        ]
        return reply(calls=seats)
    if question.startswith("Refund order"):
        if answered:
            return reply("Refunded and emailed.")
        return reply(
            calls=[
                call("refund", {"order": words[2], "amount": 40}, "call_refund"),
                call("send_email", {"to": words[-1], "body": f"{words[2]} is refunded"}, "call_email"),
            ]
        )
    return demo_responder(messages)


@contextmanager
def app_parts(db: str) -> Iterator[tuple[Any, Any, list[Any], dict[str, Any], DemoStore]]:
    tools, policies, store = tools_and_policies(db)
    with open_sqlite(db) as saver:
        yield (
            build_graph(ScriptedChatModel(responder=responder), tools, policies=policies, checkpointer=saver),
            saver,
            tools,
            policies,
            store,
        )


def main(db: str, port: int, reviewers: str) -> None:
    import uvicorn

    from gatedloop.graph.auth import parse_auth_config
    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox import app as inbox_app
    from gatedloop.inbox.identity import Sessions
    from gatedloop.inbox.pending import PendingRequests

    @contextmanager
    def open_backend() -> Iterator[InboxBackend]:
        with app_parts(db) as (graph, saver, tools, policies, _):
            pending = PendingRequests(graph, saver.ledger, saver.thread_ids, tools, policies)
            yield InboxBackend(graph, saver.ledger, pending)

    # The pages poll for new and answered requests every POLL_MS (2 s in production): the tests wait for those
    # refreshes, so the served pages poll faster; what a refresh shows is the same.
    inbox_app.POLL_MS = int(os.environ.get("GATEDLOOP_TEST_INBOX_POLL_MS", "400"))
    app = create_app(open_backend, Sessions(parse_auth_config(Path(reviewers).read_text(), reviewers)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
