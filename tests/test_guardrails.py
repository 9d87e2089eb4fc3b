"""Guard rails: complete responses only, argument handling, permissions, budgets, cancel, repeats, results."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from doc_text import section
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.threads import InvalidThreadId, validate_thread_id
from gatedloop.graph import Limits, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import CallContext, ToolPolicy
from gatedloop.tools.results import TRUNCATION_MARKER

CFG = {"configurable": {"thread_id": "g1"}}
READ = ToolPolicy(effect="read", approval="never")


class Recorder:
    """Tools that record every real execution."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.value = "same"

        @tool
        def search(query: str) -> dict[str, Any]:
            """Search (read)."""
            self.calls.append(("search", {"query": query}))
            return {"query": query, "hits": [self.value]}

        @tool
        def big(size: int) -> str:
            """Return a big text (read)."""
            self.calls.append(("big", {"size": size}))
            return "é" * size

        @tool
        def slow(seconds: float) -> str:
            """Sleep (read)."""
            self.calls.append(("slow", {"seconds": seconds}))
            time.sleep(seconds)
            return "slept"

        @tool
        def transfer(amount: int, to: str) -> dict[str, Any]:
            """Move money (write)."""
            self.calls.append(("transfer", {"amount": amount, "to": to}))
            return {"sent": amount, "to": to}

        self.tools = [search, big, slow, transfer]


def make(db_saver, script, *, policies=None, limits=None, recorder=None):
    recorder = recorder or Recorder()
    model = ScriptedChatModel(script=script)
    base = {"search": READ, "big": READ, "slow": ToolPolicy(effect="read", approval="never", timeout_s=0.2)}
    graph = build_graph(
        model, recorder.tools, policies={**base, **(policies or {})}, limits=limits, checkpointer=db_saver
    )
    return graph, model, recorder


def answers(out) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}


def err(message: ToolMessage) -> dict[str, Any]:
    return json.loads(message.content)["error"]


SEARCH = call("search", {"query": "x"}, "s1")


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(reply(calls=[SEARCH], finish_reason="length"), id="length"),
        pytest.param(reply(calls=[SEARCH], finish_reason=None), id="no-finish-status"),
        pytest.param(reply(calls=[SEARCH], finish_reason="weird"), id="unknown-finish-status"),
        pytest.param(reply(calls=[{"name": "search", "args": {"query": "x"}, "id": ""}]), id="missing-id"),
        pytest.param(
            reply(calls=[call("search", {"query": "a"}, "d"), call("search", {"query": "b"}, "d")]), id="duplicate-id"
        ),
        pytest.param(reply(""), id="empty"),
    ],
)
def test_incomplete_responses_never_run_a_tool_and_stop_as_incomplete(db, bad):
    with open_sqlite(db) as saver:
        graph, model, recorder = make(saver, [bad, bad])
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert recorder.calls == []
    assert out["status"] == "incomplete" and out["answer"] is None
    assert len(out["messages"]) == 1, "a discarded response never enters the history"
    model.assert_complete()


def test_an_incomplete_response_is_retried_once_then_the_loop_goes_on(db):
    with open_sqlite(db) as saver:
        graph, model, recorder = make(
            saver, [reply(calls=[SEARCH], finish_reason="length"), reply(calls=[SEARCH]), reply("found")]
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert recorder.calls == [("search", {"query": "x"})]
    assert out["status"] == "completed"
    model.assert_complete()


def test_retries_follow_the_configured_policy(db):
    bad = reply(calls=[SEARCH], finish_reason="length")
    with open_sqlite(db) as saver:
        graph, model, _ = make(saver, [bad, bad, bad, reply("ok")], limits=Limits(model_retries=3))
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == "completed"
    model.assert_complete()


@pytest.mark.parametrize(
    "refusal",
    [reply("", refusal="I can't help with that."), reply("", finish_reason="content_filter")],
    ids=["refusal", "content-filter"],
)
def test_refusals_stop_with_their_own_status(db, refusal):
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, [refusal, refusal])
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == "refused" and recorder.calls == []


