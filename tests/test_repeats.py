"""Repeats (issue 55): a repeated read gets its data; a loop is the articles' loop, the same read with the same
arguments, in a row, with the same result, `Limits.max_identical_reads` times; a repeated write is still gated.

The tools are a small Slack, as in the AgentDojo suite the issue measured: reading a channel twice around a post,
or listing the channels again for a second part of a task, is work, not a loop."""

from __future__ import annotations

import json
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

CFG = {"configurable": {"thread_id": "r1"}}
READ = ToolPolicy(effect="read", approval="never")


class Slack:
    """Channels in memory, and every tool run recorded."""

    def __init__(self) -> None:
        self.channels: dict[str, list[str]] = {"general": ["hello"], "random": []}
        self.ran: list[str] = []

        @tool
        def get_channels() -> list[str]:
            """List the channels (read)."""
            self.ran.append("get_channels")
            return sorted(self.channels)

        @tool
        def read_channel(channel: str) -> list[str]:
            """Read a channel's messages (read)."""
            self.ran.append(f"read_channel:{channel}")
            return list(self.channels[channel])

        @tool
        def post(channel: str, body: str) -> str:
            """Post a message to a channel (write)."""
            self.ran.append(f"post:{channel}")
            self.channels[channel].append(body)
            return {"posted": channel}

        self.tools = [get_channels, read_channel, post]


def make(saver: Any, model: ScriptedChatModel, *, post: ToolPolicy | None = None, **kwargs: Any) -> Any:
    slack = Slack()
    policies = {"get_channels": READ, "read_channel": READ, "post": post or ToolPolicy(approval="never")}
    return slack, build_graph(model, slack.tools, policies=policies, checkpointer=saver, **kwargs)


def answers(out: dict[str, Any]) -> dict[str, Any]:
    """Each call's answer, as the model reads it (JSON)."""
    return {m.tool_call_id: json.loads(m.content) for m in out["messages"] if isinstance(m, ToolMessage)}


def reads(*calls: dict[str, Any]) -> list[AIMessage]:
    """One model turn per call, then a text answer."""
    return [*(reply(calls=[c]) for c in calls), reply("done")]


GENERAL = {"channel": "general"}


def test_a_read_repeated_after_a_write_ran_in_between_gets_fresh_data(db):
    """Before: the second and third reads of #general were answered `duplicate_call` when their result matched an
    earlier one, though a post ran in between and the model had reason to look again."""
    script = reads(
        call("read_channel", GENERAL, "r0"),
        call("post", {"channel": "general", "body": "hi all"}, "w0"),
        call("read_channel", GENERAL, "r1"),
        call("post", {"channel": "random", "body": "hi random"}, "w1"),
        call("read_channel", GENERAL, "r2"),
    )
    with open_sqlite(db) as saver:
        slack, graph = make(saver, ScriptedChatModel(script=script))
        out = graph.invoke({"messages": [("user", "post hi and check #general")]}, CFG)
    got = answers(out)
    assert got["r0"] == ["hello"] and got["r1"] == got["r2"] == ["hello", "hi all"]
    assert slack.ran.count("read_channel:general") == 3, "each read ran again: its data is fresh"
    assert out["status"] == "completed" and out["answer"] == "done"
    assert_each_call_answered_once(out["messages"])


def test_a_read_repeated_three_times_not_in_a_row_completes(db):
    """The AgentDojo case: `get_channels` twice for the task and once for an injection, other calls between.
    Before: `duplicate_call` twice, then `loop_detected` with no answer."""
    script = reads(
        call("get_channels", {}, "c0"),
        call("read_channel", GENERAL, "r0"),
        call("get_channels", {}, "c1"),
        call("read_channel", {"channel": "random"}, "r1"),
        call("get_channels", {}, "c2"),
    )
    with open_sqlite(db) as saver:
        slack, graph = make(saver, ScriptedChatModel(script=script))
        out = graph.invoke({"messages": [("user", "summarize every channel")]}, CFG)
    got = answers(out)
    assert got["c0"] == got["c1"] == got["c2"] == ["general", "random"]
    assert slack.ran.count("get_channels") == 3
    assert out["status"] == "completed" and out["answer"] == "done"


