"""Contract tests: what the real ``langchain_openai.ChatOpenAI`` returns for each shape of response.

These pin, per call path, the fields our ``model`` node can use to tell a complete response from a
truncated, filtered or refused one. Non-streamed paths send one JSON body; streamed paths (``streaming=True``
with ``invoke``/``ainvoke``, or ``stream``/``astream`` summed) aggregate SSE chunks inside LangChain, and
the two disagree in ways that matter (see the ``length`` and cut-stream tests).
"""

from __future__ import annotations

import asyncio
import json
import operator
import urllib.error
import urllib.request
from collections.abc import Iterable
from functools import reduce
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from openai_stub import Reply, ScriptedOpenAIServer, chat_openai, tool_call

NON_STREAMED = ["invoke", "ainvoke"]
STREAMED = ["invoke_streaming", "ainvoke_streaming", "stream", "astream"]
ALL_PATHS = NON_STREAMED + STREAMED

ARGS = '{"order_id": "A-1001"}'
TOOL_CALL = {"name": "query_order", "args": {"order_id": "A-1001"}, "id": "call_1", "type": "tool_call"}


@tool
def query_order(order_id: str) -> dict:
    """Look up an order by id."""
    return {"order_id": order_id, "status": "shipped"}


def make_model(server: ScriptedOpenAIServer, path: str, **kwargs: Any) -> Any:
    """ChatOpenAI with the tool bound; ``streaming`` is only passed when True (an explicit False matters)."""
    if path.endswith("_streaming"):
        kwargs["streaming"] = True
    chat = chat_openai(server.base_url, **kwargs)
    return chat.bind_tools([query_order])


def _sum(chunks: Iterable[AIMessage]) -> AIMessage:
    return reduce(operator.add, chunks)


def call(server: ScriptedOpenAIServer, path: str, **kwargs: Any) -> AIMessage:
    """Run one model call through ``path`` and return the (aggregated) message."""
    model = make_model(server, path, **kwargs)
    if path in ("invoke", "invoke_streaming"):
        return model.invoke("Where is order A-1001?")
    if path in ("ainvoke", "ainvoke_streaming"):
        return asyncio.run(model.ainvoke("Where is order A-1001?"))
    if path == "stream":
        return _sum(model.stream("Where is order A-1001?"))

    async def collect() -> AIMessage:
        return _sum([chunk async for chunk in model.astream("Where is order A-1001?")])

    return asyncio.run(collect())


def expected_metadata(path: str, finish_reason: str) -> dict[str, Any]:
    """``response_metadata`` exactly as LangChain builds it for a response that carried a finish_reason."""
    if path in STREAMED:
        return {"finish_reason": finish_reason, "model_name": "gpt-4o-mini", "model_provider": "openai"}
    usage = {
        "completion_tokens": 5,
        "prompt_tokens": 10,
        "total_tokens": 15,
        "completion_tokens_details": None,
        "prompt_tokens_details": None,
    }
    return {
        "token_usage": usage,
        "model_provider": "openai",
        "model_name": "gpt-4o-mini",
        "logprobs": None,
        "system_fingerprint": None,
        "id": "chatcmpl-stub-1",
        "finish_reason": finish_reason,
    }


def expected_type(path: str) -> type[AIMessage]:
    return AIMessageChunk if path in ("stream", "astream") else AIMessage


# --- complete responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ALL_PATHS)
def test_plain_text_finishes_with_stop(path: str) -> None:
    with ScriptedOpenAIServer([Reply(content="Hello there", arg_chunk_size=2)]) as server:
        msg = call(server, path)
    assert type(msg) is expected_type(path)
    assert msg.content == "Hello there"
    assert (msg.tool_calls, msg.invalid_tool_calls) == ([], [])
    assert msg.response_metadata == expected_metadata(path, "stop")
    # Non-streamed messages always carry the refusal slot; streamed ones never do.
    assert msg.additional_kwargs == ({"refusal": None} if path in NON_STREAMED else {})
    assert server.requests[0]["stream"] is (path in STREAMED)


