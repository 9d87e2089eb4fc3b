"""LangChain v1, driven as its docs say for durable human approval: `create_agent(model, tools,
middleware=[HumanInTheLoopMiddleware(interrupt_on={"pay": True})], checkpointer=SqliteSaver(conn))` (the anchor
of bench/anchor.py), answered with `Command(resume={"decisions": [...]})` on the thread, and after a crash
continued as LangGraph's durable-execution docs say: `invoke(None, config)` on the same thread id.

The model is a scripted chat model of a dozen lines (gatedloop's own is not installed in this venv): a tool call
for the user's message, a text answer once the tool's result is in. The middleware has no field for who may
approve, so the reviewer's identity and the policy's role reach nothing (they are accepted and ignored).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from typing import Annotated, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import payments as P

ARGS = P.parse()

from langchain.agents import create_agent  # noqa: E402
from langchain.agents.middleware import HumanInTheLoopMiddleware  # noqa: E402
from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langchain_core.tools import InjectedToolCallId, tool  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.types import Command  # noqa: E402

CONFIG = {"configurable": {"thread_id": "payment-1"}}


class ScriptedModel(BaseChatModel):
    """A tool call for a fresh user message; a text answer after a tool result."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            message = AIMessage(content=P.ANSWER)
        else:
            call = {"name": "pay", "args": {"amount": P.AMOUNT, "to": P.PAYEE}, "id": P.CALL_ID, "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def pay(amount: float, to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
    """Pay an amount to a payee."""
    return P.pay(ARGS.dir, tool_call_id, amount, to, ARGS.hold)


def report(out: dict[str, Any]) -> None:
    if out.get("__interrupt__"):
        P.mark("paused", "approval")
    else:
        P.mark("final", out["messages"][-1].content)


def main() -> None:
    conn = sqlite3.connect(os.path.join(ARGS.dir, "langchain.sqlite"), check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    saver = SqliteSaver(conn)
    saver.setup()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"pay": True})
    agent = create_agent(ScriptedModel(), [pay], middleware=[hitl], checkpointer=saver)
    P.wait_go(ARGS.go)
    try:
        if ARGS.action == "start":
            report(agent.invoke({"messages": [("user", P.REQUEST)]}, CONFIG, durability="sync"))
        elif ARGS.action == "answer":
            answer = Command(resume={"decisions": [{"type": "approve"}]})
            report(agent.invoke(answer, CONFIG, durability="sync"))
        else:
            snapshot = agent.get_state(CONFIG)
            if snapshot.interrupts:
                P.mark("paused", "approval")
            elif not snapshot.next:
                P.mark("noop", "the run has ended")
            else:
                report(agent.invoke(None, CONFIG, durability="sync"))
    except Exception as refused:  # what the framework says to an answer it cannot take
        P.mark("raised", f"{type(refused).__name__}: {str(refused)[:160]}")
    finally:
        conn.close()


main()
