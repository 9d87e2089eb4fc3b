"""Provider finish statuses: did the model say it finished, stop short, or refuse?

Every LangChain integration copies its provider's own word into `response_metadata`, under its own key and
in its own vocabulary. The keys and values below were read from each integration's source (langchain-openai,
-anthropic, -google-genai, -ollama, -aws, -mistralai, -groq, -deepseek, -fireworks, -huggingface).
Hand-written because langchain-core normalizes refusals (content blocks of type `refusal`) but not the
finish status itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage

# Where each integration puts the finish status, in the order we look.
FINISH_KEYS: Mapping[str, str] = {
    "finish_reason": "OpenAI chat completions, Google Gemini, Mistral, Groq, DeepSeek, Fireworks, Hugging Face",
    "stop_reason": "Anthropic",
    "done_reason": "Ollama",
    "stopReason": "Bedrock Converse",
    "status": "OpenAI Responses API (with incomplete_details)",
}

# Compared case-folded (Gemini and Bedrock spell theirs differently).
FINISHED = frozenset(
    {
        "stop",  # OpenAI-compatible, Gemini STOP, Mistral, Groq, DeepSeek, Fireworks, Hugging Face, Ollama
        "tool_calls",
        "function_call",
        "end_turn",  # Anthropic, Bedrock
        "tool_use",
        "stop_sequence",
        "eos_token",  # Hugging Face TGI
        "completed",  # OpenAI Responses API `status`
    }
)
REFUSED = frozenset(
    {
        "content_filter",  # OpenAI chat and Responses (`incomplete_details.reason`), DeepSeek
        "refusal",  # Anthropic
        "safety",  # Gemini
        "recitation",
        "prohibited_content",
        "blocklist",
        "spii",
        "image_safety",
        "image_prohibited_content",
        "guardrail_intervened",  # Bedrock
        "content_filtered",
    }
)
CUT_OFF = frozenset(
    {
        "length",
        "model_length",  # Mistral
        "max_tokens",  # Anthropic, Gemini, Bedrock
        "max_output_tokens",  # OpenAI Responses API
        "pause_turn",  # Anthropic: a server tool paused the turn
        "model_context_window_exceeded",
        "insufficient_system_resource",  # DeepSeek
        "malformed_function_call",  # Gemini
        "malformed_model_output",  # Bedrock
        "malformed_tool_use",
        "load",  # Ollama: the model was only loaded
        "incomplete",
        "in_progress",
        "failed",
        "cancelled",
        "queued",
        "error",
    }
)

FinishMeaning = Literal["finished", "cut_off", "refused", "unknown"]


@dataclass(frozen=True)
class FinishStatus:
    """The provider's finish status: where it was found, its value, and what it means for the loop."""

    key: str
    value: str
    meaning: FinishMeaning

    def describe(self) -> str:
        return f"{self.key} {self.value!r}"


def finish_status(message: AIMessage) -> FinishStatus | None:
    """The first finish status found under a known key, or None if the response carries none."""
    meta = message.response_metadata or {}
    for key in FINISH_KEYS:
        value = collapse_repeats(meta.get(key))
        if value is None:
            continue
        if key == "status" and value.casefold() == "incomplete":
            reason = collapse_repeats((meta.get("incomplete_details") or {}).get("reason"))
            if reason:
                return FinishStatus(key, f"incomplete: {reason}", _meaning(reason))
        return FinishStatus(key, value, _meaning(value))
    return None


def _meaning(value: str) -> FinishMeaning:
    folded = value.casefold()
    if folded in FINISHED:
        return "finished"
    if folded in REFUSED:
        return "refused"
    return "cut_off" if folded in CUT_OFF else "unknown"


def collapse_repeats(value: Any) -> str | None:
    """A streamed status merged chunk by chunk: `"STOPSTOP"` (strings concatenate) or `["stop", "stop"]` -> one."""
    if isinstance(value, list | tuple):
        texts = {str(v) for v in value if v not in (None, "")}
        return texts.pop() if len(texts) == 1 else (", ".join(map(str, value)) or None)
    if value is None or value == "":
        return None
    text = str(value)
    for size in range(1, len(text) // 2 + 1):
        if len(text) % size == 0 and text[:size] * (len(text) // size) == text:
            return text[:size]
    return text


def refusal_text(message: AIMessage) -> str | None:
    """A refusal the provider reported as content: OpenAI's `refusal`, or a standard `refusal` content block."""
    if refusal := message.additional_kwargs.get("refusal"):
        return str(refusal)
    try:
        blocks = message.content_blocks
    except Exception:  # a translator that cannot read this content: judged by the finish status alone
        return None
    for block in blocks:
        if block.get("type") == "refusal":
            return str(block.get("refusal") or "no reason given")
    return None


def no_status_detail(message: AIMessage) -> str:
    """Why a response without a finish status is refused, with what was seen and how to fix it."""
    seen = sorted(map(str, message.response_metadata or {})) or "none"
    return (
        f"the response carries no finish status (a stream cut short?); response_metadata keys seen: {seen}; "
        f"looked for: {', '.join(FINISH_KEYS)}. A chat model of your own (or a LangChain fake) must report one "
        "on its final message, e.g. response_metadata={'finish_reason': 'stop'} ('tool_calls' with tool calls); "
        "for tests, gatedloop.graph.scripted.ScriptedChatModel does"
    )


def unfinished_detail(status: FinishStatus) -> str:
    if status.meaning == "cut_off":
        return f"the response was not finished ({status.describe()})"
    return (
        f"the response's finish status is not one gatedloop knows ({status.describe()}); it acts only on "
        f"{', '.join(sorted(FINISHED))} under {', '.join(FINISH_KEYS)}"
    )