@pytest.mark.parametrize("path", ALL_PATHS)
def test_tool_call_arrives_parsed(path: str) -> None:
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3)
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.content == ""
    assert msg.tool_calls == [TOOL_CALL]
    assert msg.invalid_tool_calls == []
    assert msg.response_metadata == expected_metadata(path, "tool_calls")
    sent = server.requests[0]
    assert [t["function"]["name"] for t in sent["tools"]] == ["query_order"]
    assert sent["tools"][0]["function"]["parameters"]["required"] == ["order_id"]


def test_streamed_arguments_arrive_in_many_pieces() -> None:
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3)
    with ScriptedOpenAIServer([reply]) as server:
        chunks = list(make_model(server, "stream").stream("Where is order A-1001?"))
    pieces = [tc["args"] for c in chunks for tc in c.tool_call_chunks]
    assert "".join(pieces) == ARGS and len(pieces) == 1 + 8  # header chunk with "" then 3-char pieces
    # Only the chunk that carried finish_reason has it; LangChain then appends an empty "last" chunk.
    assert [c.response_metadata.get("finish_reason") for c in chunks][-2:] == ["tool_calls", None]
    assert chunks[-1].chunk_position == "last"


def test_stream_usage_adds_usage_chunk() -> None:
    """With a custom base_url, ChatOpenAI only asks for usage in streams when ``stream_usage=True``."""
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)])
    with ScriptedOpenAIServer([reply, reply]) as server:
        without = call(server, "invoke_streaming")
        with_usage = call(server, "invoke_streaming", stream_usage=True)
    assert "stream_options" not in server.requests[0]
    assert server.requests[1]["stream_options"] == {"include_usage": True}
    assert without.usage_metadata is None
    assert with_usage.usage_metadata is not None
    assert with_usage.usage_metadata["input_tokens"] == 10
    assert with_usage.usage_metadata["output_tokens"] == 5
    assert with_usage.response_metadata["finish_reason"] == "tool_calls"


def test_stream_with_explicit_streaming_false_is_one_non_streamed_call() -> None:
    """An explicit ``streaming=False`` overrides ``.stream()``: one non-streamed request, one AIMessage."""
    with ScriptedOpenAIServer([Reply(content="Hello there", arg_chunk_size=2)]) as server:
        chunks = list(make_model(server, "stream", streaming=False).stream("hi"))
    assert [type(c) for c in chunks] == [AIMessage]
    assert server.requests[0]["stream"] is False
    assert chunks[0].response_metadata == expected_metadata("invoke", "stop")


@pytest.mark.parametrize(
    ("stream_mode", "model_kwargs", "streamed"),
    [("updates", {}, False), ("messages", {}, True), ("messages", {"streaming": False}, False)],
    ids=["updates", "messages", "messages-streaming-false"],
)
def test_langgraph_messages_mode_turns_node_invoke_into_a_stream(
    stream_mode: Literal["updates", "messages"], model_kwargs: dict[str, Any], streamed: bool
) -> None:
    """Inside a graph streamed with ``stream_mode="messages"``, a node's plain ``.invoke()`` streams."""
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3, cut_after_chunks=8, cut_mode="eof")
    with ScriptedOpenAIServer([reply]) as server:
        model = make_model(server, "invoke", **model_kwargs)

        def model_node(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", model_node)
        builder.add_edge(START, "model")
        builder.add_edge("model", END)
        graph = builder.compile()
        start: MessagesState = {"messages": [HumanMessage("hi")]}
        parts = list(graph.stream(start, stream_mode=[stream_mode, "values"]))
    states: list[Any] = [payload for mode, payload in parts if mode == "values"]
    final = states[-1]["messages"][-1]
    assert isinstance(final, AIMessage)
    assert server.requests[0]["stream"] is streamed
    if streamed:  # the eof cut only exists on the streamed path; the partial call reaches graph state
        assert final.tool_calls == [{**TOOL_CALL, "args": {"order_id": "A-10"}}]
        assert final.response_metadata == {"model_provider": "openai"}
    else:
        assert final.tool_calls == [TOOL_CALL]
        assert final.response_metadata["finish_reason"] == "tool_calls"


# --- truncated responses ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NON_STREAMED)
def test_length_with_partial_tool_call_non_streamed_is_invalid(path: str) -> None:
    reply = Reply(tool_calls=[tool_call("query_order", '{"order_id": "A-')], finish_reason="length")
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.tool_calls == []
    [invalid] = msg.invalid_tool_calls
    assert {k: v for k, v in invalid.items() if k != "error"} == {
        "type": "invalid_tool_call",
        "id": "call_1",
        "name": "query_order",
        "args": '{"order_id": "A-',
    }
    assert (invalid["error"] or "").startswith("Function query_order arguments:")
    assert msg.response_metadata == expected_metadata(path, "length")


@pytest.mark.parametrize("path", STREAMED)
def test_length_with_partial_tool_call_streamed_looks_valid(path: str) -> None:
    """Streaming parses truncated JSON leniently: only finish_reason reveals the call is cut short."""
    reply = Reply(tool_calls=[tool_call("query_order", '{"order_id": "A-')], finish_reason="length", arg_chunk_size=3)
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.tool_calls == [{**TOOL_CALL, "args": {"order_id": "A-"}}]
    assert msg.invalid_tool_calls == []
    assert msg.response_metadata == expected_metadata(path, "length")


@pytest.mark.parametrize("path", STREAMED)
def test_stream_aborted_mid_arguments_raises_connection_error(path: str) -> None:
    import openai  # imported by the test process that runs this file only

    # 8 chunks = role, tool-call header, then '{"o' 'rde' 'r_i' 'd":' ' "A' '-10'; chunked body never ends.
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3, cut_after_chunks=8)
    with ScriptedOpenAIServer([reply]) as server, pytest.raises(openai.APIConnectionError) as info:
        call(server, path)
    exc = info.value
    assert type(exc).__module__ == "langchain_openai.chat_models.base"
    assert type(exc).__name__ == "OpenAIConnectionError"
    assert exc.message == "Connection error."
    assert type(exc.__cause__) is openai.APIConnectionError
    root = exc.__cause__.__cause__
    assert type(root).__name__ == "RemoteProtocolError"
    assert "incomplete chunked read" in str(root)


