"""One call from the model's reply to its ToolMessage: arguments read once at entry, carried as one value.

Also pins the read path for plans written by earlier versions (`args={"__raw__": text}`), which a thread stopped
between `model` and `validate` still holds when it resumes.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.evidence import Proposal
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolFailure, ToolPolicy
from gatedloop.tools.arguments import args_digest

CFG = {"configurable": {"thread_id": "a1"}}
READ = ToolPolicy(effect="read", approval="never")
UNGATED_WRITE = ToolPolicy(effect="write", approval="never")


def tools(ran: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    @tool
    def search(query: str, limit: int = 3) -> str:
        """Search (read)."""
        ran.append(("search", {"query": query, "limit": limit}))
        return f"hits for {query}"

    @tool
    def transfer(amount: int, to: str) -> str:
        """Move money (write)."""
        ran.append(("transfer", {"amount": amount, "to": to}))
        return f"sent {amount} to {to}"

    return [search, transfer]


def answers(messages: list[Any]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def test_one_reply_followed_to_its_answers(db: str) -> None:
    """Malformed arguments are answered `invalid_arguments` and never run; readable ones run with exactly the
    value read when the reply arrived (a read's fence repaired once, at entry)."""
    ran: list[tuple[str, dict[str, Any]]] = []
    script = [
        reply(
            calls=[
                call("transfer", '{"amount": 5, "to": "bob"', "w-broken"),
                call("search", '```json\n{"query": "fenced", "limit": 2}\n```', "r-fenced"),
                call("transfer", {"amount": 7, "to": "ana"}, "w-ok"),
            ]
        ),
        reply("done"),
    ]
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=script),
            tools(ran),
            policies={"search": READ, "transfer": UNGATED_WRITE},
            checkpointer=saver,
        )
        updates = list(graph.stream({"messages": [("user", "go")]}, CFG, stream_mode="updates"))
        messages = graph.get_state(CFG).values["messages"]
        audit = saver.ledger.audit("a1")

    entered = {p["id"]: p for p in next(u["model"]["calls"] for u in updates if u.get("model", {}).get("calls"))}
    assert entered["w-broken"]["args"] == {} and entered["w-broken"]["unread"]["text"] == '{"amount": 5, "to": "bob"'
    assert "invalid JSON" in entered["w-broken"]["unread"]["problem"]
    assert entered["r-fenced"]["args"] == {"query": "fenced", "limit": 2}
    assert entered["r-fenced"]["repair"] == "removed code fence"
    assert entered["w-ok"]["digest"] == args_digest("transfer", {"amount": 7, "to": "ana"}), "computed at entry"

    assert sorted(ran) == [("search", {"query": "fenced", "limit": 2}), ("transfer", {"amount": 7, "to": "ana"})]
    got = answers(messages)
    broken = json.loads(got["w-broken"].content)
    assert got["w-broken"].status == "error" and broken["error"]["type"] == "invalid_arguments"
    assert got["w-broken"].id == "tool-w-broken"
    assert (got["r-fenced"].status, got["r-fenced"].content) == ("success", "hits for fenced")
    assert (got["w-ok"].status, got["w-ok"].content) == ("success", "sent 7 to ana")
    refused = next(e for e in audit if e["event"] == "refused" and e["call_id"] == "w-broken")
    assert refused["detail"]["args"] == {"__raw__": '{"amount": 5, "to": "bob"'}, "the audit shows the text as before"


def test_plans_from_an_earlier_version_resume_as_they_did(db: str) -> None:
    """A thread stopped between `model` and `validate` by an earlier version holds plans whose unread text is
    wrapped as `{"__raw__": text}` (and proposals recorded with that digest): they are read as then."""
    ran: list[tuple[str, dict[str, Any]]] = []
    fenced, broken = '```json\n{"query": "old"}\n```', '{"amount": 5'
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=[reply("hello"), reply("done")]),
            tools(ran),
            policies={"search": READ, "transfer": UNGATED_WRITE},
            checkpointer=saver,
        )
        graph.invoke({"messages": [("user", "hi")]}, CFG)
        turn = AIMessage(
            content="",
            invalid_tool_calls=[
                {"type": "invalid_tool_call", "id": "r-old", "name": "search", "args": fenced, "error": "x"},
                {"type": "invalid_tool_call", "id": "w-old", "name": "transfer", "args": broken, "error": "x"},
            ],
            response_metadata={"finish_reason": "tool_calls"},
        )
        legacy = [
            {"id": i, "name": n, "args": {"__raw__": t}, "verdict": "run", "effect": "write", "digest": ""}
            for i, n, t in (("r-old", "search", fenced), ("w-old", "transfer", broken))
        ]
        saver.ledger.record_proposals(
            "a1", [Proposal(p["id"], p["name"], args_digest(p["name"], p["args"])) for p in legacy]
        )
        graph.update_state(CFG, {"messages": [turn], "calls": legacy}, as_node="model")
        assert graph.get_state(CFG).next == ("validate",)
        out = graph.invoke(None, CFG)
        audit = saver.ledger.audit("a1")

    assert ran == [("search", {"query": "old", "limit": 3})]
    got = answers(out["messages"])
    assert got["r-old"].content == "hits for old"
    assert json.loads(got["w-old"].content)["error"]["type"] == "invalid_arguments"
    validated = next(e for e in audit if e["event"] == "validated" and e["call_id"] == "r-old")
    assert validated["detail"]["repair"] == "removed code fence"
    assert out["status"] == "completed"


def test_a_validators_failure_reaches_the_model_as_raised(db: str) -> None:
    """A `ToolFailure` from a validator is the refusal itself: its type, message and `retryable` are the answer."""

    def closed_today(args: dict[str, Any], context: Any) -> None:
        raise ToolFailure("The bank is closed today.", error_type="tool_error", retryable=False)

    ran: list[tuple[str, dict[str, Any]]] = []
    script = [reply(calls=[call("transfer", {"amount": 1, "to": "bo"}, "w1")]), reply("done")]
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=script),
            tools(ran),
            policies={"transfer": ToolPolicy(effect="write", approval="never", validator=closed_today)},
            checkpointer=saver,
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert ran == []
    assert json.loads(answers(out["messages"])["w1"].content) == {
        "ok": False,
        "error": {"type": "tool_error", "message": "The bank is closed today.", "retryable": False},
    }
