"""Porting from `create_agent` (issue 22, item 7): your own `context_schema`, and errors that tell an unknown thread
from a finished one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gate_app import build, effects_for

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.threads import UnknownThread
from gatedloop.graph import runs
from gatedloop.nodes.wire.hitl import InvalidDecision


@dataclass(frozen=True)
class TenantContext:
    """A context_schema a create_agent user may already have: identity plus fields of their own."""

    user_id: str
    roles: frozenset[str] = frozenset()
    tenant: str = "acme"


def test_your_context_schema_is_the_graphs_and_its_user_id_and_roles_are_the_identity(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver), approvers={"finance"}, context_schema=TenantContext)
        assert "tenant" in graph.get_context_jsonschema()["properties"]  # what Studio's context form shows
        out = runs.start(graph, "t1", "pay 500 to bo as c1", context=TenantContext("ana", frozenset({"staff"})))
        assert out["__interrupt__"][0].value["action_requests"][0]["requested_by"] == "ana"
        with pytest.raises(InvalidDecision, match="finance"):
            runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=TenantContext("cy"))
        out = runs.resume(
            graph, "t1", {"decisions": [{"type": "approve"}]}, context=TenantContext("bo", frozenset({"finance"}))
        )
        assert out["status"] == "completed"
        assert [a for _, a, _ in effects_for(saver).rows("pay")] == [{"amount": 500.0, "to": "bo"}]


def test_resuming_an_unknown_thread_is_not_the_same_error_as_resuming_a_finished_one(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver))
        with pytest.raises(UnknownThread, match="unknown thread 'nope'"):
            runs.resume(graph, "nope", {"decisions": [{"type": "approve"}]})
        assert saver.ledger.thread_graph("nope") is None  # nothing recorded for a thread that does not exist
        runs.start(graph, "t1", "pay 5 to cy as c1")  # small: no approval needed
        with pytest.raises(InvalidDecision, match="is not waiting for an answer"):
            runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]})


def test_call_ids_numbered_by_the_messages_sent_repeat_under_summarization_and_the_stop_says_so():
    """A scripted model ported from create_agent's tests numbers its calls by the messages it is sent. create_agent's
    summarization replaces the thread, so the repeated ids never meet; gatedloop keeps the thread whole, and a
    repeated id is refused: the stop must say that ids are unique across the thread and what to do. A `call()`
    without an id gets one unique in the thread (notebooks/05_migrating_from_create_agent.ipynb shows both)."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply
    from gatedloop.tools import ToolPolicy

    @tool
    def look(q: str) -> str:
        """Look something up (read)."""
        return f"found {q}"

    def statuses(numbered: bool) -> list[tuple[str, str | None]]:
        def responder(messages: list[BaseMessage]) -> Any:
            if isinstance(messages[-1], ToolMessage):
                return reply("done")
            return reply(calls=[call("look", {"q": messages[-1].text}, f"call_{len(messages)}" if numbered else None)])

        summarizer = ScriptedChatModel(responder=lambda messages: reply("SUMMARY"))
        graph = build_graph(
            ScriptedChatModel(responder=responder),
            [look],
            policies={"look": ToolPolicy(effect="read", approval="never")},
            middleware=[SummarizationMiddleware(summarizer, trigger=("messages", 6), keep=("messages", 2))],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t"}}
        outs = [graph.invoke({"messages": [HumanMessage(f"q{n}")]}, config) for n in range(4)]
        return [(out["status"], out.get("stop_detail")) for out in outs]

    stops = [detail for status, detail in statuses(numbered=True) if status != "completed"]
    assert stops and "was used by an earlier call of this thread" in stops[0]
    assert "unique across the whole thread" in stops[0] and "leave the id out of call()" in stops[0]
    assert [status for status, _ in statuses(numbered=False)] == ["completed"] * 4
