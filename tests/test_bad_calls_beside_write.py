"""Bad calls beside a gated write (review finding 9): a reply that mixes a well-formed gated write with calls
that cannot run (broken JSON in `invalid_tool_calls`, under a known or an unknown name; an unknown name with valid
JSON; arguments that miss the schema; a reused id) never stops the thread. Each bad call is answered with one
structured error, the reviewer is asked about exactly the writes that validated, and after the approval the
thread ends with a status; nothing runs that was not approved. Driven on a real SQLite file."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import assert_each_call_answered_once
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import STATUSES, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, reply
from gatedloop.tools import ToolPolicy

KNOWN = ("book", "lookup")
POLICIES = {
    "book": ToolPolicy(effect="write", approval="always"),
    "lookup": ToolPolicy(effect="read", approval="never"),
}


def make_tools(ran: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    @tool
    def lookup(query: str) -> dict[str, Any]:
        """Look up a price (read)."""
        ran.append(("lookup", {"query": query}))
        return {"price": 3}

    @tool
    def book(item: str, quantity: int) -> dict[str, Any]:
        """Book an item (write)."""
        ran.append(("book", {"item": item, "quantity": quantity}))
        return {"booked": item}

    return [lookup, book]


def response(tool_calls: list[dict[str, Any]], invalid: list[dict[str, Any]]) -> AIMessage:
    """An AIMessage as a provider client returns it: parsed calls, unparseable ones, a finish status."""
    return AIMessage(
        content="",
        tool_calls=[{**c, "type": "tool_call"} for c in tool_calls],
        invalid_tool_calls=[{**c, "type": "invalid_tool_call"} for c in invalid],
        response_metadata={"finish_reason": "tool_calls", "model_name": "scripted"},
    )


def structured_error(message: ToolMessage) -> dict[str, Any]:
    """Invariant 5: `{"ok": false, "error": {"type", "message", "retryable"}}`, no internal exception text."""
    body = json.loads(message.content if isinstance(message.content, str) else "")
    assert body["ok"] is False, body
    assert set(body["error"]) >= {"type", "message", "retryable"}, body
    assert "Traceback" not in message.content and "KeyError" not in message.content, body
    return body["error"]


def answers_by_id(messages: list[Any]) -> dict[str, list[ToolMessage]]:
    found: dict[str, list[ToolMessage]] = {}
    for m in messages:
        if isinstance(m, ToolMessage):
            found.setdefault(m.tool_call_id, []).append(m)
    return found


def test_unknown_tool_with_broken_json_beside_a_gated_write_is_answered_and_the_write_is_asked(tmp_path: Path):
    ran: list[tuple[str, dict[str, Any]]] = []
    write = {"name": "book", "args": {"item": "seat", "quantity": 2}, "id": "w1"}
    bad = {"name": "GET_PRICE", "args": "", "id": "bad1", "error": "arguments are not valid JSON"}
    model = ScriptedChatModel(script=[response([write], [bad]), reply("booked")])
    cfg = {"configurable": {"thread_id": "finding-9"}}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, make_tools(ran), policies=POLICIES, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "book a seat")]}, cfg)
        request = out["__interrupt__"][0].value
        assert [(a["tool_call_id"], a["name"], a["args"]) for a in request["action_requests"]] == [
            ("w1", "book", {"item": "seat", "quantity": 2})
        ]
        paused = graph.get_state(cfg).values["messages"]
        assert structured_error(answers_by_id(paused)["bad1"][0])["type"] == "unknown_tool"
        assert ran == []
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert "__interrupt__" not in out
    assert out["status"] == "completed"
    assert ran == [("book", {"item": "seat", "quantity": 2})]
    assert_each_call_answered_once(out["messages"])
    model.assert_complete()


# One entry of a reply: what it is, and how it is sent (`tool_calls` or `invalid_tool_calls`).
WRITE = st.builds(lambda n: ("write", {"item": f"seat{n}", "quantity": n}), st.integers(1, 9))
READ = st.just(("read", None))
BAD_JSON = st.tuples(
    st.just("bad_json"),
    st.tuples(
        st.sampled_from(["GET_PRICE", "book", "lookup", "Book", "", None, "bооk"]),
        st.sampled_from(["", "{", '{"item": "seat"', "not json", "[1, 2]", None]),
    ),
)
UNKNOWN = st.tuples(
    st.just("unknown"),
    st.tuples(
        st.sampled_from(["GET_PRICE", "Book", "lookup ", "", "bооk", "book\n"]),
        st.sampled_from([{}, {"item": "seat", "quantity": 1}, {"query": "x"}]),
    ),
)
MISFIT = st.tuples(st.just("misfit"), st.sampled_from([{"item": "seat"}, {"item": "seat", "quantity": "two"}, {}]))
ENTRY = st.one_of(READ, BAD_JSON, UNKNOWN, MISFIT, WRITE)

_DB = itertools.count()


def build_turn(
    entries: list[tuple[str, Any]], prefix: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, tuple[str, Any]]]:
    """The reply's `tool_calls`, its `invalid_tool_calls`, and what each call id is."""
    calls: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    kinds: dict[str, tuple[str, Any]] = {}
    for index, (kind, data) in enumerate(entries):
        call_id = f"{prefix}{index}"
        if kind == "write":
            calls.append({"name": "book", "args": data, "id": call_id})
        elif kind == "read":
            data = {"query": f"q{index}"}  # distinct reads: no repeat detection in play
            calls.append({"name": "lookup", "args": data, "id": call_id})
        elif kind == "bad_json":
            name, text = data
            invalid.append({"name": name, "args": text, "id": call_id, "error": "invalid JSON"})
        elif kind == "unknown":
            calls.append({"name": data[0], "args": data[1], "id": call_id})
        else:
            calls.append({"name": "book", "args": data, "id": call_id})
        kinds[call_id] = (kind, data)
    return calls, invalid, kinds


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    write=WRITE,
    others=st.lists(ENTRY, max_size=5),
    order=st.randoms(use_true_random=False),
    duplicate=st.none() | st.integers(0, 5),
)
def test_bad_calls_beside_a_gated_write_never_stop_the_thread(tmp_path: Path, write, others, order, duplicate):
    ran: list[tuple[str, dict[str, Any]]] = []
    entries = [write, *others]
    order.shuffle(entries)
    calls, invalid, kinds = build_turn(entries, "c")
    script: list[AIMessage] = []
    discarded: set[str] = set()
    if duplicate is not None:
        # A reused id makes the whole reply malformed (invariant 4): it never enters the history, nothing of it
        # runs or is asked, and the model is asked again; here it answers with the same calls, ids fixed.
        reused = list(kinds)[duplicate % len(kinds)]
        twin = {"name": "GET_PRICE", "args": {"query": "x"}, "id": reused}
        script.append(response([*calls, twin], invalid))
        discarded = set(kinds)
        calls, invalid, kinds = build_turn(entries, "r")
    script += [response(calls, invalid), reply("done")]
    model = ScriptedChatModel(script=script)
    writes = [(c["id"], "book", c["args"]) for c in calls if kinds[c["id"]][0] == "write"]
    reads = [("lookup", c["args"]) for c in calls if kinds[c["id"]][0] == "read"]
    bad = {call_id: kind for call_id, (kind, _) in kinds.items() if kind in ("bad_json", "unknown", "misfit")}
    cfg = {"configurable": {"thread_id": "mix"}}

    with open_sqlite(tmp_path / f"mix{next(_DB)}.sqlite") as saver:
        graph = build_graph(model, make_tools(ran), policies=POLICIES, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "book")]}, cfg)

        request = out["__interrupt__"][0].value
        assert [(a["tool_call_id"], a["name"], a["args"]) for a in request["action_requests"]] == writes
        assert ran == []  # nothing runs before the approval: reads wait in `execute`, after `approve`
        paused = graph.get_state(cfg).values["messages"]
        answered = answers_by_id(paused)
        assert set(answered) == set(bad), (sorted(answered), sorted(bad))
        for call_id, kind in bad.items():
            assert len(answered[call_id]) == 1, call_id
            error = structured_error(answered[call_id][0])
            name = kinds[call_id][1][0] if kind in ("bad_json", "unknown") else "book"
            expected = "invalid_arguments" if name in KNOWN and kind != "unknown" else "unknown_tool"
            assert error["type"] == expected, (call_id, kind, error)

        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}] * len(writes)}), cfg)

    assert "__interrupt__" not in out
    assert out["status"] in STATUSES and out["status"] == "completed", out.get("stop_detail")
    assert sorted(ran, key=repr) == sorted([(n, a) for _, n, a in writes] + reads, key=repr)
    assert_each_call_answered_once(out["messages"])
    ai = [m for m in out["messages"] if isinstance(m, AIMessage)]
    every_id = {c["id"] for m in ai for c in [*m.tool_calls, *m.invalid_tool_calls]}
    assert not (discarded & every_id), "a reply with a reused id entered the history"
    model.assert_complete()
