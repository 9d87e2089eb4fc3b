"""The real LangChain client of each provider, over HTTP, against a server on 127.0.0.1 speaking its wire format.

One test body for every provider (OpenAI chat completions, OpenAI Responses, Anthropic, Ollama, Bedrock
Converse, and Groq and Mistral, whose own clients speak the Chat Completions format), driven the two ways users
run the graph: `invoke`, and `stream(stream_mode=["updates", "messages"])` as `langgraph dev` does (which makes
every client stream). A complete reply runs its two tool calls and the run completes; a reply cut off by the
provider's token limit, or by a connection lost mid-arguments, runs nothing, never enters the history, and the
run ends `incomplete` after one retry.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from openai_stub import chat_openai
from provider_wires import WIRES, Call, ProviderServer, Turn
from pydantic import SecretStr

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.tools import ToolPolicy

CFG = {"configurable": {"thread_id": "t"}}
QUESTION = "Where are orders A-1 and B-2?"
ANSWER = "A-1 has shipped and B-2 is packed."
CALLS = [Call("call_a1", "query_order", {"order_id": "A-1"}), Call("call_b2", "query_order", {"order_id": "B-2"})]
ORDERS = {"A-1": "shipped", "B-2": "packed"}


# Each client is imported when its model is built: together they are two seconds of imports (the Anthropic SDK most)
# for every test process, and only the one running this file needs them.
def _anthropic(url: str) -> BaseChatModel:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(  # type: ignore[call-arg]
        model_name="claude-sonnet-5-5", base_url=url, api_key=SecretStr("test"), max_retries=0, timeout=5
    )


def _ollama(url: str) -> BaseChatModel:
    from langchain_ollama import ChatOllama

    return ChatOllama(model="llama3.1", base_url=url, client_kwargs={"timeout": 5})


def _groq(url: str) -> BaseChatModel:
    from langchain_groq import ChatGroq

    return ChatGroq(model="llama-3.3-70b-versatile", base_url=url, api_key=SecretStr("test"), max_retries=0, timeout=5)


def _mistral(url: str) -> BaseChatModel:
    from langchain_mistralai import ChatMistralAI

    return ChatMistralAI(
        model_name="mistral-large-latest", base_url=f"{url}/v1", api_key=SecretStr("test"), max_retries=0, timeout=5
    )


def _bedrock_converse(url: str) -> BaseChatModel:
    from botocore.config import Config
    from langchain_aws import ChatBedrockConverse

    return ChatBedrockConverse(
        model="anthropic.claude-3-5-haiku-20241022-v1:0",
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id=SecretStr("test"),
        aws_secret_access_key=SecretStr("test"),
        config=Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=5),
    )


MODELS: dict[str, Callable[[str], BaseChatModel]] = {
    "openai-chat": lambda url: chat_openai(f"{url}/v1"),
    "openai-responses": lambda url: chat_openai(f"{url}/v1", use_responses_api=True),
    "anthropic": _anthropic,
    "ollama": _ollama,
    "groq": _groq,
    "mistral": _mistral,
    "bedrock-converse": _bedrock_converse,
}
WIRE_OF = {"groq": "openai-chat"}  # Groq speaks the Chat Completions wire format
ALWAYS_STREAMS = {"ollama"}  # langchain-ollama asks /api/chat for a stream even under invoke
# botocore reads half a JSON body as an empty response, and langchain-aws then raises a plain ValueError
# ("No 'output' key"): nothing says the connection was lost, so the run ends as a failing model call.
STATUS_OF_A_CUT = {("bedrock-converse", "invoke", "dropped"): "error"}


def run(provider: str, mode: str, turns: list[Turn], tmp_path: Path) -> tuple[dict[str, Any], ProviderServer, list]:
    looked_up: list[str] = []

    @tool
    def query_order(order_id: str) -> dict[str, str]:
        """Look up an order's status by its id, e.g. A-1."""
        looked_up.append(order_id)
        return {"order_id": order_id, "status": ORDERS[order_id]}

    policies = {"query_order": ToolPolicy(effect="read", approval="never")}
    with (
        ProviderServer(WIRES[WIRE_OF.get(provider, provider)], turns) as server,
        open_sqlite(tmp_path / "runs.sqlite") as saver,
    ):
        model = MODELS[provider](server.origin)
        graph = build_graph(model, [query_order], policies=policies, limits=Limits(model_retries=1), checkpointer=saver)
        question = {"messages": [HumanMessage(QUESTION)]}
        if mode == "invoke":
            events: list = []
            out = graph.invoke(question, CFG, durability="sync")
        else:
            events = list(graph.stream(question, CFG, stream_mode=["updates", "messages"], durability="sync"))
            out = graph.get_state(CFG).values
    streamed = [r.stream for r in server.requests]
    assert streamed == [mode == "stream" or provider in ALWAYS_STREAMS] * len(server.requests)
    return {**out, "looked_up": looked_up}, server, events


@pytest.mark.parametrize("mode", ["invoke", "stream"])
@pytest.mark.parametrize("provider", list(MODELS))
def test_a_complete_reply_runs_its_calls_and_completes(provider: str, mode: str, tmp_path: Path) -> None:
    out, server, events = run(provider, mode, [Turn(calls=CALLS), Turn(text=ANSWER)], tmp_path)

    assert (out["status"], out["answer"]) == ("completed", ANSWER)
    assert sorted(out["looked_up"]) == ["A-1", "B-2"]
    messages = out["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, ToolMessage, AIMessage]
    proposed = [(c["name"], c["args"]) for c in messages[1].tool_calls]
    assert proposed == [(c.name, c.args) for c in CALLS]
    assert_each_call_answered_once(messages)
    second_request = json.dumps(server.requests[1].body)
    assert len(server.requests) == 2
    assert all(status in second_request for status in ORDERS.values())  # the results went back to the provider
    if mode == "stream":
        model_tokens = [e for e in events if e[0] == "messages" and e[1][1]["langgraph_node"] == "model"]
        assert model_tokens, "no token events from the model node"


@pytest.mark.parametrize("cut", ["truncated", "dropped"])
@pytest.mark.parametrize("mode", ["invoke", "stream"])
@pytest.mark.parametrize("provider", list(MODELS))
def test_a_cut_off_reply_never_runs_a_call(provider: str, mode: str, cut: str, tmp_path: Path) -> None:
    turns = [Turn(calls=CALLS, cut=cut), Turn(calls=CALLS, cut=cut)]  # type: ignore[arg-type]
    out, server, _ = run(provider, mode, turns, tmp_path)

    assert out["looked_up"] == []
    assert out["status"] == STATUS_OF_A_CUT.get((provider, mode, cut), "incomplete"), out.get("stop_detail")
    assert [type(m) for m in out["messages"]] == [HumanMessage]
    assert len(server.requests) == 2  # the first attempt and one retry (Limits.model_retries=1)
