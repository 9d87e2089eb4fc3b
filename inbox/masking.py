"""Secret arguments kept off every page of the inbox, wherever their values turn up.

The approval request and the audit trail already mask a tool's `secret_args` ("***"). But the value can also sit in
free text the inbox shows: the user's own message ("pay with card 4111..."), a tool's result that echoes its input,
the model's words. So the inbox collects the secret values of the thread's calls (from its messages, where the
model's calls keep them, and from the ledger's kept edits) and replaces each of them in any text it renders.
Values shorter than `MIN_SECRET_CHARS` are not searched for: replacing "1" or "no" everywhere would garble the
page and tell a reader which short strings are secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from gatedloop.tools.policy import MASK, ToolPolicy

MIN_SECRET_CHARS = 4


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class Redactor:
    """Replaces known secret values in text with "***"; a thread's redactor knows that thread's secrets."""

    def __init__(self, values: Iterable[str] = ()):
        # Longest first, so a secret that contains another is replaced whole.
        self.values = sorted({v for v in values if len(v) >= MIN_SECRET_CHARS and v != MASK}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        return text


def thread_redactor(
    messages: Sequence[BaseMessage],
    policy: Callable[[str], ToolPolicy],
    edited: Mapping[str, Mapping[str, Any]] | None = None,
) -> Redactor:
    """The secrets of a thread: each call's `secret_args` values as the model proposed them, and the values a
    reviewer typed in an edit (`edited`: call id -> the arguments the ledger keeps for it, name -> value)."""
    values: list[str] = []
    names: dict[str, str] = {}
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            names[str(call.get("id"))] = call["name"]
            secret = policy(call["name"]).secret_args
            values.extend(_text(v) for k, v in (call.get("args") or {}).items() if k in secret)
    for call_id, args in (edited or {}).items():
        secret = policy(names.get(call_id, "")).secret_args
        values.extend(_text(v) for k, v in args.items() if k in secret)
    return Redactor(values)
