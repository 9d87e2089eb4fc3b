"""Strict tool-call arguments for streamed responses.

When a chat model streams, LangChain assembles the response and parses each call's argument text with a
*lenient* partial-JSON parser, then drops the text: `{"participant": "Ali` comes back as a valid-looking
`{"participant": "Ali"}`. So we listen to the stream's own chunks while the model runs, rebuild each call's
exact argument text, and re-parse it strictly (one JSON object of exact values: no NaN, no nesting past the
cap, no lone surrogates, no integers beyond 64 bits); any other call is moved to `invalid_tool_calls`,
where `validate` answers it as `invalid_arguments` and nothing runs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, GenerationChunk
from langchain_core.prompt_values import ChatPromptValue
from langchain_core.runnables import Runnable

from gatedloop.checkpoints.running_step import step_config
from gatedloop.tools.arguments import UnreadArguments, read_arguments


class ToolArgumentChunks(BaseCallbackHandler):
    """Collects the raw `tool_call_chunks` of a streamed response, in order."""

    run_inline = True  # under ainvoke too: chunks must be collected in the order they arrive, not in a thread pool

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []

    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        """Defined so LangChain does not fall back to rendering the whole history as text for this handler."""

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        message = getattr(chunk, "message", None)
        if isinstance(message, AIMessageChunk):
            self.chunks.extend(dict(c) for c in message.tool_call_chunks)

    def raw_arguments(self) -> dict[str, str]:
        """Argument text per call id, concatenated by stream index as providers send it.

        A chunk without an index is a whole call (langchain-ollama sends calls whole, several per chunk).
        """
        by_index: dict[Any, dict[str, Any]] = {}
        for position, chunk in enumerate(self.chunks):
            index = chunk.get("index")
            key = ("whole", position) if index is None else index
            entry = by_index.setdefault(key, {"id": None, "args": ""})
            entry["id"] = entry["id"] or chunk.get("id")
            entry["args"] += chunk.get("args") or ""
        return {e["id"]: e["args"] for e in by_index.values() if e["id"]}


def invoke_capturing(model: Runnable[Any, BaseMessage], messages: Sequence[BaseMessage]) -> BaseMessage:
    """`model.invoke`, keeping the run's own callbacks (tracing, token streaming) and adding ours."""
    capture = ToolArgumentChunks()
    response = model.invoke(chat_input(messages), config={"callbacks": _with_capture(capture)})
    return strict_arguments(response, capture.raw_arguments()) if capture.chunks else response


async def ainvoke_capturing(model: Runnable[Any, BaseMessage], messages: Sequence[BaseMessage]) -> BaseMessage:
    """`model.ainvoke`: the async twin, awaited on the run's event loop."""
    capture = ToolArgumentChunks()
    response = await model.ainvoke(chat_input(messages), config={"callbacks": _with_capture(capture)})
    return strict_arguments(response, capture.raw_arguments()) if capture.chunks else response


def chat_input(messages: Sequence[BaseMessage]) -> LanguageModelInput:
    """The request as a chat model's input. Given a list, `BaseChatModel.invoke` converts every message again
    and validates the list into a `ChatPromptValue` (`convert_to_messages` and pydantic: two walks over the whole
    thread per model call, in Python); a `ChatPromptValue` of messages is taken as it is. Anything that is not a
    message yet goes as a list, to be converted as before."""
    items = list(messages)
    if all(map(isinstance, items, itertools.repeat(BaseMessage))):
        return ChatPromptValue.model_construct(messages=items)
    return items


def _with_capture(capture: ToolArgumentChunks) -> Any:
    parent = step_config().get("callbacks")
    if isinstance(parent, BaseCallbackManager):
        callbacks: Any = parent.copy()
        callbacks.add_handler(capture, inherit=False)
        return callbacks
    return [*(parent or []), capture]


def strict_arguments(response: BaseMessage, raw: dict[str, str]) -> BaseMessage:
    if not isinstance(response, AIMessage) or not response.tool_calls:
        return response
    valid, invalid = [], list(response.invalid_tool_calls)
    for call in response.tool_calls:
        text = raw.get(call["id"] or "")
        problem = _problem(text) if text is not None else None
        if problem is None:
            valid.append(call)
        else:
            invalid.append(
                {"type": "invalid_tool_call", "id": call["id"], "name": call["name"], "args": text, "error": problem}
            )
    if len(valid) == len(response.tool_calls):
        return response
    return response.model_copy(update={"tool_calls": valid, "invalid_tool_calls": invalid})


def _problem(text: str) -> str | None:
    """Why the exact streamed text is not one exact JSON object (`read_arguments`, strict), or None."""
    arguments = read_arguments(text, strict=True)
    return arguments.problem if isinstance(arguments, UnreadArguments) else None