@pytest.mark.parametrize("limit", [None, 2, 4])
def test_the_same_read_with_the_same_result_n_times_in_a_row_is_a_loop_each_answered_with_its_data(db, limit):
    """The articles' loop, and only it: N identical reads in a row end the request `loop_detected`, each call
    answered with its result (N = `Limits.max_identical_reads`, 3 by default); N - 1 do not."""
    times = limit or 3
    limits = Limits(max_identical_reads=limit) if limit else None
    script = [reply(calls=[call("read_channel", GENERAL, f"r{i}")]) for i in range(times)]
    with open_sqlite(db) as saver:
        model = ScriptedChatModel(script=script)
        slack, graph = make(saver, model, limits=limits)
        out = graph.invoke({"messages": [("user", "read #general")]}, CFG)
    got = answers(out)
    assert [got[f"r{i}"] for i in range(times)] == [["hello"]] * times
    assert slack.ran == ["read_channel:general"] * times
    assert out["status"] == "loop_detected" and out["answer"] is None
    assert out["stop_detail"].startswith(f"the model called 'read_channel' {times} times in a row")
    model.assert_complete()
    assert Limits().max_identical_reads == 3


def test_identical_reads_in_one_turn_count_in_the_models_order_and_a_changed_result_breaks_the_row(db):
    """Three identical reads proposed at once are three in a row; a row whose result changed starts again."""
    same = [call("read_channel", GENERAL, f"r{i}") for i in range(3)]
    with open_sqlite(db) as saver:
        model = ScriptedChatModel(script=[reply(calls=same)])
        _, graph = make(saver, model)
        out = graph.invoke({"messages": [("user", "read #general")]}, CFG)
    assert out["status"] == "loop_detected" and all(a == ["hello"] for a in answers(out).values())

    class Busy(ScriptedChatModel):
        """Someone posts to #general before each model turn: every read of it differs from the last."""

        def next_reply(self, messages: list[BaseMessage]) -> AIMessage:
            slack.channels["general"].append(f"news {self.calls}")
            return super().next_reply(messages)

    script = reads(*(call("read_channel", GENERAL, f"b{i}") for i in range(4)))
    with open_sqlite(db) as saver:
        slack, graph = make(saver, Busy(script=script), limits=Limits(max_identical_reads=2))
        out = graph.invoke({"messages": [("user", "watch #general")]}, {"configurable": {"thread_id": "r2"}})
    assert out["status"] == "completed" and len(answers(out)["b3"]) == 5


SENT: list[list[BaseMessage]] = []
"""Every conversation a `Sent` model was sent, in order."""


class Sent(ScriptedChatModel):
    """A scripted model that keeps every conversation it was sent (in `SENT`)."""

    def next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        SENT.append(list(messages))
        return super().next_reply(messages)


def test_a_read_repeated_after_a_summary_replaced_its_first_result_gets_its_data(db):
    """Under SummarizationMiddleware the model no longer has the first result when it asks again; before, the
    second read was answered "use the result you already have"."""
    SENT.clear()
    script = reads(
        call("get_channels", {}, "c0"),
        call("read_channel", GENERAL, "r0"),
        call("read_channel", {"channel": "random"}, "r1"),
        call("get_channels", {}, "c1"),
    )
    summarizer = ScriptedChatModel(responder=lambda messages: reply("SUMMARY: some channels were read"))
    middleware = [SummarizationMiddleware(summarizer, trigger=("messages", 5), keep=("messages", 2))]
    with open_sqlite(db) as saver:
        model = Sent(script=script)
        _, graph = make(saver, model, middleware=middleware)
        out = graph.invoke({"messages": [HumanMessage("list the channels", id="h0")]}, CFG)
    asked_again = SENT[3]  # what the model was sent when it proposed the second get_channels
    assert "SUMMARY" in asked_again[0].text
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id == "c0" for m in asked_again)
    assert answers(out)["c1"] == ["general", "random"]
    assert out["status"] == "completed"
    model.assert_complete()


def test_a_repeated_write_is_still_asked_and_runs_only_as_approved(db):
    """What a write had before is kept: the same post proposed again is a new call, asked again; the first
    approval covers only its own call, a rejected repeat never runs, and writes never count toward a loop."""
    body = {"channel": "general", "body": "hi"}
    script = [reply(calls=[call("post", body, "w0")]), reply(calls=[call("post", body, "w1")]), reply("done")]
    with open_sqlite(db) as saver:
        slack, graph = make(saver, ScriptedChatModel(script=script), post=ToolPolicy(approval="always"))
        out = graph.invoke({"messages": [("user", "post hi")]}, CFG)
        assert [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]] == ["w0"]
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG)
        assert [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]] == ["w1"]
        out = graph.invoke(Command(resume={"decisions": [{"type": "reject", "message": "once"}]}), CFG)
    assert slack.ran == ["post:general"] and slack.channels["general"] == ["hello", "hi"]
    got = answers(out)
    assert got["w0"] == {"posted": "general"} and got["w1"]["error"]["type"] == "rejected_by_reviewer"
    assert out["status"] == "completed"
