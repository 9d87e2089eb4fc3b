"""LangChain v1 tool idioms as LangGraph's ToolNode supports them, and tool runs visible to callbacks and traces."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any
from uuid import UUID

import pytest
from invariants import assert_each_call_answered_once
from langchain.tools import InjectedState, InjectedStore, ToolRuntime
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.types import Command
from pydantic import Field

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy

CFG = {"configurable": {"thread_id": "v1"}}
READ = ToolPolicy(effect="read", approval="never")
GATED = ToolPolicy(effect="write", approval="always")


class ShownTools(ScriptedChatModel):
    """Records the tool schemas the model is shown (what a provider would receive)."""

    shown: list[dict[str, Any]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ShownTools:
        self.shown = [convert_to_openai_tool(t) for t in tools]
        return self


@tool
def save_note(text: str, runtime: ToolRuntime[CallContext]) -> str:
    """Save a note for the current user."""
    context = runtime.context
    runtime.store.put(("notes", context.user_id), runtime.tool_call_id, {"text": text})
    runtime.stream_writer({"event": "note_saved", "call": runtime.tool_call_id})
    return json.dumps(
        {
            "saved": runtime.tool_call_id,
            "user": context.user_id,
            "messages_seen": len(runtime.state["messages"]),
            "tools": sorted(t.name for t in runtime.tools),
            "tags": [t for t in runtime.config.get("tags", []) if t.startswith(("tool_call_id:", "decision:"))],
        }
    )


@tool
def echo_ids(
    x: int,
    call_id: Annotated[str, InjectedToolCallId],
    messages: Annotated[list, InjectedState("messages")],
    store: Annotated[BaseStore, InjectedStore()],
) -> dict:
    """Echo x with the call id it was given."""
    return {"x": x, "call_id": call_id, "messages": len(messages), "store": type(store).__name__}


@tool
def answer_with_message(x: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
    """The v1 idiom of answering with a ToolMessage of one's own."""
    return ToolMessage(f"got {x}", tool_call_id=tool_call_id)


def run_notes(saver: Any, store: BaseStore, script: list, **kwargs: Any) -> tuple[Any, ShownTools]:
    model = ShownTools(script=script)
    graph = build_graph(
        model,
        [save_note, echo_ids, answer_with_message],
        policies={"save_note": GATED, "echo_ids": READ, "answer_with_message": READ},
        checkpointer=saver,
        store=store,
        **kwargs,
    )
    return graph, model


def answers(out: dict) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def test_tool_runtime_and_injected_args_are_given_and_never_shown_to_the_model(db):
    script = [
        reply(calls=[call("echo_ids", {"x": 3}, "e1"), call("answer_with_message", {"x": 4}, "m1")]),
        reply(calls=[call("save_note", {"text": "hello"}, "n1")]),
        reply("done"),
    ]
    store = InMemoryStore()
    with open_sqlite(db) as saver:
        graph, model = run_notes(saver, store, script)
        ctx = CallContext(user_id="ana")
        paused = graph.invoke({"messages": [("user", "go")]}, CFG, context=ctx)
        assert paused["__interrupt__"][0].value["action_requests"][0]["args"] == {"text": "hello"}
        chunks = list(
            graph.stream(
                Command(resume={"decisions": [{"type": "approve"}]}),
                CFG,
                context=CallContext(user_id="bo"),
                stream_mode=["custom", "values"],
            )
        )
    out = chunks[-1][1]
    assert out["status"] == "completed"
    got = answers(out)
    assert json.loads(got["e1"].content) == {"x": 3, "call_id": "e1", "messages": 2, "store": "InMemoryStore"}
    assert got["m1"].content == "got 4" and got["m1"].status == "success"
    note = json.loads(got["n1"].content)
    # The tool runs with the resuming call's context; state is the run's state; its config names this call.
    assert note == {
        "saved": "n1",
        "user": "bo",
        "messages_seen": 5,
        "tools": ["answer_with_message", "echo_ids", "save_note"],
        "tags": ["tool_call_id:n1", "decision:approve"],
    }
    assert store.get(("notes", "bo"), "n1").value == {"text": "hello"}
    assert ("custom", {"event": "note_saved", "call": "n1"}) in chunks
    shown = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in model.shown}
    assert shown == {"save_note": {"text"}, "echo_ids": {"x"}, "answer_with_message": {"x"}}
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("save_note", {"text": "x", "runtime": {"tool_call_id": "forged"}}),
        ("echo_ids", {"x": 1, "call_id": "forged"}),
        ("echo_ids", {"x": 1, "store": "forged", "messages": []}),
    ],
)
def test_the_model_cannot_supply_injected_arguments(db, name, args):
    store = InMemoryStore()
    with open_sqlite(db) as saver:
        graph, _ = run_notes(saver, store, [reply(calls=[call(name, args, "f1")]), reply("ok")])
        out = graph.invoke({"messages": [("user", "go")]}, CFG, context=CallContext(user_id="ana"))
    error = json.loads(answers(out)["f1"].content)["error"]
    assert error["type"] == "invalid_arguments" and "unknown argument" in error["message"]
    assert "__interrupt__" not in out and store.search(("notes", "ana")) == []


def test_a_tool_annotated_to_return_a_command_is_refused_at_build_time():
    @tool
    def jump(x: int) -> Command:
        """Route the graph somewhere."""
        return Command(goto="finalize")

    with pytest.raises(ValueError, match=r"'jump' is annotated to return only langgraph Commands.*bypass validate"):
        build_graph(ScriptedChatModel(script=[]), [jump], policies={"jump": READ})

    @tool
    def jumps(x: int) -> list[Command]:
        """Route the graph twice."""
        return [Command(goto="finalize")]

    with pytest.raises(ValueError, match=r"'jumps' is annotated to return only langgraph Commands"):
        build_graph(ScriptedChatModel(script=[]), [jumps], policies={"jumps": READ})


