"""A payments app for the gate's tests: `pay` is a gated write with a validator, an approval predicate and
`approvers`; every real payment lands as a row in `effects.sqlite` (a real file), so a test can check that
nothing ran without a matching recorded approval."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolArg, tool
from sample_app import Effects

from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

CAP = 1000
SEEN: list[list[BaseMessage]] = []
"""Every conversation the scripted model was sent, in order (what the model really saw)."""


def make_tools(effects: Effects) -> list[BaseTool]:
    @tool
    def pay(amount: float, to: str, idempotency_key: Annotated[str | None, InjectedToolArg] = None) -> dict[str, Any]:
        """Pay an amount to someone (write). (The key is optional, as in many real clients: nothing but the
        gate stops a second run.)"""
        row = effects.add("pay", {"amount": amount, "to": to}, idempotency_key)
        return {"payment": row, "amount": amount, "to": to}

    @tool
    def balance(account: str) -> dict[str, Any]:
        """Read an account's balance (read)."""
        effects.add("balance", {"account": account}, None)
        return {"account": account, "balance": 42}

    return [pay, balance]


def under_cap(args: dict[str, Any], context: Any) -> str | None:
    if args["to"] == "mallory":
        return "mallory is not an allowed payee"
    return f"payments above {CAP} are not allowed" if args["amount"] > CAP else None


def pay_policy(effects: Effects, **overrides: Any) -> ToolPolicy:
    fields: dict[str, Any] = {
        "effect": "write",
        "approval": lambda args, ctx: args["amount"] > 100,
        "validator": under_cap,
        "reconcile": lambda args, key: effects.find(key),
    }
    return ToolPolicy(**{**fields, **overrides})


def responder(messages: list[BaseMessage]) -> AIMessage:
    """'pay 999 to bo as big, 1 to cy as small' -> one turn with those calls (ids from the words after 'as');
    'balance X' -> a read; after the answers, a summary of their statuses."""
    SEEN.append(list(messages))
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    request = str(messages[humans[-1]].content)
    answers = [m for m in messages[humans[-1] + 1 :] if isinstance(m, ToolMessage)]
    if answers or request.startswith("hello"):
        return reply("done: " + "; ".join(f"{m.tool_call_id}={m.status}" for m in answers))
    if request.startswith("balance "):
        return reply(calls=[call("balance", {"account": request.split()[1]}, f"r{len(humans)}")])
    planned = []
    for part in request.removeprefix("pay ").split(","):
        words = part.split()
        planned.append(call("pay", {"amount": float(words[0]), "to": words[2]}, words[4]))
    return reply(calls=planned)


def build(
    saver: Any,
    effects: Effects,
    *,
    ledger: Any = None,
    context_schema: Any = None,
    middleware: Any = (),
    tracer_provider: Any = None,
    **policy_overrides: Any,
) -> Any:
    """`saver`: a checkpointer from `open_sqlite` (its ledger is used), or None with `ledger=` (under
    `langgraph dev`, which supplies the checkpointer; see tests/support/gate_server_app.py). `middleware`: a
    LangChain middleware list (tests/test_middleware.py). `tracer_provider`: OpenTelemetry's, for spans
    (tests/test_gate_forgery.py)."""
    extra: dict[str, Any] = {"context_schema": context_schema} if context_schema is not None else {}
    if middleware:
        extra["middleware"] = middleware
    if tracer_provider is not None:
        extra["tracer_provider"] = tracer_provider
    return build_graph(
        ScriptedChatModel(responder=responder),
        make_tools(effects),
        policies={
            "pay": pay_policy(effects, **policy_overrides),
            "balance": ToolPolicy(effect="read", approval="never"),
        },
        checkpointer=saver,
        ledger=ledger,
        name="gate_app",
        **extra,
    )


def effects_for(saver: Any) -> Effects:
    return Effects(Path(saver.path).with_name("effects.sqlite"))
