"""gatedloop, driven as its docs say (docs/use.md, docs/guarantees.md): `build_graph` on `open_sqlite`, the
thread run with `runs.start` / `runs.resume` (lease per thread, `durability="sync"`), the reviewer's identity
as the runtime context, `pay` a gated write whose approvers are a role. With `--reconcile` its policy asks the
payment provider (payments.log) whether a write of unknown outcome happened."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import payments as P

ARGS = P.parse()

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import InjectedToolArg, tool  # noqa: E402

from gatedloop.checkpoints.lease import ThreadBusy  # noqa: E402
from gatedloop.graph import CallContext, InvalidDecision, ToolPolicy, build_graph, open_sqlite, runs  # noqa: E402
from gatedloop.graph.scripted import ScriptedChatModel, call, reply  # noqa: E402
from gatedloop.graph.thread_graph import GraphMismatch, claim_thread  # noqa: E402

THREAD = "payment-1"
REQUESTER = CallContext(user_id="ana", roles={"staff"})
OPERATOR = CallContext(user_id="ops", roles={"ops"})


def responder(messages: list[BaseMessage]) -> AIMessage | None:
    if isinstance(messages[-1], ToolMessage):
        return reply(P.ANSWER)
    if isinstance(messages[-1], HumanMessage):
        return reply(calls=[call("pay", {"amount": P.AMOUNT, "to": P.PAYEE}, P.CALL_ID)])
    return None


@tool
def pay(amount: float, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
    """Pay an amount to a payee."""
    return P.pay(ARGS.dir, idempotency_key, amount, to, ARGS.hold)


def policy() -> ToolPolicy:
    reconcile = (lambda args, key: P.find_payment(ARGS.dir, key)) if ARGS.reconcile else None
    return ToolPolicy(effect="write", approval="always", approvers={P.APPROVER_ROLE[ARGS.policy]}, reconcile=reconcile)


def report(out: dict[str, Any]) -> None:
    pending = out.get("__interrupt__")
    if pending:
        value = pending[0].value
        if isinstance(value, dict) and value.get("kind") == "unknown_outcome":
            P.mark("waiting", "unknown_outcome")
        else:
            P.mark("paused", "approval")
    elif out.get("status") == "completed":
        P.mark("final", out.get("answer"))
    else:
        P.mark("final", f"status={out.get('status')}")


def main() -> None:
    with open_sqlite(os.path.join(ARGS.dir, "gatedloop.sqlite")) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=responder), [pay], policies={"pay": policy()}, checkpointer=saver
        )
        P.wait_go(ARGS.go)
        reviewer = CallContext(user_id=ARGS.reviewer, roles=set(filter(None, ARGS.roles.split(","))))
        try:
            if ARGS.action == "start":
                report(runs.start(graph, THREAD, P.REQUEST, context=REQUESTER))
            elif ARGS.action == "answer":
                if ARGS.upgrade:
                    claim_thread(graph, THREAD, upgrade=True, context=OPERATOR)
                answer = {"decisions": [{"type": "approve", "tool_call_id": P.CALL_ID}]}
                report(runs.resume(graph, THREAD, answer, context=reviewer))
            else:
                report(runs.resume(graph, THREAD, None, context=OPERATOR))
        except ThreadBusy:
            P.mark("busy")
        except (InvalidDecision, GraphMismatch) as refused:
            P.mark("refused", f"{type(refused).__name__}: {str(refused)[:160]}")


main()