def test_a_call_id_reused_from_an_earlier_turn_is_not_run(db):
    with open_sqlite(db) as saver:
        graph, _, recorder = make(
            saver,
            [
                reply(calls=[SEARCH]),
                reply(calls=[call("search", {"query": "y"}, "s1")]),
                reply(calls=[call("search", {"query": "y"}, "s1")]),
            ],
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert recorder.calls == [("search", {"query": "x"})]
    assert out["status"] == "incomplete"
    assert_each_call_answered_once(out["messages"])


def test_model_exceptions_are_retried_then_stop_with_error(db):
    class Broken(ScriptedChatModel):
        def next_reply(self, messages):
            raise RuntimeError("provider down")

    with open_sqlite(db) as saver:
        graph = build_graph(Broken(), Recorder().tools, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert (
        out["status"] == "error" and "RuntimeError" in out["stop_detail"] and "provider down" not in out["stop_detail"]
    )


def test_reads_tolerate_fenced_json_and_the_repair_is_recorded(db):
    fenced = '```json\n{"query": "fenced"}\n```'
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, [reply(calls=[call("search", fenced, "f1")]), reply("ok")])
        graph.invoke({"messages": [("user", "go")]}, CFG)
        audit = saver.ledger.audit("g1")
    assert recorder.calls == [("search", {"query": "fenced"})]
    assert next(e for e in audit if e["event"] == "validated")["detail"]["repair"] == "removed code fence"


def test_writes_need_strict_json(db):
    fenced = 'sure: {"amount": 5, "to": "bob"}'
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, [reply(calls=[call("transfer", fenced, "w1")]), reply("ok")])
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert recorder.calls == [] and "__interrupt__" not in out
    assert err(answers(out)["w1"])["type"] == "invalid_arguments"


def test_business_validator_refuses_before_any_approval_is_asked(db):
    def at_most_100(args, ctx):
        return "amount over the limit of 100" if args["amount"] > 100 else None

    policy = ToolPolicy(effect="write", approval="always", validator=at_most_100)
    with open_sqlite(db) as saver:
        graph, _, recorder = make(
            saver,
            [reply(calls=[call("transfer", {"amount": 500, "to": "x"}, "w1")]), reply("ok")],
            policies={"transfer": policy},
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert "__interrupt__" not in out and recorder.calls == []
    assert err(answers(out)["w1"]) == {
        "type": "invalid_arguments",
        "message": "amount over the limit of 100",
        "retryable": True,
    }


def test_roles_limit_a_tool_and_come_from_the_runtime_context(db):
    policy = ToolPolicy(effect="write", approval="never", roles=frozenset({"treasurer"}))
    script = [reply(calls=[call("transfer", {"amount": 5, "to": "x"}, "w1")]), reply("ok")]
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, script, policies={"transfer": policy})
        out = graph.invoke({"messages": [("user", "go")]}, CFG, context=CallContext(user_id="u1", roles={"clerk"}))
        assert err(answers(out)["w1"])["type"] == "permission_denied" and recorder.calls == []
        graph, _, recorder = make(saver, [*script], policies={"transfer": policy})
        graph.invoke(
            {"messages": [("user", "go")]},
            {"configurable": {"thread_id": "g2"}},
            context={"user_id": "u2", "roles": ["treasurer"]},
        )
    assert recorder.calls == [("transfer", {"amount": 5, "to": "x"})]


def test_approval_predicate_sees_arguments_and_context(db):
    policy = ToolPolicy(effect="write", approval=lambda args, ctx: args["amount"] > 10)
    with open_sqlite(db) as saver:
        graph, _, recorder = make(
            saver,
            [
                reply(
                    calls=[
                        call("transfer", {"amount": 5, "to": "a"}, "small"),
                        call("transfer", {"amount": 50, "to": "b"}, "large"),
                    ]
                ),
                reply("ok"),
            ],
            policies={"transfer": policy},
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
        assert [a["tool_call_id"] for a in out["__interrupt__"][0].value["action_requests"]] == ["large"]
        graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG)
    assert [c[1]["to"] for c in recorder.calls] == ["a", "b"]


