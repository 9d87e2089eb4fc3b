"""What happened to a request and its calls, for the per-request page and a thread's timeline.

Read from what the graph and the ledger already keep: the thread's messages (each call's `ToolMessage`: what the
tool returned, or the refusal and why), the ledger's audit trail (who proposed, who decided what and when, what ran
and for how long), and the checkpoints' interrupt writes (a request as it was shown, after it was answered).
Every text is redacted of the thread's secret values (`gatedloop.nodes.wire.masking`); arguments come masked from the
request and the audit trail.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from gatedloop.graph.display import audit_text, visible
from gatedloop.graph.pending import PendingRequest
from gatedloop.inbox.pending import shown_value
from gatedloop.nodes.wire.masking import Redactor
from gatedloop.tools.policy import ToolPolicy

INTERRUPT_CHANNEL = "__interrupt__"  # where LangGraph writes a task's interrupts (langgraph.constants.INTERRUPT)


@dataclass(frozen=True)
class Moment:
    """One line of a call's timeline."""

    at: float
    actor: str | None
    kind: str  # the audit event: "validated", "decision", "executed", ...
    text: str


@dataclass(frozen=True)
class CallStory:
    """One call from proposal to outcome."""

    call_id: str
    name: str
    args: dict[str, Any]  # masked: as decided (an edit's arguments), else as proposed
    moments: list[Moment] = field(default_factory=list)
    decision: str | None = None  # approve, edit, reject, respond (the last one recorded)
    decided_by: list[str] = field(default_factory=list)
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # (argument, proposed, decided) of an edit
    result: str | None = None  # what the tool returned (pretty JSON when it is JSON), or None: no answer yet
    refusal: str | None = None  # why the call did not run (rejected, refused, expired, ...), from its answer
    answered: bool = False

    @property
    def outcome(self) -> str:
        if not self.answered:
            return "waiting"
        return "refused" if self.refusal is not None else "ran"


def call_story(
    call_id: str,
    name: str,
    args: dict[str, Any],
    audit: Sequence[dict[str, Any]],
    answer: ToolMessage | None,
    redact: Redactor,
) -> CallStory:
    events = [e for e in audit if e["call_id"] == call_id]
    moments = [
        Moment(e["at"], e.get("actor"), e["event"].split(":")[0], redact(_moment_text(e, events[:i])))
        for i, e in enumerate(events)
    ]
    decisions = [e for e in events if e["event"] == "decision" or e["event"].startswith("decision:")]
    decided = (decisions[-1].get("detail") or {}) if decisions else {}
    changed: list[tuple[str, str, str]] = []
    if decided.get("decision") == "edit":
        before, after = decided.get("proposed") or {}, decided.get("args") or {}
        changed = [
            (k, shown_value(before.get(k)), shown_value(after.get(k)))
            for k in [*before, *(k for k in after if k not in before)]
            if before.get(k) != after.get(k)
        ]
        args = after or args
    result, refusal = _answer_texts(answer, redact)
    return CallStory(
        call_id=call_id,
        name=name,
        args=args,
        moments=moments,
        decision=decided.get("decision"),
        decided_by=[str(e.get("actor")) for e in decisions if e.get("actor")],
        changed=changed,
        result=result,
        refusal=refusal,
        answered=answer is not None,
    )


def _moment_text(event: dict[str, Any], earlier: list[dict[str, Any]]) -> str:
    if event["event"] == "validated":
        asker = f", asked by {event['actor']}" if event.get("actor") else ""
        verdict = {"ask": "needs approval", "run": "runs without approval"}.get(
            str((event.get("detail") or {}).get("verdict")), "checked"
        )
        return f"proposed by the model{asker}: {verdict}"
    return audit_text(event, earlier)


def _answer_texts(answer: ToolMessage | None, redact: Redactor) -> tuple[str | None, str | None]:
    """(result, refusal) from a call's answer: the tool's result, or why it did not run."""
    if answer is None:
        return None, None
    content = answer.content if isinstance(answer.content, str) else json.dumps(answer.content, ensure_ascii=False)
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if answer.status == "error":
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            return None, redact(visible(f"{error.get('type')}: {error.get('message')}"))
        return None, redact(visible(content))
    if body is None:
        return redact(visible(content)), None
    return redact(_lines_visible(json.dumps(body, ensure_ascii=False, indent=1))), None


def _lines_visible(text: str) -> str:
    """`visible` line by line: the line breaks of pretty JSON stay line breaks."""
    return "\n".join(visible(line) for line in text.split("\n"))


def answers_by_call(messages: Sequence[BaseMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


@dataclass(frozen=True)
class Entry:
    """One step of a thread as its page shows it: a message, or a call with its timeline."""

    who: str  # "user", "model", "call"
    text: str = ""
    call: CallStory | None = None


def thread_story(
    messages: Sequence[BaseMessage],
    audit: Sequence[dict[str, Any]],
    policy: Callable[[str], ToolPolicy],
    redact: Redactor,
) -> list[Entry]:
    """The conversation with each call's story in place of the tool's raw answer."""
    answers = answers_by_call(messages)
    entries: list[Entry] = []
    for message in messages:
        if isinstance(message, HumanMessage):
            entries.append(Entry("user", redact(visible(_content(message)))))
        elif isinstance(message, AIMessage):
            if message.content:
                entries.append(Entry("model", redact(visible(_content(message)))))
            for call in message.tool_calls:
                call_id = str(call.get("id"))
                args = policy(call["name"]).masked(call.get("args") or {})
                entries.append(
                    Entry("call", call=call_story(call_id, call["name"], args, audit, answers.get(call_id), redact))
                )
            for bad in message.invalid_tool_calls:
                entries.append(Entry("model", f"an unreadable call of {bad.get('name') or '?'} (not run)"))
    return entries


def _content(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else json.dumps(message.content, ensure_ascii=False)


@dataclass(frozen=True)
class FoundRequest:
    thread_id: str
    interrupt_id: str
    request: dict[str, Any]  # the interrupt value, as it was shown
    graph: str  # the graph (assistant) id the server recorded, if any


def find_request(saver: BaseCheckpointSaver[Any], thread_ids: Sequence[str], request_id: str) -> FoundRequest | None:
    """The request `request_id` as it was shown, pending or answered: looked up in the interrupt writes of each
    thread's checkpoints, newest first. Costs a read of every checkpoint of the threads searched; callers pass the
    thread when they know it. A request whose wire format has no id (an unknown outcome's question) is named by its
    interrupt id, as the inbox's list names it (`pending_view`)."""
    for thread_id in thread_ids:
        for found in _interrupts(saver, thread_id):
            if PendingRequest.parse(found.request, found.interrupt_id).request_id == request_id:
                return found
    return None


def _interrupts(saver: BaseCheckpointSaver[Any], thread_id: str) -> Iterator[FoundRequest]:
    config: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for tup in saver.list(config):
        graph = str((tup.metadata or {}).get("graph_id") or "")
        for _task, channel, value in tup.pending_writes or []:
            if channel != INTERRUPT_CHANNEL:
                continue
            for interrupt in value if isinstance(value, list | tuple) else [value]:
                shown = getattr(interrupt, "value", None)
                if isinstance(shown, dict):
                    yield FoundRequest(thread_id, str(getattr(interrupt, "id", "")), shown, graph)
