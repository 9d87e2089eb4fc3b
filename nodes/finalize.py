"""The `finalize` node: the terminal status and, only for `completed`, the answer.

It also enforces invariant 1 as a last line: any call of the last AI message still unanswered (which
the other nodes never leave) gets a "not run" error, so the history stays valid for the provider.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from gatedloop.graph.state import GatedState
from gatedloop.nodes.parts import error_message, unanswered_calls, with_messages
from gatedloop.tools import errors


def answer_text(message: AIMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in message.content]
    return "".join(parts)


def finalize(state: GatedState, runtime: Runtime) -> dict[str, Any]:
    messages = state["messages"]
    stop = state.get("stop")
    detail = state.get("stop_detail")
    last = messages[-1] if messages else None
    if stop:
        status, answer = stop, None
    elif isinstance(last, AIMessage) and not last.tool_calls and not last.invalid_tool_calls:
        status, answer, detail = "completed", answer_text(last), None
    else:
        status, answer, detail = "error", None, "the loop ended without a final answer"
    leftovers = [
        error_message(
            c["id"] or "",
            c.get("name") or "",
            "budget_exhausted",
            errors.NOT_RUN_STOPPED.format(reason=detail or status),
        )
        for c in unanswered_calls(messages)
    ]
    return {"status": status, "answer": answer, "stop_detail": detail, "calls": [], **with_messages(leftovers)}
