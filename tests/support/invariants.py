"""Invariant checks shared by the tests."""

from __future__ import annotations

from collections import Counter

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage


def assert_each_call_answered_once(messages: list[BaseMessage]) -> None:
    """Invariant 1: every tool call id of every AI message has exactly one ToolMessage, after it."""
    proposed: list[str] = []
    answers = Counter(m.tool_call_id for m in messages if isinstance(m, ToolMessage))
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage):
            for call in [*message.tool_calls, *message.invalid_tool_calls]:
                proposed.append(call["id"])
                later = [
                    m for m in messages[index + 1 :] if isinstance(m, ToolMessage) and m.tool_call_id == call["id"]
                ]
                assert len(later) == 1, f"call {call['id']} answered {len(later)} times"
    assert set(answers) <= set(proposed), f"answers for calls never proposed: {set(answers) - set(proposed)}"
    assert all(n == 1 for n in answers.values()), answers
