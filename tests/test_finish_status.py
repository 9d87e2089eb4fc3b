"""Finish statuses as each LangChain integration reports them, judged by `check_response`.

Each row is the `response_metadata` an integration builds, read from its source (file and what sets it noted
per provider). The five providers with an HTTP test (`test_providers_http.py`) are also here so the table is
complete; the others (Gemini, Mistral, Groq, DeepSeek, Fireworks, Hugging Face) are covered only here.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk

import gatedloop.graph  # noqa: F401  (nodes import gatedloop.nodes.state: load the package first)
from gatedloop.nodes.model import ResponseProblem, check_response
from gatedloop.nodes.provider.finish import collapse_repeats, finish_status

CALL = {"name": "query_order", "args": {"order_id": "A-1"}, "id": "call_1", "type": "tool_call"}

# (provider, response_metadata, verdict): "ok" is acted on, else the ResponseProblem kind.
CASES: list[tuple[str, dict[str, Any], str]] = [
    # langchain_openai/chat_models/base.py: generation_info["finish_reason"] from the choice
    ("openai-chat", {"finish_reason": "tool_calls"}, "ok"),
    ("openai-chat", {"finish_reason": "stop"}, "ok"),
    ("openai-chat", {"finish_reason": "length"}, "incomplete"),
    ("openai-chat", {"finish_reason": "content_filter"}, "refused"),
    # _construct_lc_result_from_responses_api: `status` and `incomplete_details`, no finish_reason
    ("openai-responses", {"status": "completed", "model_provider": "openai"}, "ok"),
    ("openai-responses", {"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}, "incomplete"),
    ("openai-responses", {"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}, "refused"),
    ("openai-responses", {"status": "in_progress"}, "incomplete"),
    # langchain_anthropic/chat_models.py: message.stop_reason, or message_delta's stop_reason when streamed
    ("anthropic", {"stop_reason": "tool_use", "stop_sequence": None}, "ok"),
    ("anthropic", {"stop_reason": "end_turn"}, "ok"),
    ("anthropic", {"stop_reason": "max_tokens"}, "incomplete"),
    ("anthropic", {"stop_reason": "pause_turn"}, "incomplete"),
    ("anthropic", {"stop_reason": "model_context_window_exceeded"}, "incomplete"),
    ("anthropic", {"stop_reason": "refusal", "model_provider": "anthropic"}, "refused"),
    # langchain_google_genai/chat_models.py: candidate.finish_reason.name; streamed chunks concatenate
    ("google", {"finish_reason": "STOP", "safety_ratings": []}, "ok"),
    ("google", {"finish_reason": "STOPSTOP", "safety_ratings": []}, "ok"),
    ("google", {"finish_reason": "MAX_TOKENS"}, "incomplete"),
    ("google", {"finish_reason": "MALFORMED_FUNCTION_CALL"}, "incomplete"),
    ("google", {"finish_reason": "SAFETY", "model_provider": "google_genai"}, "refused"),
    ("google", {"finish_reason": "PROHIBITED_CONTENT"}, "refused"),
    ("google", {"finish_reason": "UNKNOWN_42"}, "incomplete"),
    # langchain_ollama/chat_models.py: the final stream line (done: true) becomes generation_info
    ("ollama", {"model": "llama3.1", "done": True, "done_reason": "stop", "model_provider": "ollama"}, "ok"),
    ("ollama", {"done": True, "done_reason": "length"}, "incomplete"),
    ("ollama", {"done": True, "done_reason": "load"}, "incomplete"),
    # langchain_aws/chat_models/bedrock_converse.py: response["stopReason"], or messageStop when streamed
    ("bedrock-converse", {"stopReason": "tool_use", "metrics": {"latencyMs": [12]}}, "ok"),
    ("bedrock-converse", {"stopReason": "end_turn"}, "ok"),
    ("bedrock-converse", {"stopReason": "max_tokens"}, "incomplete"),
    ("bedrock-converse", {"stopReason": "malformed_tool_use"}, "incomplete"),
    ("bedrock-converse", {"stopReason": "guardrail_intervened"}, "refused"),
    ("bedrock-converse", {"stopReason": "content_filtered"}, "refused"),
    # langchain_mistralai/chat_models.py: generation_info={"finish_reason": res.get("finish_reason")}
    ("mistral", {"finish_reason": "tool_calls"}, "ok"),
    ("mistral", {"finish_reason": "model_length"}, "incomplete"),
    ("mistral", {"finish_reason": "error"}, "incomplete"),
    # langchain_groq/chat_models.py: generation_info["finish_reason"] from the choice
    ("groq", {"finish_reason": "tool_calls", "model_name": "llama-3.3-70b-versatile"}, "ok"),
    ("groq", {"finish_reason": "length"}, "incomplete"),
    # langchain_deepseek: ChatOpenAI's parsing; DeepSeek adds insufficient_system_resource
    ("deepseek", {"finish_reason": "tool_calls", "model_provider": "deepseek"}, "ok"),
    ("deepseek", {"finish_reason": "insufficient_system_resource"}, "incomplete"),
    ("deepseek", {"finish_reason": "content_filter"}, "refused"),
    # langchain_fireworks/chat_models.py: generation_info["finish_reason"] from the choice
    ("fireworks", {"finish_reason": "tool_calls"}, "ok"),
    ("fireworks", {"finish_reason": "length"}, "incomplete"),
    # langchain_huggingface/chat_models/huggingface.py: {"finish_reason": res.get("finish_reason")}; TGI's eos_token
    ("huggingface", {"finish_reason": "eos_token"}, "ok"),
    ("huggingface", {"finish_reason": "stop"}, "ok"),
    ("huggingface", {"finish_reason": "length"}, "incomplete"),
]


def verdict(message: AIMessage) -> str:
    try:
        check_response(message, set())
    except ResponseProblem as problem:
        return problem.kind
    return "ok"


@pytest.mark.parametrize(("provider", "metadata", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_providers_finish_status(provider: str, metadata: dict[str, Any], expected: str) -> None:
    message = AIMessage(content="", tool_calls=[CALL], response_metadata=metadata)
    assert verdict(message) == expected


def test_streamed_statuses_merged_by_langchain_are_read_once() -> None:
    """langchain-core concatenates string metadata across chunks: Gemini's STOP arrives as STOPSTOP."""
    merged = AIMessageChunk(content="Hi", response_metadata={"finish_reason": "STOP"}) + AIMessageChunk(
        content="!", response_metadata={"finish_reason": "STOP"}
    )
    assert merged.response_metadata["finish_reason"] == "STOPSTOP"
    status = finish_status(merged)
    assert status is not None and (status.key, status.value, status.meaning) == ("finish_reason", "STOP", "finished")
    assert verdict(merged) == "ok"
    assert collapse_repeats("tool_callstool_callstool_calls") == "tool_calls"
    assert collapse_repeats(["stop", "stop"]) == "stop"
    assert collapse_repeats("length") == "length"


