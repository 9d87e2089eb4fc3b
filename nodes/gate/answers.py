"""Answers to tool calls: one factory, one record, and what the model is shown.

Only gatedloop's nodes answer a call (`execute`, a reviewer's `respond`/`reject`, a refusal, a settlement, a
supersession, `finalize`), and each answer's digest is recorded in the ledger as it is given. A `ToolMessage` in
the history whose digest is not recorded for its call (sent as input by a client, as Agent Chat UI does, or
written with `update_state`) is foreign: it is removed, and the call it claims to answer stays open until
gatedloop answers it. The model is shown each assistant turn followed directly by its calls' answers
(invariant 1), even when an answer was given later, after a newer user message.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, ToolMessage

from gatedloop.checkpoints.evidence import Answer, AuditEvent
from gatedloop.checkpoints.ledger import Evidence
from gatedloop.nodes.gate.outcomes import OutcomeStatus
from gatedloop.tools.arguments import digest
from gatedloop.tools.errors import ToolFailure


def tool_message(call_id: str, name: str | None, status: OutcomeStatus, content: str) -> ToolMessage:
    """Every answer gatedloop gives a call. The one place our outcome status meets LangChain's
    `ToolMessage.status`: `ok` is `success`; `error` and `unknown` are `error`."""
    langchain_status: Literal["success", "error"] = "success" if status == "ok" else "error"
    return ToolMessage(content=content, tool_call_id=call_id, name=name, status=langchain_status, id=f"tool-{call_id}")


def error_message(call_id: str, name: str | None, failure: ToolFailure) -> ToolMessage:
    """The answer a call gets when it is refused, not run or fails: the failure's structured body."""
    return tool_message(call_id, name, "error", failure.to_json())


def result_message(call_id: str, name: str, content: str) -> ToolMessage:
    return tool_message(call_id, name, "ok", content)


def answer_digest(message: ToolMessage) -> str:
    content = message.content if isinstance(message.content, str) else json.dumps(message.content, default=str)
    return _answer_digest(message.tool_call_id, message.status, content)


@functools.lru_cache(maxsize=16_384)
def _answer_digest(call_id: str, status: str, content: str) -> str:
    """Memoized: a pure function of three strings (their hashes are cached on the string objects), so a hit is
    exactly the digest it stands for. The bytes are `digest({"call": ..., "status": ..., "content": ...})`'s
    canonical JSON, written out directly (a fresh process checks every answer of a resumed thread once)."""
    if not (type(call_id) is str and type(status) is str and type(content) is str):
        return digest({"call": call_id, "status": status, "content": content})
    text = f'{{"call":{_json_str(call_id)},"content":{_json_str(content)},"status":{_json_str(status)}}}'
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


_json_str = json.JSONEncoder(ensure_ascii=False).encode  # a str's JSON text, as `digest`'s json.dumps writes it


def record_answers(
    ledger: Evidence, thread_id: str, messages: Sequence[ToolMessage], source: str, events: Sequence[AuditEvent] = ()
) -> dict[str, Any]:
    """Record the answers (and the step's audit `events`, in the same transaction) in the ledger, then return
    them as a `messages` update (none: no update at all, since an empty write still costs a DeltaChannel step)."""
    if messages or events:
        answers = [Answer(m.tool_call_id, m.name or "", answer_digest(m), source) for m in messages]
        ledger.record_answers(thread_id, answers, events)
    return {"messages": list(messages)} if messages else {}


@dataclass
class OpenCall:
    """A call of an assistant turn that has no answer from gatedloop yet."""

    id: str
    name: str
    args: Any


@dataclass
class HistoryCheck:
    foreign: list[ToolMessage] = field(default_factory=list)
    open_calls: list[OpenCall] = field(default_factory=list)

    def removals(self) -> list[RemoveMessage]:
        return [RemoveMessage(id=m.id) for m in self.foreign if m.id]


@dataclass
class HistoryScan:
    """A check of the history, message by message, that can be extended by the messages a step adds.

    An answer is authentic when its call was proposed earlier, is not answered yet, and its digest is the one
    recorded for the call; any other is foreign. `closed_at` is the longest prefix whose every call is answered
    within it: answers after it can only belong to calls after it, so its model view never changes."""

    proposed: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    open: dict[str, OpenCall] = field(default_factory=dict)
    foreign: list[ToolMessage] = field(default_factory=list)
    seen: int = 0
    closed_at: int = 0

    def extend(self, messages: Sequence[BaseMessage], recorded: Mapping[str, str]) -> None:
        """Take in `messages` (the next ones of the history), against the answer digests in `recorded`."""
        for message in messages:
            self.seen += 1
            if isinstance(message, AIMessage):
                for call in [*message.tool_calls, *message.invalid_tool_calls]:
                    call_id = call.get("id") or ""
                    self.proposed.add(call_id)
                    if call_id not in self.answered:
                        self.open[call_id] = OpenCall(call_id, str(call.get("name") or ""), call.get("args"))
            elif isinstance(message, ToolMessage):
                call_id = message.tool_call_id
                if call_id in self.open and recorded.get(call_id) == answer_digest(message):
                    self.answered.add(call_id)
                    del self.open[call_id]
                else:
                    self.foreign.append(message)
            if not self.open:
                self.closed_at = self.seen

    def result(self) -> HistoryCheck:
        return HistoryCheck(list(self.foreign), list(self.open.values()))


def model_view(messages: Sequence[BaseMessage], foreign: Sequence[ToolMessage] = ()) -> list[BaseMessage]:
    """The history as the model must see it: each assistant turn followed directly by its calls' answers,
    foreign answers left out."""
    skip = {id(m) for m in foreign}
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage) and id(m) not in skip}
    view: list[BaseMessage] = []
    for message in messages:
        if isinstance(message, ToolMessage):
            continue
        view.append(message)
        if isinstance(message, AIMessage):
            for call in [*message.tool_calls, *message.invalid_tool_calls]:
                answer = answers.get(call.get("id") or "")
                if answer is not None:
                    view.append(answer)
    return view
