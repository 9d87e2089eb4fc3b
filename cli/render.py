"""Plain-text rendering of steps, approval requests, stop reasons and a thread's history."""

from __future__ import annotations

import json
from typing import Any, TextIO

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

STOP_WORDS = {
    "completed": "completed",
    "step_limit": "stopped: the model-call limit was reached",
    "budget_exhausted": "stopped: a budget (tokens or tool calls) is used up",
    "deadline": "stopped: the deadline passed",
    "cancelled": "stopped: cancelled on request",
    "loop_detected": "stopped: the model kept repeating the same call",
    "incomplete": "stopped: the model's responses were incomplete (cut off or malformed)",
    "refused": "stopped: the model refused",
    "needs_attention": "stopped: a write's outcome is unknown and needs a person",
    "error": "stopped: an error (see the log)",
}


def short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def call_text(name: str, args: Any) -> str:
    return f"{name}({short(args, 80)})"


def step_lines(node: str, update: Any) -> list[str]:
    """One or more readable lines for a node's state update."""
    if not isinstance(update, dict):
        return []
    lines: list[str] = []
    for message in update.get("messages") or []:
        lines.extend(_message_lines(node, message))
    if node == "finalize" and update.get("status"):
        lines.append(
            f"[{node}] {STOP_WORDS.get(update['status'], update['status'])}"
            + (f" ({update['stop_detail']})" if update.get("stop_detail") else "")
        )
    elif update.get("stop"):
        lines.append(f"[{node}] stopping: {update.get('stop_detail') or update['stop']}")
    return lines


def _message_lines(node: str, message: BaseMessage) -> list[str]:
    if isinstance(message, AIMessage):
        calls = [call_text(c["name"], c["args"]) for c in message.tool_calls]
        calls += [call_text(c.get("name") or "?", c.get("args")) + " [unparseable]" for c in message.invalid_tool_calls]
        if calls:
            return [f"[{node}] proposes {c}" for c in calls]
        return [f"[{node}] answers: {short(message.content, 200)}"]
    if isinstance(message, ToolMessage):
        mark = "✗" if message.status == "error" else "✓"
        return [f"[{node}] {mark} {message.name} -> {short(message.content)}"]
    return []


def approval_table(request: dict[str, Any]) -> str:
    if request.get("kind") == "unknown_outcome":
        rows = [
            f"  {i}. {call_text(c['name'], c['args'])}  outcome unknown ({c['reason']}), key {c['idempotency_key']}"
            for i, c in enumerate(request.get("calls", []), 1)
        ]
        head = "A write's outcome is unknown. Answer done (with its result), not_done (run it) or abandon:"
        return "\n".join([head, *rows])
    rows = []
    for i, (action, config) in enumerate(zip(request["action_requests"], request["review_configs"], strict=False), 1):
        rows.append(
            f"  {i}. {call_text(action['name'], action['args'])}   allowed: {', '.join(config['allowed_decisions'])}"
        )
    head = "Approval needed:" + (f"  (previous answer refused: {request['error']})" if request.get("error") else "")
    return "\n".join([head, *rows])


def print_history(messages: list[BaseMessage], audit: list[dict[str, Any]], out: TextIO) -> None:
    fates: dict[str, list[str]] = {}
    for event in audit:
        who = f" by {event['actor']}" if event.get("actor") else ""
        detail = event["detail"]
        extra = detail.get("decision") or detail.get("outcome") or detail.get("verdict") or detail.get("error") or ""
        fates.setdefault(event["call_id"], []).append(f"{event['event']}{who}: {extra}".rstrip(": "))
    for message in messages:
        if isinstance(message, HumanMessage):
            print(f"user: {short(message.content, 300)}", file=out)
        elif isinstance(message, AIMessage):
            for call in [*message.tool_calls, *message.invalid_tool_calls]:
                print(f"model: call {call.get('id')} {call_text(call.get('name') or '?', call.get('args'))}", file=out)
                for fate in fates.get(call.get("id") or "", []):
                    print(f"    {fate}", file=out)
            if message.content:
                print(f"model: {short(message.content, 300)}", file=out)
        elif isinstance(message, ToolMessage):
            print(f"tool {message.tool_call_id}: {short(message.content, 160)}", file=out)
