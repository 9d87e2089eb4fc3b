"""Secret arguments kept off every page of the inbox and out of `gatedloop show`, wherever their values turn up.

The approval request and the audit trail already mask a tool's `secret_args` ("***"). But the value can also sit in
free text a person is shown: the user's own message ("pay with card 4111..."), a tool's result that echoes its
input, the model's words. So the inbox and the CLI collect the secret values of the thread's calls (from its
messages, where the model's calls keep them, and from the ledger's kept edits) and replace each of them in any text
they render. Values shorter than `MIN_SECRET_CHARS` are not searched for: replacing "1" or "no" everywhere would
garble the page and tell a reader which short strings are secret.

A thread whose policies cannot be known (no graph recorded for it) is shown with `unknown_policies`: each of its
tools' arguments treated as secret, since nothing says which of them are not.

The thread's title (`thread_title`, its first user message, shortened and redacted) is made here too, in the gate's
layer, because the approval notice carries the title the inbox's card shows: one function for both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from gatedloop.tools.policy import GATED_WRITE, MASK, ToolPolicy

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
    secrets: dict[str, frozenset[str]] = {}  # by tool: a long thread calls few tools, most with no secret
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            name = call["name"]
            names[str(call.get("id"))] = name
            secret = secrets.get(name)
            if secret is None:
                secret = secrets[name] = policy(name).secret_args
            if secret:
                values.extend(_text(v) for k, v in (call.get("args") or {}).items() if k in secret)
    for call_id, args in (edited or {}).items():
        secret = policy(names.get(call_id, "")).secret_args
        values.extend(_text(v) for k, v in args.items() if k in secret)
    return Redactor(values)


def unknown_policies(messages: Sequence[BaseMessage]) -> dict[str, ToolPolicy]:
    """The policies to show a thread by when the graph that made it is not known (none recorded): each tool its
    calls name as a gated write whose every argument is secret. Fail closed: the graph at hand may have other
    policies, or other tools of the same names, so its `secret_args` cannot be trusted to name the thread's."""
    arguments: dict[str, set[str]] = {}
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            arguments.setdefault(call["name"], set()).update(call.get("args") or {})
        for bad in message.invalid_tool_calls:
            arguments.setdefault(bad.get("name") or "?", set())
    # A tool with any secret has its unparsed text masked whole (`Display.shown_args`): never none.
    return {tool: replace(GATED_WRITE, secret_args=frozenset(names or {MASK})) for tool, names in arguments.items()}


def content_text(message: BaseMessage) -> str:
    """A message's content as text (a list of content blocks as its repr)."""
    return message.content if isinstance(message.content, str) else str(message.content)


TITLE_CHARS = 60


def thread_title(messages: Sequence[BaseMessage], redact: Redactor) -> str:
    """The thread's first user message, shortened: what a reviewer calls the thread (its id says nothing), on the
    inbox's card and in Slack's approval message (the notice's `title`)."""
    first = next((m for m in messages if isinstance(m, HumanMessage)), None)
    if first is None:
        return ""
    text = " ".join(redact(content_text(first)).split())
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1].rstrip() + "…"
