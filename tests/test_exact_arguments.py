"""Arguments are exact (issue 10, finding 6): NaN and infinities, nesting past the cap, lone surrogates and
integers beyond 64 bits are `invalid_arguments` wherever arguments enter, on a real SQLite file through the
real graph. Nothing raises out of a node, nothing runs, nobody is asked, and the thread goes on.

The model's path goes through the real `langchain-openai` client over HTTP (streamed and not), which parses
tool arguments with Python's lenient `json.loads` before gatedloop sees them; the reviewer's path goes through
`runs.resume` and through a bare `graph.invoke(Command(resume=...))`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import assert_each_call_answered_once
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command
from openai_stub import Reply, ScriptedOpenAIServer, chat_openai, tool_call
from pg_server import require_postgres

from gatedloop.checkpoints import open_async_sqlite, open_sqlite
from gatedloop.checkpoints.exact import InexactResume
from gatedloop.graph import build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import ToolPolicy
from gatedloop.tools.arguments import MAX_DEPTH, argument_problem, text_nested_deeper_than

APPROVE = {"decisions": [{"type": "approve"}]}


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


class Payments:
    """A `pay` write gated above 100 and capped at 1000, and a `note` read taking any JSON; both record runs."""

    def __init__(self) -> None:
        self.paid: list[dict[str, Any]] = []
        self.noted: list[Any] = []

        @tool
        def pay(amount: float, to: str) -> dict[str, Any]:
            """Pay someone."""
            self.paid.append({"amount": amount, "to": to})
            return {"paid": amount, "to": to}

        @tool
        def note(data: Any) -> str:
            """Keep a note (any JSON)."""
            self.noted.append(data)
            return "noted"

        self.tools = [pay, note]
        self.policies = {
            "pay": ToolPolicy(
                effect="write",
                approval=lambda args, _ctx: args["amount"] > 100,
                validator=lambda args, _ctx: "payments are capped at 1000" if args["amount"] > 1000 else None,
            ),
            "note": ToolPolicy(effect="read", approval="never"),
        }

    @property
    def ran(self) -> list[Any]:
        return [*self.paid, *self.noted]


def answers(messages: list[BaseMessage]) -> dict[str, dict[str, Any]]:
    return {m.tool_call_id: json.loads(m.content) for m in messages if isinstance(m, ToolMessage)}


# --------------------------------------------------------------------- the model's path, real client over HTTP

RAW = {
    "NaN": ("pay", '{"amount": NaN, "to": "mallory"}'),
    "Infinity": ("pay", '{"amount": Infinity, "to": "mallory"}'),
    "-Infinity": ("pay", '{"amount": -Infinity, "to": "mallory"}'),
    "1e999 (read as inf)": ("pay", '{"amount": 1e999, "to": "mallory"}'),
    "lone surrogate in a value": ("pay", '{"amount": 5, "to": "x\\ud800y"}'),
    "integer of 5000 digits": ("pay", '{"amount": ' + "9" * 5000 + ', "to": "x"}'),
    "lone surrogate in a key": ("note", '{"data": {"\\udc00": 1}}'),
    "integer beyond 64 bits": ("note", '{"data": 36893488147419103232}'),
    "nested 5000 deep": ("note", '{"data": ' + "[" * 5000 + "]" * 5000 + "}"),
    "nested 33 deep": ("note", '{"data": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"),
}


@pytest.mark.parametrize("streaming", [False, True], ids=["non-streamed", "streamed"])
@pytest.mark.parametrize("kind", RAW, ids=RAW.keys())
def test_inexact_arguments_from_the_openai_client_are_refused_and_the_thread_goes_on(
    tmp_path: Path, kind: str, streaming: bool
):
    """`amount: NaN` passed both `amount > 100` (no approval) and the validator's `amount > 1000`, and paid;
    5000-deep arguments raised RecursionError out of `validate` on every resume; a lone surrogate raised
    UnicodeEncodeError to the caller. Now each is answered `invalid_arguments`, and the model goes on."""
    app = Payments()
    replies = [
        Reply(tool_calls=[tool_call(*RAW[kind], "call_bad")], arg_chunk_size=97),
        Reply(content="I could not pay."),
        Reply(tool_calls=[tool_call("pay", {"amount": 5, "to": "ana"}, "call_ok")]),
        Reply(content="Paid 5 to ana."),
    ]
    with ScriptedOpenAIServer(replies) as server, open_sqlite(tmp_path / "runs.sqlite") as saver:
        model = chat_openai(server.base_url, streaming=streaming)
        graph = build_graph(model, app.tools, policies=app.policies, checkpointer=saver)
        out = runs.start(graph, "t", "pay mallory")
        assert "__interrupt__" not in out, "nobody is asked about arguments that cannot be exact"
        assert app.ran == []
        assert (out["status"], out["answer"]) == ("completed", "I could not pay.")
        error = answers(out["messages"])["call_bad"]["error"]
        assert error["type"] == "invalid_arguments"
        assert_each_call_answered_once(out["messages"])
        sent_back = server.requests[1]["messages"][-1]
        assert sent_back["tool_call_id"] == "call_bad" and json.loads(sent_back["content"])["error"] == error

        out = runs.start(graph, "t", "then pay ana 5")
        assert (out["status"], app.paid) == ("completed", [{"amount": 5.0, "to": "ana"}])
        assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (float("nan"), "finite"),
        (float("-inf"), "finite"),
        ("x\ud800y", "Unicode"),
        ({"\udfff": 1}, "Unicode"),
        ({1: "a"}, "keys must be strings"),
        (2**64, "64 bits"),
        (-(2**63) - 1, "64 bits"),
        (nested(MAX_DEPTH), f"nested deeper than {MAX_DEPTH}"),
        (nested(100_000), f"nested deeper than {MAX_DEPTH}"),
        ({1, 2}, "JSON data"),
        (b"bytes", "JSON data"),
    ],
    ids=[
        "nan",
        "-inf",
        "surrogate",
        "surrogate key",
        "int key",
        "2**64",
        "-2**63-1",
        "33 deep",
        "100000 deep",
        "set",
        "bytes",
    ],
)
def test_argument_problem_names_the_first_problem_without_recursing(value: Any, problem: str):
    found = argument_problem({"v": value})
    assert found is not None and problem in found


def test_exact_values_at_the_edges_pass():
    edge = {"a": [2**63 - 1, -(2**63), 1.5e308, -0.0, True, None, "é\U0001f600"], "b": nested(MAX_DEPTH - 2)}
    assert argument_problem(edge) is None


# ------------------------------------------------------------------------------------ the reviewer's path

NASTY_EDITS = {
    "NaN amount": {"amount": float("nan"), "to": "ana"},
    "infinite amount": {"amount": float("inf"), "to": "ana"},
    "lone surrogate": {"amount": 500, "to": "x\ud800y"},
    "integer beyond 64 bits": {"amount": 2**70, "to": "ana"},
    "nested 5000 deep": {"amount": 500, "to": nested(5000)},
}


def gated_payment(saver: Any, app: Payments, thread: str = "t") -> Any:
    model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 500, "to": "ana"}, "p1")]), reply("done")])
    graph = build_graph(model, app.tools, policies=app.policies, checkpointer=saver)
    out = runs.start(graph, thread, "pay ana 500")
    assert "__interrupt__" in out
    return graph


def edit(args: Any) -> dict[str, Any]:
    return {"decisions": [{"type": "edit", "edited_action": {"name": "pay", "args": args}}]}


@pytest.mark.parametrize("kind", NASTY_EDITS, ids=NASTY_EDITS.keys())
def test_an_inexact_edit_through_runs_resume_is_refused_and_changes_nothing(tmp_path: Path, kind: str):
    app = Payments()
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = gated_payment(saver, app)
        before = runs.pending_request(graph, "t")
        with pytest.raises(InvalidDecision, match="cannot be used"):
            runs.resume(graph, "t", edit(NASTY_EDITS[kind]))
        assert runs.pending_request(graph, "t") == before and app.ran == []
        out = runs.resume(graph, "t", APPROVE)
    assert out["status"] == "completed" and app.paid == [{"amount": 500.0, "to": "ana"}]


@pytest.mark.parametrize("kind", NASTY_EDITS, ids=NASTY_EDITS.keys())
def test_an_inexact_edit_through_a_bare_command_runs_nothing_and_the_next_answer_is_the_one_applied(
    tmp_path: Path, kind: str
):
    """The bug: LangGraph stores the resume value before any node sees it, and its serializer stores a lone
    surrogate as "?": refused on first sight, the edit came back from the checkpoint as `x?y` on the next
    resume and ran, whatever the reviewer answered then."""
    app = Payments()
    cfg = runs.config_for("t")
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = gated_payment(saver, app)
        try:
            out = graph.invoke(Command(resume=edit(NASTY_EDITS[kind])), cfg)
        except InexactResume:
            pass  # refused before it was stored: the thread is as it was
        else:
            assert "not valid" in out["__interrupt__"][0].value["error"]
        assert app.ran == []
        out = graph.invoke(Command(resume={"decisions": [{"type": "reject", "message": "no"}]}), cfg)
        assert out["status"] == "completed" and app.ran == []
        assert answers(out["messages"])["p1"]["error"]["type"] == "rejected_by_reviewer"
        assert_each_call_answered_once(out["messages"])


# ------------------------------------------------------------------------------------------- property test


def _nasty_leaf() -> st.SearchStrategy[Any]:
    surrogate = st.characters(categories=["Cs"])
    return st.one_of(
        st.sampled_from([float("nan"), float("inf"), float("-inf")]),
        st.integers(min_value=2**63, max_value=2**80) | st.integers(min_value=-(2**80), max_value=-(2**63) - 1),
        st.tuples(st.text(max_size=3), surrogate, st.text(max_size=3)).map("".join),
        st.builds(lambda key, v: {key: v}, surrogate, st.integers(0, 9)),
        st.builds(nested, st.integers(MAX_DEPTH, 5000)),
    )


NASTY = st.builds(
    lambda leaf, path, sibling: _place(leaf, path, sibling),
    _nasty_leaf(),
    st.lists(st.sampled_from(["list", "dict"]), max_size=4),
    st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5)),
)


def _place(leaf: Any, path: list[str], sibling: Any) -> dict[str, Any]:
    """The nasty value at some shallow depth, with ordinary values beside it."""
    value = leaf
    for step in reversed(path):
        value = [sibling, value] if step == "list" else {"ok": sibling, "bad": value}
    return {"amount": 5, "to": "ana", "extra": value}


class NoCopyModel(ScriptedChatModel):
    """The scripted model, minus its deep copy of each reply (copy.deepcopy recurses on a 5000-deep value):
    a provider client can hand such arguments to the loop."""

    def next_reply(self, messages: list[BaseMessage]) -> AIMessage:
        assert self.responder is not None
        planned = self.responder(list(messages))
        assert planned is not None
        return planned


@pytest.fixture(scope="module")
def property_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with open_sqlite(tmp_path_factory.mktemp("exact") / "runs.sqlite") as saver:
        yield saver


_threads = iter(range(10**9))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=NASTY)
def test_any_inexact_arguments_from_the_model_run_nothing_and_the_thread_resumes(property_db: Any, args: Any):
    assert argument_problem(args) is not None
    app = Payments()
    tools = {"note": {"data": args}, "pay": args}

    def respond(messages: list[BaseMessage]) -> AIMessage:
        asked = [m for m in messages if m.type == "human"]
        last = messages[-1]
        if isinstance(last, ToolMessage):
            return reply("ok")
        if len(asked) == 1:
            return reply(calls=[call(name, value, f"c{name}") for name, value in tools.items()])
        return reply(calls=[call("pay", {"amount": 5, "to": "ana"}, "cgood")])

    graph = build_graph(NoCopyModel(responder=respond), app.tools, policies=app.policies, checkpointer=property_db)
    thread = f"p{next(_threads)}"
    out = runs.start(graph, thread, "go")
    assert "__interrupt__" not in out and app.ran == []
    assert {k: v["error"]["type"] for k, v in answers(out["messages"]).items()} == {
        "cnote": "invalid_arguments",
        "cpay": "invalid_arguments",
    }
    out = runs.start(graph, thread, "again")
    assert out["status"] == "completed" and app.paid == [{"amount": 5.0, "to": "ana"}]
    assert_each_call_answered_once(out["messages"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=NASTY, bare=st.booleans())
def test_any_inexact_edit_runs_nothing_and_the_request_can_still_be_answered(property_db: Any, args: Any, bare: bool):
    app = Payments()
    model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 500, "to": "ana"}, "p1")]), reply("done")])
    graph = build_graph(model, app.tools, policies=app.policies, checkpointer=property_db)
    thread = f"e{next(_threads)}"
    assert "__interrupt__" in runs.start(graph, thread, "pay ana 500")
    if bare:
        with contextlib.suppress(InexactResume):  # refused before it was stored
            graph.invoke(Command(resume=edit(args)), runs.config_for(thread))
    else:
        with pytest.raises(InvalidDecision):
            runs.resume(graph, thread, edit(args))
    assert app.ran == []
    out = runs.resume(graph, thread, APPROVE)
    assert out["status"] == "completed" and app.paid == [{"amount": 500.0, "to": "ana"}]
    assert not math.isnan(app.paid[0]["amount"])


# ------------------------------------------------------------------------------- every saver, sync and async

BACKENDS = ["sqlite", "sqlite-async", "postgres", "postgres-async"]


async def _bare_edit_then_reject(open_saver: Any, app: Payments, thread: str) -> tuple[bool, dict[str, Any]]:
    async with open_saver() as saver:
        model = ScriptedChatModel(script=[reply(calls=[call("pay", {"amount": 500, "to": "ana"}, "p1")]), reply("ok")])
        graph = build_graph(model, app.tools, policies=app.policies, checkpointer=saver)
        cfg = runs.config_for(thread)
        assert "__interrupt__" in await graph.ainvoke({"messages": [("user", "pay")]}, cfg, durability="sync")
        refused = False
        try:
            await graph.ainvoke(Command(resume=edit({"amount": 500, "to": "x\ud800y"})), cfg, durability="sync")
        except InexactResume:
            refused = True
        reject = Command(resume={"decisions": [{"type": "reject", "message": "no"}]})
        return refused, await graph.ainvoke(reject, cfg, durability="sync")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_saver_refuses_to_store_an_inexact_resume_value(tmp_path: Path, backend: str):
    """Each of gatedloop's savers refuses the write (`InexactResume`) instead of storing `x?y`, so the refused
    edit can never come back from the checkpoint; the reviewer's next answer is the one applied."""
    app = Payments()
    thread = f"inexact-{uuid.uuid4().hex[:12]}"
    if backend.startswith("postgres"):
        url = require_postgres()
        from gatedloop.checkpoints.postgres import open_async_postgres, open_postgres

        sync_open, async_open = (lambda: open_postgres(url)), (lambda: open_async_postgres(url))
    else:
        path = tmp_path / "runs.sqlite"
        sync_open, async_open = (lambda: open_sqlite(path)), (lambda: open_async_sqlite(path))
    if backend.endswith("async"):
        refused, out = asyncio.run(_bare_edit_then_reject(async_open, app, thread))
    else:
        with sync_open() as saver:
            graph = gated_payment(saver, app, thread)
            cfg = runs.config_for(thread)
            with pytest.raises(InexactResume, match="Unicode"):
                graph.invoke(Command(resume=edit({"amount": 500, "to": "x\ud800y"})), cfg)
            refused = True
            out = graph.invoke(Command(resume={"decisions": [{"type": "reject", "message": "no"}]}), cfg)
    assert refused and app.ran == []
    assert out["status"] == "completed"
    assert answers(out["messages"])["p1"]["error"]["type"] == "rejected_by_reviewer"


# ------------------------------------------------------------------------------------- depth of JSON text

TRICKY = '[]{}"\\ab'
TRICKY_TEXT = st.recursive(
    st.one_of(st.integers(-9, 9), st.text(alphabet=TRICKY, max_size=6)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet=TRICKY, max_size=3), inner),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


@settings(max_examples=200, deadline=None)
@given(value=TRICKY_TEXT, limit=st.integers(0, 6))
def test_the_depth_of_json_text_is_read_without_parsing_and_strings_do_not_count(value: Any, limit: int):
    assert text_nested_deeper_than(json.dumps(value), limit) is (_depth(value) > limit)


def test_unterminated_strings_full_of_escaped_quotes_are_read_in_one_pass():
    """A backtracking string pattern took 45 s on this 64,001-character text; the scan reads it once."""
    text = '"' + '\\"' * 32_000
    assert text_nested_deeper_than(text, MAX_DEPTH) is False
    assert text_nested_deeper_than(text + "]" + "[" * 33, MAX_DEPTH) is False  # inside the open string
