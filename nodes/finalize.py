"""The `finalize` node: the terminal status and, only for `completed`, the answer.

It also enforces invariant 1 as a last line: a foreign answer (one gatedloop did not give) is removed, and
any call still unanswered (which the other nodes never leave) gets its recorded outcome if it ran, `outcome_unknown`
if it started and never finished (the request then needs attention: finalize asks nobody), else a "not run" error,
so the history stays valid for the provider.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import Runtime

from gatedloop.nodes.build.parts import LoopParts, gate_node
from gatedloop.nodes.gate.answers import record_answers
from gatedloop.nodes.gate.open_calls import leftover_answers
from gatedloop.nodes.gate.views import kept_view
from gatedloop.nodes.run.facts import RunFacts
from gatedloop.nodes.run.notices import queue_finished_notice
from gatedloop.nodes.state import PROTECTED_KEYS, GatedState, changes
from gatedloop.nodes.wire.model_view import MODEL_VIEW_FIELD, view_of

log = logging.getLogger("gatedloop.finalize")


def answer_text(message: AIMessage) -> str:
    if isinstance(message.content, str):
        return message.content
    parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in message.content]
    return "".join(parts)


def make_finalize_node(parts: LoopParts):
    def finalize(state: GatedState, runtime: Runtime) -> dict[str, Any]:
        thread_id = RunFacts.of(runtime).thread_id
        messages = state["messages"]
        stop = state.get("stop")
        detail = state.get("stop_detail")
        last = messages[-1] if messages else None
        structured = state.get("structured_response")
        if stop:
            status, answer = stop, None
        elif structured is not None:
            status, answer, detail = "completed", json.dumps(structured, ensure_ascii=False), None
        elif isinstance(last, AIMessage) and not last.tool_calls and not last.invalid_tool_calls:
            status, answer, detail = "completed", answer_text(last), None
        else:
            status, answer, detail = "error", None, "the loop ended without a final answer"
        check = parts.histories.check(parts.ledger, thread_id, messages).check
        leftovers, started_unknown = leftover_answers(parts.ledger, thread_id, check.open_calls, status, detail)
        if started_unknown and status != "completed":
            status, detail = "needs_attention", "a write's outcome is unknown and was left to a person"
        removals = check.removals()
        answered = record_answers(parts.ledger, thread_id, leftovers, "finalize").get("messages", [])
        update: dict[str, Any] = {"status": status, "answer": answer, "stop_detail": detail, "calls": []}
        counters = state.get("counters")
        reviewed = counters.get("reviewed") if counters is not None else None
        if reviewed:
            queue_finished_notice(parts, thread_id, reviewed, status, detail, [*messages, *answered])
        if removals or answered:
            update["messages"] = [*removals, *answered]
        if parts.middleware is not None and parts.middleware.after_agent:
            update.update(_after_agent(parts, thread_id, {**state, **update}, messages, runtime))
        return changes(state, update)

    if parts.middleware is not None and parts.middleware.after_agent:
        return finalize  # a user's after_agent hooks may block: on LangGraph's executor, as a sync node
    return gate_node(parts, finalize)


def _after_agent(
    parts: LoopParts, thread_id: str, state: dict[str, Any], messages: list[Any], runtime: Runtime
) -> dict[str, Any]:
    """The middleware's `after_agent` hooks, last first as `create_agent` chains them, shown the thread as the model
    was (through a view gatedloop kept, never one written from outside). Their state keys are stored; a change to
    `messages` is not (the finished thread is evidence), and is logged."""
    assert parts.middleware is not None
    shown = view_of(messages, kept_view(parts.ledger, thread_id, state.get(MODEL_VIEW_FIELD)))
    hooks = parts.middleware.hook_state(state, shown, PROTECTED_KEYS)
    hooks.run(parts.middleware.after_agent, "after_agent", runtime)
    if hooks.messages != shown:
        log.warning("an after_agent hook changed the messages; the thread keeps them as they were")
    return hooks.stored
