"""A strict scripted chat model, shipped so tests, notebooks and the offline demo need no API key.

The reply is a function of the conversation (so a thread resumed in another process gets the same
replies) or the next item of a script. It fails loudly on an unexpected call, and `assert_complete()`
says whether every scripted reply was used. Hand-written because LangChain's `GenericFakeChatModel`
neither binds tools nor reports a finish status, and the loop refuses responses without one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field, PrivateAttr

Responder = Callable[[list[BaseMessage]], AIMessage | None]


class UnexpectedModelCall(AssertionError):
    """The scripted model was called when no reply was planned for this conversation."""


def call(name: str, args: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A planned tool call; `args` as a string is sent as raw (possibly broken) JSON."""
    return {"name": name, "args": args, "id": call_id}


def reply(
    content: str = "",
    calls: Sequence[dict[str, Any]] = (),
    *,
    finish_reason: str | None = "auto",
    tokens: int = 20,
    refusal: str | None = None,
) -> AIMessage:
    """An AIMessage as a provider would return it: finish status, usage, parsed and unparseable calls.

    A call planned without an id gets one when the model sends the reply (see `with_call_ids`).
    """
    tool_calls, invalid = [], []
    for planned in calls:
        call_id = planned.get("id")
        if isinstance(planned["args"], str):
            try:
                parsed = json.loads(planned["args"])
                if not isinstance(parsed, dict):
                    raise ValueError("not an object")
                tool_calls.append({"name": planned["name"], "args": parsed, "id": call_id, "type": "tool_call"})
            except ValueError:
                invalid.append(
                    {
                        "name": planned["name"],
                        "args": planned["args"],
                        "id": call_id,
                        "error": "invalid JSON",
                        "type": "invalid_tool_call",
                    }
                )
        else:
            tool_calls.append({"name": planned["name"], "args": planned["args"], "id": call_id, "type": "tool_call"})
    if finish_reason == "auto":
        finish_reason = "tool_calls" if calls else "stop"
    metadata = {"finish_reason": finish_reason} if finish_reason else {}
    kwargs = {"refusal": refusal} if refusal else {}
    return AIMessage(
        content=content,
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        response_metadata={**metadata, "model_name": "scripted"},
        additional_kwargs=kwargs,
        usage_metadata={"input_tokens": tokens // 2, "output_tokens": tokens - tokens // 2, "total_tokens": tokens},
    )


class ScriptedChatModel(BaseChatModel):
    """Replies from `responder(messages)` or from `script`, in order; nothing else."""

    script: list[AIMessage] = Field(default_factory=list)
    responder: Responder | None = None
    _position: int = PrivateAttr(default=0)
    _calls: int = PrivateAttr(default=0)
    _unexpected: list[str] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "gatedloop-scripted"

    @property
    def calls(self) -> int:
        return self._calls

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        """Tools are the loop's business, not the script's: binding returns the same model."""
        return self

    def next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        with self._lock:
            self._calls += 1
            if self.responder is not None:
                planned = self.responder(list(messages))
                if planned is None:
                    return self._fail(f"no reply planned after: {_last_text(messages)!r}")
                if not isinstance(planned, AIMessage):  # a `call(...)` dict returned alone is the usual slip
                    return self._fail(
                        f"the responder returned a {type(planned).__name__}; it must return an AIMessage, such as"
                        " reply(text) or reply('', [call(name, args)])"
                    )
                return with_call_ids(planned.model_copy(deep=True), messages)
            if self._position >= len(self.script):
                return self._fail(f"script exhausted after {len(self.script)} replies")
            self._position += 1
            return with_call_ids(self.script[self._position - 1].model_copy(deep=True), messages)

    def _fail(self, why: str) -> AIMessage:
        self._unexpected.append(why)
        raise UnexpectedModelCall(why)

    def assert_complete(self) -> None:
        """Every scripted reply was used and no call came that the script did not plan."""
        if self._unexpected:
            raise UnexpectedModelCall("; ".join(self._unexpected))
        if self.responder is None and self._position != len(self.script):
            raise UnexpectedModelCall(f"{len(self.script) - self._position} scripted replies were never requested")

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.next_reply(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """Stream the text word by word (for token streaming), then the calls and the finish status."""
        message = self.next_reply(messages)
        text = message.content if isinstance(message.content, str) else ""
        for word in text.split(" ") if text else []:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word + " ", id=message.id))
            if run_manager:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk
        final = AIMessageChunk(
            content="",
            id=message.id,
            tool_call_chunks=[
                {"name": c["name"], "args": _raw_args(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
                for i, c in enumerate([*message.tool_calls, *message.invalid_tool_calls])
            ],
            response_metadata=message.response_metadata,
            usage_metadata=message.usage_metadata,
            additional_kwargs=message.additional_kwargs,
        )
        last = ChatGenerationChunk(message=final)
        if run_manager:
            run_manager.on_llm_new_token("", chunk=last)
        yield last


def with_call_ids(message: AIMessage, conversation: Sequence[BaseMessage]) -> AIMessage:
    """Give each call planned without an id one derived from the conversation it answers.

    The conversation grows with every model turn of a thread, so the ids never repeat within a thread, and
    they are the same in every process (a counter would restart at 1 in the process that resumes).
    """
    calls = [*message.tool_calls, *message.invalid_tool_calls]
    if all(c.get("id") is not None for c in calls):
        return message
    turn = hashlib.sha256(_fingerprint(conversation)).hexdigest()[:12]
    ordinal = itertools.count(1)

    def filled(c: Any) -> Any:
        return {**c, "id": f"call_{turn}_{next(ordinal)}"} if c.get("id") is None else c

    return message.model_copy(
        update={
            "tool_calls": [filled(c) for c in message.tool_calls],
            "invalid_tool_calls": [filled(c) for c in message.invalid_tool_calls],
        }
    )


def _fingerprint(conversation: Sequence[BaseMessage]) -> bytes:
    turns = [
        [m.type, m.content, getattr(m, "tool_call_id", None), [c.get("id") for c in getattr(m, "tool_calls", [])]]
        for m in conversation
    ]
    return json.dumps(turns, default=str, sort_keys=True, ensure_ascii=False).encode()


def _raw_args(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _last_text(messages: Sequence[BaseMessage]) -> str:
    return str(messages[-1].content)[:120] if messages else ""
