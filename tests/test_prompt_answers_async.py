"""build_graph's system_prompt, response_format and store; the model awaited under ainvoke; runs' async twins."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph import Limits, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import CallContext, ToolPolicy

CFG = {"configurable": {"thread_id": "p1"}}


class Recording(ScriptedChatModel):
    """Keeps every request and how the tools were bound."""

    requests: list[list[BaseMessage]] = Field(default_factory=list)
    bound: dict[str, Any] = Field(default_factory=dict)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Recording:
        self.bound = {"names": [getattr(t, "name", None) or t["function"]["name"] for t in tools], **kwargs}
        return self

    def next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        self.requests.append(list(messages))
        return super().next_reply(messages)


@tool
def lookup(city: str) -> dict:
    """Weather for a city."""
    return {"city": city, "temp_c": 21}


READ = {"lookup": ToolPolicy(effect="read", approval="never")}


class Forecast(BaseModel):
    city: str
    temp_c: int = Field(ge=-90, le=60)


def test_the_system_prompt_starts_every_model_call_and_is_never_stored(db):
    model = Recording(script=[reply(calls=[call("lookup", {"city": "Oslo"}, "l1")]), reply("21 C")])

    def prompt(state: dict, context: Any) -> str:
        return f"You help {context.user_id}; {len(state['messages'])} messages so far."

    with open_sqlite(db) as saver:
        graph = build_graph(model, [lookup], policies=READ, checkpointer=saver, system_prompt=prompt)
        out = graph.invoke({"messages": [("user", "weather?")]}, CFG, context=CallContext(user_id="ana"))
        history = list(graph.get_state_history(CFG))
    assert out["status"] == "completed"
    assert [type(r[0]) for r in model.requests] == [SystemMessage, SystemMessage]
    assert [r[0].content for r in model.requests] == [
        "You help ana; 1 messages so far.",
        "You help ana; 3 messages so far.",
    ]
    assert all(not isinstance(m, SystemMessage) for snap in history for m in snap.values.get("messages", []))


def test_a_string_system_prompt_and_a_bad_one(db):
    model = Recording(script=[reply("hi")])
    ask(db, model, "hello", system_prompt="Be brief.")
    assert model.requests[0][0] == SystemMessage("Be brief.") and isinstance(model.requests[0][1], HumanMessage)
    with pytest.raises(TypeError, match="system_prompt must be a string or a function"):
        build_graph(model, [lookup], policies=READ, system_prompt=42)  # type: ignore[arg-type]


def ask(db: str, model: ScriptedChatModel, *questions: str, **build: Any) -> dict[str, Any]:
    """Each question in turn on one thread of a graph over `lookup` (a read) built with `build`; the last output."""
    with open_sqlite(db) as saver:
        graph = build_graph(model, [lookup], policies=READ, checkpointer=saver, **build)
        for question in questions:
            out = graph.invoke({"messages": [("user", question)]}, CFG)
    return out


def answer(args: Any, call_id: str) -> AIMessage:
    return reply(calls=[call("Forecast", args, call_id)])


def test_a_valid_structured_answer_lands_in_structured_response(db):
    model = Recording(
        script=[reply(calls=[call("lookup", {"city": "Oslo"}, "l1")]), answer({"city": "Oslo", "temp_c": 21}, "a1")]
    )
    out = ask(db, model, "weather?", response_format=Forecast)
    assert model.bound == {"names": ["lookup", "Forecast"], "tool_choice": "any"}
    assert out["status"] == "completed"
    assert out["structured_response"] == {"city": "Oslo", "temp_c": 21}
    assert Forecast.model_validate(out["structured_response"]) == Forecast(city="Oslo", temp_c=21)
    assert json.loads(out["answer"]) == {"city": "Oslo", "temp_c": 21}
    assert isinstance(out["messages"][-1], ToolMessage) and out["messages"][-1].tool_call_id == "a1"
    assert_each_call_answered_once(out["messages"])


def test_the_next_request_keeps_the_answer_calls_answer_as_gatedloops_own(db):
    model = Recording(
        script=[answer({"city": "Oslo", "temp_c": 21}, "a1"), answer({"city": "Rome", "temp_c": 25}, "a2")]
    )
    out = ask(db, model, "Oslo?", "and Rome?", response_format=Forecast)
    assert out["status"] == "completed" and out["structured_response"] == {"city": "Rome", "temp_c": 25}
    shown = [m for m in model.requests[1] if isinstance(m, ToolMessage)]
    assert [(m.tool_call_id, m.content) for m in shown] == [("a1", "Returning structured response.")]
    assert [m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)] == ["a1", "a2"]
    assert_each_call_answered_once(out["messages"])


def test_an_invalid_answer_is_retried_with_the_reason_and_never_stored(db):
    model = Recording(
        script=[answer({"city": "Oslo", "temp_c": 999}, "bad1"), answer({"city": "Oslo", "temp_c": 5}, "a2")]
    )
    out = ask(db, model, "weather?", response_format=Forecast)
    assert out["status"] == "completed" and out["structured_response"] == {"city": "Oslo", "temp_c": 5}
    feedback = model.requests[1][-1]
    assert isinstance(feedback, ToolMessage) and feedback.tool_call_id == "bad1"
    assert "temp_c" in feedback.content and "less than or equal to 60" in feedback.content
    ids = [c["id"] for m in out["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
    assert ids == ["a2"]


@pytest.mark.parametrize(
    "bad",
    [
        reply("It is 21 C in Oslo."),  # text, not the answer tool
        reply(calls=[call("Forecast", {"city": "Oslo", "temp_c": 1}, "x1"), call("lookup", {"city": "Oslo"}, "x2")]),
        answer({"city": "Oslo"}, "x3"),  # missing field
    ],
    ids=["text", "not-alone", "missing-field"],
)
def test_answers_that_stay_invalid_end_with_an_honest_status(db, bad):
    model = Recording(script=[bad, bad.model_copy(deep=True)])
    out = ask(db, model, "weather?", response_format=Forecast, limits=Limits(model_retries=1))
    assert out["status"] == "invalid_answer" and "Forecast" in out["stop_detail"]
    assert out.get("structured_response") is None and out["answer"] is None
    assert [type(m) for m in out["messages"]] == [HumanMessage]  # no invalid answer and no tool ran
    model.assert_complete()


def test_create_agents_tool_strategy_is_taken_as_its_schema_with_its_options(db):
    """`response_format=ToolStrategy(Forecast)`, as written for `create_agent`, runs as `Forecast` does; its
    `tool_message_content` answers the answer's call and a `handle_errors` message is what an invalid answer is
    told (issue 32, item 5)."""
    from langchain.agents.structured_output import ToolStrategy

    script = [reply(calls=[call("lookup", {"city": "Oslo"}, "l1")]), answer({"city": "Oslo", "temp_c": 21}, "a1")]
    plain, wrapped = Recording(script=script), Recording(script=[m.model_copy(deep=True) for m in script])
    out = ask(db, wrapped, "weather?", response_format=ToolStrategy(Forecast))
    assert wrapped.bound == {"names": ["lookup", "Forecast"], "tool_choice": "any"}
    assert out["status"] == "completed" and out["structured_response"] == {"city": "Oslo", "temp_c": 21}
    same = ask(db.replace(".sqlite", "-plain.sqlite"), plain, "weather?", response_format=Forecast)
    assert (out["structured_response"], out["answer"]) == (same["structured_response"], same["answer"])

    model = Recording(
        script=[answer({"city": "Oslo", "temp_c": 999}, "bad1"), answer({"city": "Oslo", "temp_c": 5}, "a2")]
    )
    strategy = ToolStrategy(Forecast, tool_message_content="Noted.", handle_errors="Try again, within -90..60.")
    out = ask(db.replace(".sqlite", "-options.sqlite"), model, "weather?", response_format=strategy)
    assert out["structured_response"] == {"city": "Oslo", "temp_c": 5}
    assert (
        model.requests[1][-1].tool_call_id == "bad1" and "Try again, within -90..60." in model.requests[1][-1].content
    )
    assert [(m.tool_call_id, m.content) for m in out["messages"] if isinstance(m, ToolMessage)] == [("a2", "Noted.")]


def test_tool_strategy_options_gatedloop_cannot_honour_are_refused_at_build():
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy

    class Other(BaseModel):
        note: str

    for strategy, error in [
        (ToolStrategy(Forecast, handle_errors=False), r"ToolStrategy\(handle_errors=False\) is not supported"),
        (ToolStrategy(Forecast, handle_errors=ValueError), "handle_errors=<class 'ValueError'>"),
        (ToolStrategy(Forecast | Other), "a union of schemas"),
        (ProviderStrategy(Forecast), "pydantic model class or a JSON schema dict, not ProviderStrategy"),
    ]:
        with pytest.raises((TypeError, ValueError), match=error) as refused:
            build_graph(ScriptedChatModel(script=[]), [lookup], policies=READ, response_format=strategy)
        assert "\n" not in str(refused.value)


SCHEMA = {
    "title": "Verdict",
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def test_a_json_schema_answer_is_validated_too(db):
    verdict = [reply(calls=[call("Verdict", {"ok": "yes"}, "v1")]), reply(calls=[call("Verdict", {"ok": True}, "v2")])]
    model = Recording(script=verdict)
    out = ask(db, model, "ok?", response_format=SCHEMA)
    assert out["structured_response"] == {"ok": True}
    assert "'yes' is not of type 'boolean'" in model.requests[1][-1].content


@pytest.mark.parametrize(
    ("fmt", "error"),
    [
        ({"type": "object", "properties": {"a": {"type": "nope"}}}, "not a valid JSON schema"),
        ({"type": "string"}, "must describe an object"),
        ("Forecast", "pydantic model class or a JSON schema dict"),
        ({"title": "lookup", "type": "object", "properties": {}}, "also a tool's name"),
    ],
)
def test_a_bad_response_format_is_refused_at_build(fmt, error):
    with pytest.raises((TypeError, ValueError), match=error):
        build_graph(ScriptedChatModel(script=[]), [lookup], policies=READ, response_format=fmt)


class AwaitedOnly(ScriptedChatModel):
    """A model that works only when awaited: its sync paths fail, its async ones record the thread they ran on."""

    threads: list[int] = Field(default_factory=list)

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise AssertionError("called synchronously")

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise AssertionError("streamed synchronously")

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.threads.append(threading.get_ident())
        return ChatResult(generations=[ChatGeneration(message=self.next_reply(messages))])

    async def _astream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.threads.append(threading.get_ident())
        message = self.next_reply(messages)
        yield ChatGenerationChunk(message=_chunk(message))


def _chunk(message: AIMessage) -> AIMessageChunk:
    return AIMessageChunk(
        content=message.content,
        tool_call_chunks=[
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i, "type": "tool_call_chunk"}
            for i, c in enumerate(message.tool_calls)
        ],
        response_metadata=message.response_metadata,
        usage_metadata=message.usage_metadata,
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["ainvoke", "astream-messages"])
def test_under_ainvoke_the_model_is_awaited_on_the_event_loop(tmp_path, streamed):
    model = AwaitedOnly(script=[reply(calls=[call("lookup", {"city": "Oslo"}, "l1")]), reply("21 C")])

    async def main() -> tuple[dict, int]:
        loop_thread = threading.get_ident()
        async with open_async_sqlite(tmp_path / "runs.sqlite") as saver:
            graph = build_graph(model, [lookup], policies=READ, checkpointer=saver, system_prompt="Be brief.")
            if streamed:
                async for _ in graph.astream(
                    {"messages": [("user", "weather?")]}, CFG, stream_mode=["updates", "messages"]
                ):
                    pass
                return (await graph.aget_state(CFG)).values, loop_thread
            return await graph.ainvoke({"messages": [("user", "weather?")]}, CFG), loop_thread

    out, loop_thread = asyncio.run(main())
    assert out["status"] == "completed" and out["answer"] == "21 C"
    assert model.threads == [loop_thread, loop_thread]


def test_runs_async_twins_start_pending_resume_and_cancel(tmp_path):
    @tool
    def transfer(amount: int) -> dict:
        """Move money."""
        return {"moved": amount}

    script = [
        reply(calls=[call("transfer", {"amount": 5}, "t1")]),
        reply("moved"),
        reply(calls=[call("transfer", {"amount": 6}, "t2")]),
    ]

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with open_async_sqlite(tmp_path / "runs.sqlite") as saver:
            graph = build_graph(ScriptedChatModel(script=script), [transfer], checkpointer=saver)
            paused = await runs.astart(graph, "a1", "send 5")
            seen["paused"] = "__interrupt__" in paused
            seen["pending"] = (await runs.apending_request(graph, "a1"))["action_requests"][0]["args"]
            with pytest.raises(InvalidDecision):
                await runs.aresume(graph, "a1", {"decisions": []})
            seen["done"] = await runs.aresume(graph, "a1", {"decisions": [{"type": "approve"}]})
            seen["after"] = await runs.apending_request(graph, "a1")
            await runs.astart(graph, "a1", "send 6")
            await runs.acancel("a1", ledger=saver.ledger)
            seen["cancelled"] = await runs.aresume(graph, "a1", {"decisions": [{"type": "approve"}]})
        return seen

    seen = asyncio.run(main())
    assert seen["paused"] and seen["pending"] == {"amount": 5}
    assert seen["done"]["status"] == "completed" and seen["after"] is None
    assert seen["cancelled"]["status"] == "cancelled"
    assert_each_call_answered_once(seen["cancelled"]["messages"])