@pytest.mark.parametrize(
    ("content", "metadata", "kwargs"),
    [
        ([{"type": "refusal", "refusal": "I can't help with that."}], {"status": "completed"}, {}),  # Responses API
        ("", {"finish_reason": "stop"}, {"refusal": "I can't help with that."}),  # chat completions
        ([{"type": "text", "text": "No."}], {"stop_reason": "refusal", "model_provider": "anthropic"}, {}),
    ],
    ids=["responses-refusal-block", "chat-refusal-field", "anthropic-refusal-stop"],
)
def test_a_refusal_is_refused_even_with_a_finished_status(content: Any, metadata: dict, kwargs: dict) -> None:
    message = AIMessage(content=content, tool_calls=[CALL], response_metadata=metadata, additional_kwargs=kwargs)
    assert verdict(message) == "refused"


def test_a_refusal_content_block_is_read_from_content_blocks() -> None:
    """The standard block langchain-core builds, whatever the provider: type `refusal`."""
    message = AIMessage(
        content=[{"type": "refusal", "refusal": "Not allowed."}],
        response_metadata={"finish_reason": "stop", "model_provider": "openai"},
    )
    assert [b["type"] for b in message.content_blocks] == ["refusal"]
    with pytest.raises(ResponseProblem, match="Not allowed") as caught:
        check_response(message, set())
    assert caught.value.kind == "refused"


def test_no_finish_status_names_the_keys_it_saw_and_the_fix() -> None:
    message = AIMessage(content="", tool_calls=[CALL], response_metadata={"model_name": "fake", "usage": {}})
    with pytest.raises(ResponseProblem) as caught:
        check_response(message, set())
    detail = caught.value.detail
    assert caught.value.kind == "incomplete"
    assert "['model_name', 'usage']" in detail
    assert all(key in detail for key in ("finish_reason", "stop_reason", "done_reason", "stopReason", "status"))
    assert "response_metadata={'finish_reason': 'stop'}" in detail and "ScriptedChatModel" in detail


def test_an_unknown_status_says_which_key_and_value() -> None:
    message = AIMessage(content="hi", response_metadata={"finish_reason": "paused_for_lunch"})
    with pytest.raises(ResponseProblem, match=r"not one gatedloop knows \(finish_reason 'paused_for_lunch'\)"):
        check_response(message, set())