def test_tool_call_budget_answers_the_excess_with_budget_exhausted(db):
    calls = [call("search", {"query": str(i)}, f"s{i}") for i in range(4)]
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, [reply(calls=calls), reply("ok")], limits=Limits(max_tool_calls=2))
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert len(recorder.calls) == 2
    assert [err(answers(out)[f"s{i}"])["type"] for i in (2, 3)] == ["budget_exhausted"] * 2
    assert_each_call_answered_once(out["messages"])


def test_per_tool_and_per_turn_caps(db):
    calls = [call("search", {"query": str(i)}, f"s{i}") for i in range(3)] + [call("big", {"size": 1}, "b1")]
    with open_sqlite(db) as saver:
        graph, _, recorder = make(
            saver,
            [reply(calls=calls), reply("ok")],
            policies={"search": ToolPolicy(effect="read", approval="never", max_calls=1)},
            limits=Limits(max_calls_per_turn=3),
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert recorder.calls == [("search", {"query": "0"})]
    assert {k: err(v)["type"] for k, v in answers(out).items() if v.status == "error"} == {
        "s1": "budget_exhausted",
        "s2": "budget_exhausted",
        "b1": "budget_exhausted",
    }


def test_token_budget_stops_before_the_next_model_call(db):
    script = [reply(calls=[call("search", {"query": str(i)}, f"s{i}")], tokens=600) for i in range(3)]
    with open_sqlite(db) as saver:
        graph, model, _ = make(saver, script[:2], limits=Limits(max_tokens=1000))
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == "budget_exhausted" and out["answer"] is None
    assert model.calls == 2
    assert_each_call_answered_once(out["messages"])


def test_deadline_stops_the_run(db):
    with open_sqlite(db) as saver:
        graph, model, _ = make(
            saver, [reply(calls=[call("slow", {"seconds": 0.15}, "z1")])], limits=Limits(deadline_s=0.1)
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == "deadline"
    model.assert_complete()


def test_time_waiting_for_a_person_does_not_count_against_the_deadline(db):
    script = [reply(calls=[call("transfer", {"amount": 1, "to": "a"}, "w1")]), reply("done")]
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, script, limits=Limits(deadline_s=0.5))
        graph.invoke({"messages": [("user", "go")]}, CFG)
        time.sleep(0.6)
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG)
    assert out["status"] == "completed" and len(recorder.calls) == 1


def test_read_timeout_is_a_timeout_error(db):
    with open_sqlite(db) as saver:
        graph, _, _ = make(saver, [reply(calls=[call("slow", {"seconds": 1.0}, "z1")]), reply("ok")])
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert err(answers(out)["z1"]) == {
        "type": "timeout",
        "message": "The tool did not answer within 0.2 s.",
        "retryable": True,
    }


def test_cancel_stops_a_paused_thread_at_the_next_node_without_running_anything(db):
    script = [reply(calls=[call("transfer", {"amount": 1, "to": "a"}, "w1")]), reply("never")]
    with open_sqlite(db) as saver:
        graph, model, recorder = make(saver, script)
        graph.invoke({"messages": [("user", "go")]}, CFG)
        runs.cancel("g1", ledger=saver.ledger)
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CFG)
    assert out["status"] == "cancelled" and recorder.calls == []
    assert err(answers(out)["w1"])["type"] == "cancelled"
    assert model.calls == 1
    assert_each_call_answered_once(out["messages"])