def test_a_tool_that_may_return_a_command_is_accepted_and_a_value_it_returns_is_its_answer(db):
    """As langchain-mcp-adapters annotates its tools (`... | Command`): the annotation alone is not refused."""

    @tool
    def maybe(x: int) -> str | Command:
        """Answer, or (never, here) route the graph."""
        return f"value {x}"

    with open_sqlite(db) as saver:
        model = ScriptedChatModel(script=[reply(calls=[call("maybe", {"x": 3}, "m1")]), reply("done")])
        graph = build_graph(model, [maybe], policies={"maybe": READ}, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert answers(out)["m1"].content == "value 3" and out["status"] == "completed"


def test_a_command_returned_anyway_is_a_tool_error_and_writes_no_state(db):
    @tool
    def sneaky(x: int):
        """Returns a Command although not annotated to."""
        return Command(update={"status": "completed", "answer": "forged"}, goto="finalize")

    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=[reply(calls=[call("sneaky", {"x": 1}, "s1")]), reply("real answer")]),
            [sneaky],
            policies={"sneaky": READ},
            checkpointer=saver,
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    error = json.loads(answers(out)["s1"].content)["error"]
    assert error["type"] == "tool_error" and "returned a langgraph Command" in error["message"]
    assert out["status"] == "completed" and out["answer"] == "real answer"


class ToolRunRecorder(BaseCallbackHandler):
    """What LangSmith's tracer sees: every run with its parent, tags and metadata."""

    def __init__(self) -> None:
        self.runs: dict[UUID, dict[str, Any]] = {}
        self.ended: set[UUID] = set()

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        self.runs[run_id] = {"kind": "chain", "name": kwargs.get("name"), "parent": parent_run_id}

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.runs[run_id] = {
            "kind": "tool",
            "name": serialized.get("name"),
            "parent": parent_run_id,
            "tags": tags or [],
            "metadata": metadata or {},
        }

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.ended.add(run_id)

    def tools(self) -> list[dict[str, Any]]:
        return [{**r, "id": k} for k, r in self.runs.items() if r["kind"] == "tool"]

    def ancestors(self, run_id: UUID) -> list[str]:
        names, parent = [], self.runs[run_id]["parent"]
        while parent is not None and parent in self.runs:
            names.append(self.runs[parent]["name"])
            parent = self.runs[parent]["parent"]
        return names


def _traced_graph(saver: Any, store: BaseStore) -> Any:
    script = [
        reply(calls=[call("echo_ids", {"x": 1}, "r1"), call("save_note", {"text": "t"}, "w1")]),
        reply("done"),
    ]
    graph, _ = run_notes(saver, store, script)
    return graph


def _check_traced(recorder: ToolRunRecorder) -> None:
    by_call = {r["metadata"].get("gatedloop_tool_call_id"): r for r in recorder.tools()}
    assert set(by_call) == {"r1", "w1"}
    read, write = by_call["r1"], by_call["w1"]
    assert read["name"] == "echo_ids" and write["name"] == "save_note"
    assert {"tool_call_id:r1", "effect:read", "decision:auto"} <= set(read["tags"])
    assert {"tool_call_id:w1", "effect:write", "decision:approve", "reviewer:ops"} <= set(write["tags"])
    assert write["metadata"]["gatedloop_reviewer"] == "ops" and write["metadata"]["gatedloop_effect"] == "write"
    for run in (read, write):
        assert "execute" in recorder.ancestors(run["id"]), recorder.ancestors(run["id"])
        assert run["id"] in recorder.ended


def test_a_callback_recorder_sees_each_tool_run_under_execute_tagged(db):
    recorder = ToolRunRecorder()
    with open_sqlite(db) as saver:
        graph = _traced_graph(saver, InMemoryStore())
        config = {**CFG, "callbacks": [recorder]}
        graph.invoke({"messages": [("user", "go")]}, config, context=CallContext(user_id="ana"))
        answer = {"decisions": [{"type": "approve"}], "reviewer": "ops"}
        out = graph.invoke(Command(resume=answer), config, context=CallContext(user_id="ops"))
    assert out["status"] == "completed"
    _check_traced(recorder)


def test_the_recorder_sees_the_same_under_ainvoke(tmp_path):
    recorder = ToolRunRecorder()

    async def main() -> dict:
        async with open_async_sqlite(tmp_path / "runs.sqlite") as saver:
            graph = _traced_graph(saver, InMemoryStore())
            config = {**CFG, "callbacks": [recorder]}
            await graph.ainvoke({"messages": [("user", "go")]}, config, context=CallContext(user_id="ana"))
            answer = {"decisions": [{"type": "approve"}], "reviewer": "ops"}
            return await graph.ainvoke(Command(resume=answer), config, context=CallContext(user_id="ops"))

    assert asyncio.run(main())["status"] == "completed"
    _check_traced(recorder)


def test_a_tool_that_needs_a_store_without_one_fails_as_a_tool_error(db):
    tools: list[BaseTool] = [echo_ids]
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=[reply(calls=[call("echo_ids", {"x": 1}, "x1")]), reply("ok")]),
            tools,
            policies={"echo_ids": READ},
            checkpointer=saver,
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert json.loads(answers(out)["x1"].content)["error"]["type"] == "tool_error"