def test_aborted_stream_yields_partial_chunks_before_raising() -> None:
    import openai  # imported by the test process that runs this file only

    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3, cut_after_chunks=8)
    received: list[AIMessage] = []
    with ScriptedOpenAIServer([reply]) as server, pytest.raises(openai.APIConnectionError):
        for chunk in make_model(server, "stream").stream("Where is order A-1001?"):
            received.append(chunk)
    assert len(received) == 8
    partial = _sum(received)
    assert partial.tool_calls == [{**TOOL_CALL, "args": {"order_id": "A-10"}}]
    assert partial.response_metadata == {"model_provider": "openai"}


@pytest.mark.parametrize("path", STREAMED)
def test_stream_ending_cleanly_mid_arguments_returns_partial_call(path: str) -> None:
    """An unframed body that just stops is not an error anywhere: no finish_reason key is the only sign."""
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3, cut_after_chunks=8, cut_mode="eof")
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.tool_calls == [{**TOOL_CALL, "args": {"order_id": "A-10"}}]
    assert msg.invalid_tool_calls == []
    assert msg.response_metadata == {"model_provider": "openai"}
    if path in ("stream", "astream"):
        assert isinstance(msg, AIMessageChunk)
        assert msg.chunk_position == "last"  # so chunk_position does not mean "complete"


@pytest.mark.parametrize("path", STREAMED)
def test_stream_without_finish_reason_has_no_finish_key(path: str) -> None:
    reply = Reply(tool_calls=[tool_call("query_order", ARGS)], arg_chunk_size=3, omit_finish=True)
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.tool_calls == [TOOL_CALL]
    assert msg.response_metadata == {"model_provider": "openai"}


@pytest.mark.parametrize("path", NON_STREAMED)
def test_null_finish_reason_non_streamed_keeps_key_as_none(path: str) -> None:
    with ScriptedOpenAIServer([Reply(content="hi", finish_reason=None)]) as server:
        msg = call(server, path)
    assert "finish_reason" in msg.response_metadata
    assert msg.response_metadata["finish_reason"] is None


# --- broken, filtered and refused responses -----------------------------------------------------------


