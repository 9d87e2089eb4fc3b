"""The loop end to end on a real SQLite file: routing, each node's job, and invariant 1 on every path."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langgraph.types import Command
from sample_app import Effects, make_tools, policies

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, UnexpectedModelCall, call, reply

CFG = {"configurable": {"thread_id": "t1"}}


def run(saver, script, *, limits=None, effects=None, reads=None, user="go", **kwargs):
    effects = effects or Effects(Path(saver.path).with_name("effects.sqlite"))
    model = ScriptedChatModel(script=script)
    graph = build_graph(
        model, make_tools(effects, reads=reads), policies=policies(effects), limits=limits, checkpointer=saver, **kwargs
    )
    out = graph.invoke({"messages": [("user", user)]}, CFG, durability="sync")
    return graph, model, effects, out


def tool_messages(out) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def error_type(message: ToolMessage) -> str:
    return json.loads(message.content)["error"]["type"]


def test_no_tool_calls_completes_with_the_answer(db):
    with open_sqlite(db) as saver:
        _, model, _, out = run(saver, [reply("Hello there.")])
    assert out["status"] == "completed"
    assert out["answer"] == "Hello there."
    model.assert_complete()


def test_one_read_runs_and_its_result_reaches_the_model(db):
    reads: dict[str, int] = {}
    with open_sqlite(db) as saver:
        _, model, _, out = run(saver, [reply(calls=[call("lookup", {"query": "q"}, "r1")]), reply("ok")], reads=reads)
    assert reads == {"q": 1}
    assert json.loads(tool_messages(out)["r1"].content) == {"query": "q", "answer": "answer to q"}
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])
    model.assert_complete()


def test_several_calls_bad_ones_answered_with_structured_errors_and_never_run(db):
    reads: dict[str, int] = {}
    calls = [
        call("lookup", {"query": "good"}, "ok1"),
        call("Lookup", {"query": "case"}, "bad_name"),
        call("lookup ", {"query": "space"}, "bad_space"),
        call("lookup", '{"query": "unterminated', "bad_json"),
        call("lookup", {"query": "x", "extra": 1}, "extra_arg"),
        call("lookup", {}, "missing_arg"),
        call("lookup", {"query": 5}, "wrong_type"),
    ]
    with open_sqlite(db) as saver:
        _, _, _, out = run(saver, [reply(calls=calls), reply("done")], reads=reads)
    answers = tool_messages(out)
    assert reads == {"good": 1}
    assert answers["ok1"].status == "success"
    assert error_type(answers["bad_name"]) == "unknown_tool"
    assert error_type(answers["bad_space"]) == "unknown_tool"
    for call_id in ("bad_json", "extra_arg", "missing_arg", "wrong_type"):
        body = json.loads(answers[call_id].content)
        assert body["ok"] is False and body["error"]["type"] == "invalid_arguments", call_id
        assert set(body["error"]) >= {"type", "message", "retryable"}
    assert_each_call_answered_once(out["messages"])


def test_gated_write_pauses_with_a_hitl_request_and_runs_only_after_approval(db):
    with open_sqlite(db) as saver:
        graph, _, effects, out = run(
            saver, [reply(calls=[call("book", {"item": "seat", "quantity": 2}, "w1")]), reply("booked")]
        )
        request = out["__interrupt__"][0].value
        assert request["action_requests"][0]["name"] == "book"
        assert request["action_requests"][0]["args"] == {"item": "seat", "quantity": 2}
        assert request["action_requests"][0]["tool_call_id"] == "w1"
        assert "idempotency_key" not in request["action_requests"][0]["args"]
        assert request["review_configs"] == [
            {"action_name": "book", "allowed_decisions": ["approve", "edit", "reject", "respond"]}
        ]
        assert effects.rows() == []
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG, durability="sync")
    assert [r[:2] for r in effects.rows()] == [("book", {"item": "seat", "quantity": 2})]
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])


def test_tool_exception_text_never_reaches_the_model(db, caplog):
    with open_sqlite(db) as saver:
        graph, _, _, _ = run(
            saver,
            [
                reply(
                    calls=[
                        call("book", {"item": "explode", "quantity": 1}, "w1"),
                        call("book", {"item": "forbidden", "quantity": 1}, "w2"),
                    ]
                ),
                reply("sorry"),
            ],
        )
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}, {"type": "approve"}]}), CFG)
    answers = tool_messages(out)
    exploded = answers["w1"].content
    assert "secret" not in exploded and "/etc/passwd" not in exploded and "RuntimeError" not in exploded
    assert json.loads(exploded)["error"]["type"] == "tool_error"
    assert json.loads(answers["w2"].content)["error"] == {
        "type": "invalid_arguments",
        "message": "that item cannot be booked",
        "retryable": True,
    }
    assert "secret internal detail" in caplog.text


def test_step_limit_stops_without_an_answer(db):
    script = [reply(calls=[call("lookup", {"query": f"q{i}"}, f"r{i}")]) for i in range(3)]
    with open_sqlite(db) as saver:
        _, model, _, out = run(saver, script, limits=Limits(max_model_calls=3))
    assert out["status"] == "step_limit"
    assert out["answer"] is None
    assert_each_call_answered_once(out["messages"])
    model.assert_complete()


def test_recursion_limit_is_derived_from_the_budget(db):
    with open_sqlite(db) as saver:
        graph, _, _, _ = run(saver, [reply("hi")], limits=Limits(max_model_calls=5))
    assert graph.config["recursion_limit"] == Limits(max_model_calls=5).recursion_limit() < 100


def test_a_new_message_on_a_finished_thread_starts_a_fresh_request(db):
    with open_sqlite(db) as saver:
        graph, model, _, out = run(saver, [reply("first"), reply("second")])
        out = graph.invoke({"messages": [("user", "again")]}, CFG, durability="sync")
    assert out["status"] == "completed" and out["answer"] == "second"
    model.assert_complete()


def test_a_responder_that_returns_a_planned_call_instead_of_a_message_is_told_what_to_return(db):
    """A newcomer's slip (a `call(...)` dict where `reply('', [call(...)])` belongs) stops the request as the
    model's error, and the scripted model says what it needed, not an AttributeError from inside pydantic."""
    model = ScriptedChatModel(responder=lambda messages: call("lookup", {"query": "q"}))
    with open_sqlite(db) as saver:
        effects = Effects(Path(saver.path).with_name("effects.sqlite"))
        graph = build_graph(model, make_tools(effects), policies=policies(effects), checkpointer=saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG, durability="sync")
    assert out["status"] == "error"
    with pytest.raises(UnexpectedModelCall, match=r"responder returned a dict; it must return an AIMessage"):
        model.assert_complete()


