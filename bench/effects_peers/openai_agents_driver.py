"""The OpenAI Agents SDK, driven as its human-in-the-loop guide says for approvals that outlive a process:
`function_tool(needs_approval=True)`; a run that pauses returns `interruptions`; `result.to_state()` is stored as
JSON (`state.to_json()`); later, in another process, `RunState.from_json(agent, stored)`, `state.approve(item)`,
`Runner.run(agent, state)`. The paused snapshot is kept server-side, as `RunState.from_json`'s docstring asks, in
a file beside the trial (`state.json`, written when a run pauses, as the guide's example does; a finished run's
output goes to `final.json`), and the reviewer's decision is stored with it (`decision.json`) before the run
resumes, so a resume cut short by a crash is retried from what was stored. Nothing in the SDK marks a snapshot
as used: that is left to the application, and this driver adds nothing the guide does not show.

The model is the SDK's own `agents.testing.ScriptedModel` with a responder: a `pay` call for the user's message, a
text answer once the call's output is in. The SDK takes no approver identity: `approve` has no field for who
approves, so the reviewer's identity and the policy's role reach nothing (accepted and ignored).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import payments as P

ARGS = P.parse()

from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

set_tracing_disabled(True)
STATE = os.path.join(ARGS.dir, "state.json")
DECISION = os.path.join(ARGS.dir, "decision.json")


def respond(call: ModelCall) -> Any:
    items = call.input if isinstance(call.input, list) else []
    answered = any(isinstance(item, dict) and item.get("type") == "function_call_output" for item in items)
    if answered:
        return [assistant_message(P.ANSWER)]
    return [function_call("pay", {"amount": P.AMOUNT, "to": P.PAYEE}, call_id=P.CALL_ID)]


@function_tool(needs_approval=True)
def pay(ctx: ToolContext[Any], amount: float, to: str) -> dict[str, Any]:
    """Pay an amount to a payee."""
    return P.pay(ARGS.dir, ctx.tool_call_id, amount, to, ARGS.hold)


def agent() -> Agent[Any]:
    model = ScriptedModel([ModelStep.respond(respond) for _ in range(8)])
    return Agent(name="payments", instructions="Pay what the user asks.", tools=[pay], model=model)


def store(result: Any) -> None:
    if result.interruptions:
        P.write_json(STATE, result.to_state().to_json())
        P.mark("paused", "approval")
    else:
        P.write_json(os.path.join(ARGS.dir, "final.json"), {"output": result.final_output})
        P.mark("final", result.final_output)


async def resume_with(the_agent: Agent[Any], decision: dict[str, Any]) -> None:
    with open(STATE, encoding="utf-8") as f:
        state = await RunState.from_json(the_agent, json.load(f))
    pending = [item for item in state.get_interruptions() if item.call_id == decision["call_id"]]
    if not pending:
        P.mark("noop", f"no interruption {decision['call_id']} in the stored state")
        return
    for item in pending:
        state.approve(item)
    store(await Runner.run(the_agent, state))


async def main() -> None:
    the_agent = agent()
    P.wait_go(ARGS.go)
    try:
        if ARGS.action == "start":
            store(await Runner.run(the_agent, P.REQUEST, context={"requester": "ana"}))
        elif ARGS.action == "answer":
            decision = {"call_id": P.CALL_ID, "approve": True, "reviewer": ARGS.reviewer}
            P.write_json(DECISION, decision)
            await resume_with(the_agent, decision)
        elif os.path.exists(DECISION):
            with open(DECISION, encoding="utf-8") as f:
                await resume_with(the_agent, json.load(f))
        else:
            P.mark("paused", "approval")
    except Exception as raised:
        P.mark("raised", f"{type(raised).__name__}: {str(raised)[:160]}")


asyncio.run(main())