@pytest.mark.parametrize("path", ALL_PATHS)
def test_unparseable_arguments_become_invalid_tool_calls(path: str) -> None:
    reply = Reply(tool_calls=[tool_call("query_order", "nope{")], arg_chunk_size=2)
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.tool_calls == []
    [invalid] = msg.invalid_tool_calls
    assert (invalid["type"], invalid["id"], invalid["name"], invalid["args"]) == (
        "invalid_tool_call",
        "call_1",
        "query_order",
        "nope{",
    )
    if path in STREAMED:
        assert invalid["error"] is None
    else:
        assert (invalid["error"] or "").startswith("Function query_order arguments:")
    assert msg.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("path", ALL_PATHS)
@pytest.mark.parametrize("calls", [[], [tool_call("query_order", ARGS)]], ids=["text", "tool_call"])
def test_content_filter_is_only_visible_in_finish_reason(path: str, calls: list[dict[str, str]]) -> None:
    reply = Reply(content="", tool_calls=calls, finish_reason="content_filter")
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.content == ""
    assert msg.tool_calls == ([TOOL_CALL] if calls else [])
    assert msg.invalid_tool_calls == []
    assert msg.response_metadata == expected_metadata(path, "content_filter")


@pytest.mark.parametrize("path", NON_STREAMED)
def test_refusal_non_streamed_lands_in_additional_kwargs(path: str) -> None:
    with ScriptedOpenAIServer([Reply(content=None, refusal="I can't help with that.")]) as server:
        msg = call(server, path)
    assert msg.content == ""
    assert msg.additional_kwargs == {"refusal": "I can't help with that."}
    assert (msg.tool_calls, msg.invalid_tool_calls) == ([], [])
    assert msg.response_metadata == expected_metadata(path, "stop")


@pytest.mark.parametrize("path", STREAMED)
def test_refusal_streamed_is_dropped(path: str) -> None:
    """Chat Completions streaming ignores ``delta.refusal``: a refusal looks like an empty "stop" answer."""
    reply = Reply(content=None, refusal="I can't help with that.", arg_chunk_size=4)
    with ScriptedOpenAIServer([reply]) as server:
        msg = call(server, path)
    assert msg.content == ""
    assert msg.additional_kwargs == {}
    assert (msg.tool_calls, msg.invalid_tool_calls) == ([], [])
    assert msg.response_metadata == expected_metadata(path, "stop")


# --- the stub itself ----------------------------------------------------------------------------------


def test_callable_replies_see_the_conversation() -> None:
    def reply_for(request: dict[str, Any]) -> Reply:
        last = request["messages"][-1]
        if last["role"] == "tool":
            return Reply(content=f"Order status: {json.loads(last['content'])['status']}")
        return Reply(tool_calls=[tool_call("query_order", ARGS)])

    with ScriptedOpenAIServer(reply_for) as server:
        model = make_model(server, "invoke")
        first = model.invoke("Where is order A-1001?")
        result = query_order.invoke(first.tool_calls[0]["args"])
        tool_msg = ToolMessage(json.dumps(result), tool_call_id=first.tool_calls[0]["id"])
        second = model.invoke(["Where is order A-1001?", first, tool_msg])
    assert second.content == "Order status: shipped"
    assert server.requests[1]["messages"][1]["tool_calls"][0]["function"] == {
        "name": "query_order",
        "arguments": json.dumps({"order_id": "A-1001"}),
    }
    assert server.requests[1]["messages"][2] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": json.dumps(result),
    }


def test_exhausted_script_answers_500_and_fails_the_block() -> None:
    import openai  # imported by the test process that runs this file only

    with pytest.raises(AssertionError, match="ScriptExhausted"), ScriptedOpenAIServer([]) as server:
        with pytest.raises(openai.InternalServerError, match="no reply left") as info:
            make_model(server, "invoke").invoke("hi")
        assert (type(info.value).__name__, info.value.status_code) == ("OpenAIAPIError", 500)
        assert server.errors == ["ScriptedOpenAIServer: ScriptExhausted: no reply left for request #1"]


def test_models_endpoint_and_unknown_paths() -> None:
    with ScriptedOpenAIServer([]) as server:
        with urllib.request.urlopen(f"{server.base_url}/models", timeout=5) as resp:
            assert json.load(resp)["data"][0]["id"] == "gpt-4o-mini"
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{server.base_url}/completions", data=b"{}", timeout=5)
        assert info.value.code == 404
    assert server.requests == []