def _stopper(stop: str, saver) -> Any:
    """What stops the request: a cancel request, or time past a 0.05 s deadline (a sleep, never a measurement)."""
    if stop == "cancelled":
        return lambda: runs.cancel("g1", ledger=saver.ledger)
    return lambda: time.sleep(0.1)


@pytest.mark.parametrize("stop", ["cancelled", "deadline"])
def test_calls_validate_leaves_unrun_are_labelled_with_the_stop(db, stop):
    """The request stops while the model answers: `validate` answers the proposed call with the stop's name."""

    class Stopping(ScriptedChatModel):
        def next_reply(self, messages):
            stopper()
            return super().next_reply(messages)

    recorder = Recorder()
    with open_sqlite(db) as saver:
        stopper = _stopper(stop, saver)
        model = Stopping(script=[reply(calls=[call("search", {"query": "x"}, "s1")])])
        graph = build_graph(
            model, recorder.tools, policies={"search": READ}, limits=Limits(deadline_s=0.05), checkpointer=saver
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == stop and recorder.calls == []
    assert err(answers(out)["s1"])["type"] == stop
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("stop", ["cancelled", "deadline"])
def test_calls_execute_leaves_unrun_are_labelled_with_the_stop(db, stop):
    """The request stops after `validate` accepted the call (its validator is where it happens): `execute`
    answers it with the stop's name and runs nothing."""
    with open_sqlite(db) as saver:
        stopper = _stopper(stop, saver)
        policy = ToolPolicy(effect="read", approval="never", validator=lambda args, ctx: stopper())
        graph, model, recorder = make(
            saver,
            [reply(calls=[call("search", {"query": "x"}, "s1")])],
            policies={"search": policy},
            limits=Limits(deadline_s=0.05),
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert out["status"] == stop and recorder.calls == []
    assert err(answers(out)["s1"])["type"] == stop
    model.assert_complete()


@pytest.mark.parametrize(
    ("stop", "label"),
    [("cancelled", "cancelled"), ("deadline", "deadline"), ("step_limit", "budget_exhausted"), ("error", "stopped")],
)
def test_calls_finalize_finds_unrun_are_labelled_with_the_stop(db, stop, label):
    """`finalize`'s last line: a call still open when the request ends (here: a stop written into the state while
    the call waits for approval) is answered with the stop's label, never as a budget it did not use."""
    with open_sqlite(db) as saver:
        graph, _, recorder = make(saver, [reply(calls=[call("transfer", {"amount": 1, "to": "a"}, "w1")])])
        graph.invoke({"messages": [("user", "go")]}, CFG)
        graph.update_state(CFG, {"stop": stop, "stop_detail": "stopped for the test"}, as_node="validate")
        out = graph.invoke(None, CFG)
    assert out["status"] == stop and recorder.calls == []
    assert err(answers(out)["w1"]) == {
        "type": label,
        "message": "Not run: the loop stopped (stopped for the test) before this call.",
        "retryable": False,
    }


def test_the_same_read_with_the_same_result_three_times_in_a_row_stops_the_loop_each_answered(db):
    script = [reply(calls=[call("search", {"query": "x"}, f"s{i}")]) for i in range(3)]
    with open_sqlite(db) as saver:
        graph, model, recorder = make(saver, script)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    got = answers(out)
    assert all(got[f"s{i}"].status == "success" for i in range(3)) and len(recorder.calls) == 3
    assert out["status"] == "loop_detected" and out["answer"] is None
    model.assert_complete()


def test_repeat_fingerprint_ignores_key_order_whitespace_and_equal_numbers(db):
    script = [
        reply(calls=[call("big", {"size": 3}, "b0")]),
        reply(calls=[call("big", '{ "size" : 3.0 }', "b1")]),
        reply(calls=[call("big", '{"size":3}', "b2")]),
    ]
    with open_sqlite(db) as saver:
        graph, _, _ = make(saver, script)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert answers(out)["b1"].status == "success" and out["status"] == "loop_detected"


def test_a_repeat_of_a_read_many_rounds_back_gets_its_data_and_a_new_request_starts_afresh(db):
    """A read repeated with other calls between (A, B, C, A) is answered as any read: it is no loop."""
    first = [reply(calls=[call("search", {"query": q}, f"q{i}")]) for i, q in enumerate("abc")]
    script = [*first, reply(calls=[call("search", {"query": "a"}, "q3")]), reply("done")]
    script += [reply(calls=[call("search", {"query": "a"}, "r0")]), reply("again")]
    with open_sqlite(db) as saver:
        graph, model, _ = make(saver, script)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
        assert json.loads(answers(out)["q3"].content)["query"] == "a" and out["status"] == "completed"
        out = graph.invoke({"messages": [("user", "next request")]}, CFG)
    assert answers(out)["r0"].status == "success" and out["status"] == "completed"
    model.assert_complete()


def test_a_repeat_whose_result_changed_is_not_a_duplicate(db):
    recorder = Recorder()
    script = [
        reply(calls=[call("search", {"query": "x"}, "s0")]),
        reply(calls=[call("search", {"query": "x"}, "s1")]),
        reply("ok"),
    ]

    class Changing(ScriptedChatModel):
        def next_reply(self, messages):
            recorder.value = f"v{self.calls}"
            return super().next_reply(messages)

    with open_sqlite(db) as saver:
        graph = build_graph(Changing(script=script), recorder.tools, policies={"search": READ}, checkpointer=saver)
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    assert answers(out)["s1"].status == "success" and out["status"] == "completed"


def test_large_results_are_cut_with_a_marker_and_the_original_size(db):
    with open_sqlite(db) as saver:
        graph, _, _ = make(
            saver,
            [reply(calls=[call("big", {"size": 10_000}, "b1")]), reply("ok")],
            limits=Limits(max_result_chars=500),
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
    content = answers(out)["b1"].content
    assert content.endswith(TRUNCATION_MARKER.format(shown=500, total=10_000))
    assert content.startswith("é" * 500)


@pytest.mark.parametrize("bad", ["", "../etc", "a" * 200, "t 1", "t;drop", "-x"])
def test_thread_ids_are_validated(bad):
    with pytest.raises(InvalidThreadId):
        validate_thread_id(bad)
    assert validate_thread_id("t-1.a_b:c@d") == "t-1.a_b:c@d"


def test_statuses_are_distinct_and_documented():
    from gatedloop.graph import STATUSES
    from gatedloop.graph.display import STOP_WORDS

    assert set(STATUSES) == set(STOP_WORDS)
    table = section("What ends a request (`status`)")
    for status in STATUSES:
        assert f"| `{status}` |" in table, status


def test_integers_beyond_64_bits_are_refused_not_a_crash(db):
    huge = 2**70
    with open_sqlite(db) as saver:
        graph, _, recorder = make(
            saver, [reply(calls=[call("transfer", {"amount": huge, "to": "x"}, "w1")]), reply("ok")]
        )
        out = graph.invoke({"messages": [("user", "go")]}, CFG)
        assert "__interrupt__" not in out and recorder.calls == []
        assert err(answers(out)["w1"])["type"] == "invalid_arguments"
        assert out["status"] == "completed"
        graph, _, recorder = make(saver, [reply(calls=[call("transfer", {"amount": 1, "to": "x"}, "w2")]), reply("ok")])
        cfg = {"configurable": {"thread_id": "g3"}}
        graph.invoke({"messages": [("user", "go")]}, cfg)
        edit = {"type": "edit", "edited_action": {"name": "transfer", "args": {"amount": huge, "to": "x"}}}
        with pytest.raises(InvalidDecision, match="64 bits"):
            runs.resume(graph, "g3", {"decisions": [edit]})
        out = runs.resume(graph, "g3", {"decisions": [{"type": "approve"}]})
    assert out["status"] == "completed" and recorder.calls == [("transfer", {"amount": 1, "to": "x"})]