class _RunNames(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.names.append(kwargs.get("name") or "")


def _one_read(saver: Any) -> Any:
    effects = Effects(Path(saver.path).with_name("effects.sqlite"))
    model = ScriptedChatModel(script=[reply(calls=[call("lookup", {"query": "q"}, "r1")]), reply("ok")])
    return build_graph(model, make_tools(effects), policies=policies(effects), checkpointer=saver)


@pytest.mark.parametrize("driver", ["invoke", "ainvoke"])
def test_each_node_step_is_one_run_in_a_callbacks_trace(db, driver):
    """What LangSmith and a callback see: each step of a node once, under its name (LangGraph traces the task;
    the node does not trace itself again inside it)."""
    seen = _RunNames()
    request, config = {"messages": [("user", "go")]}, {**CFG, "callbacks": [seen]}
    if driver == "invoke":
        with open_sqlite(db) as saver:
            out = _one_read(saver).invoke(request, config)
    else:

        async def on_the_loop() -> Any:
            async with open_async_sqlite(db) as saver:
                return await _one_read(saver).ainvoke(request, config)

        out = asyncio.run(on_the_loop())
    assert out["answer"] == "ok"
    steps = Counter(n for n in seen.names if n in ("model", "validate", "approve", "execute", "finalize"))
    assert steps == {"model": 2, "validate": 1, "execute": 1, "finalize": 1}
