"""Two graphs for `langgraph dev` with gatedloop's auth (tests/test_served_identity.py, issue 29 over the server).

Loaded by the dev server from its file path (`/abs/tests/support/served_identity_app.py:graph` and `:team_graph`).
Every tool records what it did to `effects.jsonl`, and the runtime context it was given to `contexts.jsonl`, in
`SERVED_IDENTITY_DIR`, each row with its thread id: the test reads what really happened from those files, never
from what the server reports. The ledger lives in `GATEDLOOP_DB`, the file the dev-server checkpointer uses.

The scripted model reads the latest user message (call ids are `call_<turn>_<tool>`, `turn` counting user
messages), then reports the first result as "<status>: <content>":

- "pay N to X" -> `pay` (a write a finance reviewer approves);
- "transfer N to X" -> `transfer` (the same, but the bank's reply is lost: the money moves, then the call raises
  `ConnectionError`, so the write's outcome is unknown and a finance reviewer must settle it; no `reconcile`);
- "refund O and tell me" -> `refund`, and once it is answered, `send_email` to the requester (both writes a
  finance reviewer approves, self-approval off);
- "whoami" -> `whoami` (a read, no approval) that records the `runtime.context` it sees.

`graph` uses gatedloop's default context schema (`CallContext`); `team_graph` a dataclass of the user's own
(`TeamContext`: `user_id`, `roles` and `tenant`) and only `whoami`; `weakened_graph` is `graph` with `pay`'s
approvers dropped (anyone but the requester may approve).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

FOLDER_ENV = "SERVED_IDENTITY_DIR"
EFFECTS = "effects.jsonl"
CONTEXTS = "contexts.jsonl"
_LOCK = threading.Lock()


@dataclass
class TeamContext:
    """A user's own context schema: the identity fields gatedloop reads, and one of the team's."""

    user_id: str | None = None
    roles: list[str] = field(default_factory=list)
    tenant: str = "default"


def _append(name: str, record: dict[str, Any]) -> None:
    folder = Path(os.environ[FOLDER_ENV])
    with _LOCK, (folder / name).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, default=str) + "\n")


def _thread_of(runtime: ToolRuntime) -> str:
    return str((runtime.config.get("configurable") or {}).get("thread_id"))


def _seen(context: Any) -> dict[str, Any] | None:
    """The runtime context as JSON: its type and its fields (roles sorted)."""
    if context is None:
        return None
    if dataclasses.is_dataclass(context) and not isinstance(context, type):
        fields = {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    elif isinstance(context, dict):
        fields = dict(context)
    else:
        fields = {"repr": repr(context)}
    if "roles" in fields:
        fields["roles"] = sorted(fields["roles"] or ())
    if "extra" in fields:
        fields["extra"] = dict(fields["extra"])
    return {"type": type(context).__name__, **fields}


def _effect(tool_name: str, args: dict[str, Any], runtime: ToolRuntime) -> None:
    _append(EFFECTS, {"tool": tool_name, "args": args, "thread_id": _thread_of(runtime)})


@tool
def pay(amount: float, to: str, runtime: ToolRuntime) -> dict[str, Any]:
    """Pay an amount to someone (write; a finance reviewer approves)."""
    _effect("pay", {"amount": amount, "to": to}, runtime)
    return {"paid": amount, "to": to}


@tool
def transfer(amount: float, to: str, runtime: ToolRuntime) -> dict[str, Any]:
    """Transfer money to someone (write; a finance reviewer approves)."""
    _effect("transfer", {"amount": amount, "to": to}, runtime)
    raise ConnectionError("the bank closed the connection before it replied")


@tool
def refund(order: str, runtime: ToolRuntime) -> str:
    """Refund an order (write; a finance reviewer approves)."""
    _effect("refund", {"order": order}, runtime)
    return f"refunded {order}"


@tool
def send_email(to: str, runtime: ToolRuntime) -> str:
    """Send an email (write; a finance reviewer approves)."""
    _effect("send_email", {"to": to}, runtime)
    return f"sent to {to}"


@tool
def whoami(runtime: ToolRuntime) -> str:
    """Say who is calling (read): records the runtime context this tool was given."""
    _append(CONTEXTS, {"thread_id": _thread_of(runtime), "context": _seen(runtime.context)})
    return "seen"


FINANCE = ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}))
POLICIES = {
    "pay": FINANCE,
    "transfer": FINANCE,
    "refund": FINANCE,
    "send_email": FINANCE,
    "whoami": ToolPolicy(effect="read", approval="never"),
}


def responder(messages: list[BaseMessage]) -> AIMessage:
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    start = humans[-1]
    turn = len(humans)
    results = [m for m in messages[start + 1 :] if isinstance(m, ToolMessage)]
    words = str(messages[start].content).split()
    if words[0] == "refund" and len(results) == 1 and results[0].status == "success":
        return reply(calls=[call("send_email", {"to": "requester@example.com"}, f"call_{turn}_send_email")])
    if results:
        return reply(f"{results[-1].status}: {results[-1].content}")
    if words[0] in ("pay", "transfer"):  # "pay 5 to bo"
        args = {"amount": float(words[1]), "to": words[3]}
        return reply(calls=[call(words[0], args, f"call_{turn}_{words[0]}")])
    if words[0] == "refund":  # "refund o1 and tell me"
        return reply(calls=[call("refund", {"order": words[1]}, f"call_{turn}_refund")])
    return reply(calls=[call("whoami", {}, f"call_{turn}_whoami")])


def make_graph(name: str, tools: list[Any], policies: dict[str, ToolPolicy] = POLICIES, **kwargs: Any) -> Any:
    Path(os.environ[FOLDER_ENV]).mkdir(parents=True, exist_ok=True)
    return build_graph(
        ScriptedChatModel(responder=responder),
        tools,
        policies={t.name: policies[t.name] for t in tools},
        ledger=SqliteLedger(studio_db_path()),
        name=name,
        **kwargs,
    )


graph = make_graph("served_identity", [pay, transfer, refund, send_email, whoami])
team_graph = make_graph("served_identity_team", [whoami], context_schema=TeamContext)
# `graph` redeployed with pay's approvers dropped: the same name and tools, a weaker rule (finding 6).
weakened_graph = make_graph(
    "served_identity",
    [pay, transfer, refund, send_email, whoami],
    {**POLICIES, "pay": ToolPolicy(effect="write", approval="always")},
)
