"""Pydantic AI, driven as its deferred-tools docs say for human approval: `@agent.tool(requires_approval=True)`,
`output_type=[str, DeferredToolRequests]`; a run that needs approval ends with `DeferredToolRequests`, its message
history is stored (`ModelMessagesTypeAdapter`, `history.json`, written when a run pauses, as the docs' example
keeps `result.all_messages()`; a finished run's output goes to `final.json`), and later, in another process, a new
run continues it: `agent.run(message_history=history, deferred_tool_results=DeferredToolResults(approvals=...))`.
The reviewer's decision is stored (`decision.json`) before that run, so a resume cut short by a crash is retried
from what was stored. Nothing in the framework marks a history as used: that is left to the application.

The model is the framework's `FunctionModel`: a `pay` call for the user's message, a text answer once the call's
result is in. Approvals are booleans per tool call id: there is no field for who approves, so the reviewer's
identity and the policy's role reach nothing (accepted and ignored; the docs say approval "is not an
authorization boundary" and leave authorization to the application and the tool).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import payments as P

ARGS = P.parse()

from pydantic_ai import (  # noqa: E402
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelMessagesTypeAdapter,
    RunContext,
)
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

HISTORY = os.path.join(ARGS.dir, "history.json")
PENDING = os.path.join(ARGS.dir, "pending.json")
DECISION = os.path.join(ARGS.dir, "decision.json")


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(part.part_kind == "tool-return" for part in last.parts):
        return ModelResponse(parts=[TextPart(P.ANSWER)])
    return ModelResponse(parts=[ToolCallPart("pay", {"amount": P.AMOUNT, "to": P.PAYEE}, tool_call_id=P.CALL_ID)])


agent = Agent(FunctionModel(respond), output_type=[str, DeferredToolRequests])


@agent.tool(requires_approval=True)
def pay(ctx: RunContext[None], amount: float, to: str) -> dict[str, Any]:
    """Pay an amount to a payee."""
    return P.pay(ARGS.dir, ctx.tool_call_id or "", amount, to, ARGS.hold)


def store(result: Any) -> None:
    if isinstance(result.output, DeferredToolRequests):
        scratch = f"{HISTORY}.{os.getpid()}.tmp"
        with open(scratch, "wb") as f:
            f.write(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
        os.replace(scratch, HISTORY)
        P.write_json(PENDING, [call.tool_call_id for call in result.output.approvals])
        P.mark("paused", "approval")
    else:
        P.write_json(os.path.join(ARGS.dir, "final.json"), {"output": result.output})
        P.mark("final", result.output)


def resume_with(decision: dict[str, Any]) -> None:
    with open(PENDING, encoding="utf-8") as f:
        pending = json.load(f)
    if decision["call_id"] not in pending:
        P.mark("noop", f"no pending call {decision['call_id']}")
        return
    with open(HISTORY, "rb") as f:
        history = ModelMessagesTypeAdapter.validate_json(f.read())
    results = DeferredToolResults(approvals={decision["call_id"]: decision["approve"]})
    store(agent.run_sync(message_history=history, deferred_tool_results=results))


def main() -> None:
    P.wait_go(ARGS.go)
    try:
        if ARGS.action == "start":
            store(agent.run_sync(P.REQUEST))
        elif ARGS.action == "answer":
            decision = {"call_id": P.CALL_ID, "approve": True, "reviewer": ARGS.reviewer}
            P.write_json(DECISION, decision)
            resume_with(decision)
        elif os.path.exists(DECISION):
            with open(DECISION, encoding="utf-8") as f:
                resume_with(json.load(f))
        else:
            P.mark("paused", "approval")
    except Exception as raised:
        P.mark("raised", f"{type(raised).__name__}: {str(raised)[:160]}")


main()
