"""A graph for `langgraph dev` with gatedloop's auth (tests/test_server_auth.py): it shows who the graph thinks
is calling, and has one write only finance may request and one payment only finance may approve.

Loaded by the dev server from its file path (`/abs/tests/support/auth_app.py:graph`). The scripted model maps the last
user message to one call with a deterministic id `call_<turn>_<tool>`, then reports the call's answer as
"<status>: <content>":

- "whoami" -> `whoami` (read, no approval); its validator appends the caller it was given (`user_id`, `roles`)
  to `callers.jsonl` in `AUTH_APP_DIR`, so the test sees the identity the graph used;
- "close" -> `close_books` (write, no approval, `roles={"finance"}`: the caller needs finance);
- "pay N" -> `pay` (write, always approved, `approvers={"finance"}`: only finance may decide it);
- "refund N and email" -> `refund` (as `pay`: finance decides it) and `send_email` (`approvers={"support"}`), one
  request that mixes roles.

Each write appends its side effect to `effects.jsonl`. The ledger lives in `GATEDLOOP_DB`, the file the
dev-server checkpointer uses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy

CALLERS = "callers.jsonl"
EFFECTS = "effects.jsonl"


def _append(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def make_tools(folder: Path) -> list[Any]:
    @tool
    def whoami() -> str:
        """Say who is calling (read)."""
        return "seen"

    @tool
    def close_books(period: str) -> dict[str, Any]:
        """Close the books for a period (write; finance only)."""
        _append(folder / EFFECTS, {"tool": "close_books", "period": period})
        return {"closed": period}

    @tool
    def pay(amount: float) -> dict[str, Any]:
        """Pay an amount (write; a finance reviewer approves)."""
        _append(folder / EFFECTS, {"tool": "pay", "amount": amount})
        return {"paid": amount}

    @tool
    def refund(amount: float) -> dict[str, Any]:
        """Refund an amount (write; a finance reviewer approves)."""
        _append(folder / EFFECTS, {"tool": "refund", "amount": amount})
        return {"refunded": amount}

    @tool
    def send_email(body: str) -> dict[str, Any]:
        """Email the customer (write; a support reviewer approves)."""
        _append(folder / EFFECTS, {"tool": "send_email", "body": body})
        return {"sent": body}

    return [whoami, close_books, pay, refund, send_email]


def make_policies(folder: Path) -> dict[str, ToolPolicy]:
    def record_caller(args: dict[str, Any], context: CallContext) -> str | None:
        _append(folder / CALLERS, {"user_id": context.user_id, "roles": sorted(context.roles)})
        return None

    return {
        "whoami": ToolPolicy(effect="read", approval="never", validator=record_caller),
        "close_books": ToolPolicy(effect="write", approval="never", roles=frozenset({"finance"})),
        "pay": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"})),
        "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"})),
        "send_email": ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"})),
    }


def responder(messages: list[BaseMessage]) -> AIMessage:
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    start = humans[-1]
    results = [m for m in messages[start + 1 :] if isinstance(m, ToolMessage)]
    if results:
        return reply(f"{results[0].status}: {results[0].content}")
    words = str(messages[start].content).split()
    turn = len(humans)
    if words[0] == "pay":
        return reply(calls=[call("pay", {"amount": float(words[1])}, f"call_{turn}_pay")])
    if words[0] == "refund":
        refund = call("refund", {"amount": float(words[1])}, f"call_{turn}_refund")
        return reply(calls=[refund, call("send_email", {"body": f"refunded {words[1]}"}, f"call_{turn}_send_email")])
    if words[0] == "close":
        return reply(calls=[call("close_books", {"period": "2026-11"}, f"call_{turn}_close_books")])
    return reply(calls=[call("whoami", {}, f"call_{turn}_whoami")])


def make_graph():
    folder = Path(os.environ["AUTH_APP_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    return build_graph(
        ScriptedChatModel(responder=responder),
        make_tools(folder),
        policies=make_policies(folder),
        ledger=SqliteLedger(studio_db_path()),
        name="auth_app",
    )


graph = make_graph()
