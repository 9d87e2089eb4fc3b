"""The real gatedloop graph driving the real ``langchain_openai.ChatOpenAI`` over HTTP, on a real SQLite file.

The model is the scripted OpenAI-compatible server in ``openai_stub``; the tools are the demo tools over a
store that records every call reaching it. Each test checks what the loop ended with, which tools ran, and
what the provider received: the exact request count pins the retry policy (``Limits.model_retries=1``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.types import Command
from openai_stub import Reply, ScriptedOpenAIServer, chat_openai, tool_call

from gatedloop.checkpoints import open_sqlite
from gatedloop.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.graph import Limits, build_graph

THREAD = "t"
CFG = {"configurable": {"thread_id": THREAD}}
TOOL_NAMES = ("query_order", "query_logistics", "reserve_seat")
QUESTION = "我的订单 ORD-2026-001 到哪了？"
ANSWER = "订单 ORD-2026-001 已发货，快递单号 SF123456，最新进度：杭州转运中心已发出。"

ORDER_ARGS = {"order_id": "ORD-2026-001"}
TRACK_ARGS = {"tracking_no": "SF123456"}
ORDER = tool_call("query_order", ORDER_ARGS, "call_order")
TRACK = tool_call("query_logistics", TRACK_ARGS, "call_track")
ORDER_RESULT = {"status": "shipped", "tracking_no": "SF123456"}
TRACK_RESULT = {"status": "in_transit", "latest_event": "杭州转运中心已发出", "updated_at": "2026-09-18T09:20:00+08:00"}

SCHEMAS = {
    "query_order": {
        "type": "object",
        "properties": {
            "order_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "Order number, e.g. ORD-2026-001",
            }
        },
        "required": ["order_id"],
    },
    "query_logistics": {
        "type": "object",
        "properties": {
            "tracking_no": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "Tracking number, e.g. SF123456",
            }
        },
        "required": ["tracking_no"],
    },
    "reserve_seat": {
        "type": "object",
        "properties": {
            "event_id": {"type": "string", "minLength": 1, "maxLength": 32, "description": "Workshop id, e.g. WS-101"},
            "participant": {"type": "string", "minLength": 1, "maxLength": 100},
        },
        "required": ["event_id", "participant"],
    },
}


class CountingStore(DemoStore):
    """The demo store, recording each call the tools make into it (validators only read workshops)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls: list[tuple[str, ...]] = []

    def get_order(self, order_id: str) -> dict[str, Any] | None:
        self.calls.append(("query_order", order_id))
        return super().get_order(order_id)

    def get_logistics(self, tracking_no: str) -> dict[str, Any] | None:
        self.calls.append(("query_logistics", tracking_no))
        return super().get_logistics(tracking_no)

    def reserve_seat(self, *, event_id: str, participant: str, idempotency_key: str) -> dict[str, Any]:
        self.calls.append(("reserve_seat", event_id, participant, idempotency_key))
        return super().reserve_seat(event_id=event_id, participant=participant, idempotency_key=idempotency_key)


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "demo.sqlite")


class Loop:
    """One graph over the scripted server and a SQLite checkpoint file; ``invoke`` starts or resumes thread t."""

    def __init__(self, tmp_path: Path, server: ScriptedOpenAIServer, store: CountingStore, streaming: bool) -> None:
        self.tmp_path, self.server, self.store, self.streaming = tmp_path, server, store, streaming

    def invoke(self, payload: Any) -> dict[str, Any]:
        model = chat_openai(self.server.base_url, streaming=self.streaming)
        tools = [t for t in build_demo_tools(self.store) if t.name in TOOL_NAMES]
        policies = {name: p for name, p in demo_policies(self.store).items() if name in TOOL_NAMES}
        with open_sqlite(self.tmp_path / "runs.sqlite") as saver:
            graph = build_graph(model, tools, policies=policies, limits=Limits(model_retries=1), checkpointer=saver)
            return graph.invoke(payload, CFG, durability="sync")


def run(tmp_path: Path, store: CountingStore, replies: list[Reply], *, streaming: bool) -> tuple[dict, list[dict]]:
    """Ask QUESTION once; return the output state and the request bodies the server received."""
    with ScriptedOpenAIServer(replies) as server:
        out = Loop(tmp_path, server, store, streaming).invoke({"messages": [("user", QUESTION)]})
    assert all(r["stream"] is streaming for r in server.requests)
    return out, server.requests


def sent_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return request["messages"]


def assistant_calls(*calls: dict[str, str]) -> dict[str, Any]:
    """An assistant message with tool calls, as langchain-openai sends it back to the provider."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"type": "function", "id": c["id"], "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ],
    }


def tool_result(message: dict[str, Any]) -> Any:
    assert message["role"] == "tool"
    return json.loads(message["content"])


def assert_only_the_question(out: dict[str, Any]) -> None:
    """A discarded response never enters the history: no AI message, nothing to answer."""
    assert [type(m) for m in out["messages"]] == [HumanMessage]
    assert out["messages"][0].content == QUESTION


def ai_messages(messages: list[BaseMessage]) -> list[AIMessage]:
    return [m for m in messages if isinstance(m, AIMessage)]


# --- the order-tracking scenario ----------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["non-streamed", "streamed"])
def test_order_tracking_runs_both_lookups_and_answers(tmp_path: Path, store: CountingStore, streaming: bool) -> None:
    replies = [
        Reply(tool_calls=[ORDER], arg_chunk_size=3),
        Reply(tool_calls=[TRACK], arg_chunk_size=3),
        Reply(content=ANSWER, arg_chunk_size=3),
    ]
    out, requests = run(tmp_path, store, replies, streaming=streaming)

    assert (out["status"], out["answer"]) == ("completed", ANSWER)
    assert store.calls == [("query_order", "ORD-2026-001"), ("query_logistics", "SF123456")]
    assert len(requests) == 3

    first, second, third = (sent_messages(r) for r in requests)
    assert first == [{"role": "user", "content": QUESTION}]
    assert second[:1] == first and second[1] == assistant_calls(ORDER)
    assert second[2]["tool_call_id"] == "call_order" and tool_result(second[2]) == ORDER_RESULT
    assert len(second) == 3
    assert third[:3] == second and third[3] == assistant_calls(TRACK)
    assert third[4]["tool_call_id"] == "call_track" and tool_result(third[4]) == TRACK_RESULT
    assert len(third) == 5

    for request in requests:
        sent_tools = {t["function"]["name"]: t for t in request["tools"]}
        assert list(sent_tools) == list(TOOL_NAMES)
        assert {name: t["function"]["parameters"] for name, t in sent_tools.items()} == SCHEMAS
        assert all(t["type"] == "function" and t["function"]["description"] for t in sent_tools.values())
        assert "idempotency_key" not in json.dumps(request)

    assert [type(m) for m in out["messages"]] == [
        HumanMessage,
        AIMessage,
        ToolMessage,
        AIMessage,
        ToolMessage,
        AIMessage,
    ]
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("streaming", [False, True], ids=["non-streamed", "streamed"])
def test_gated_write_over_http_never_shows_the_idempotency_key(
    tmp_path: Path, store: CountingStore, streaming: bool
) -> None:
    """reserve_seat pauses for approval, runs once with an injected key, and the key never reaches the provider."""
    booking = tool_call("reserve_seat", {"event_id": "WS-101", "participant": "Alice"}, "call_rsv")
    replies = [Reply(tool_calls=[booking], arg_chunk_size=3), Reply(content="Alice 已预约 WS-101。")]
    with ScriptedOpenAIServer(replies) as server:
        loop = Loop(tmp_path, server, store, streaming)
        paused = loop.invoke({"messages": [("user", "帮 Alice 预约 WS-101")]})
        [request] = paused["__interrupt__"][0].value["action_requests"]
        assert (request["name"], request["args"]) == ("reserve_seat", {"event_id": "WS-101", "participant": "Alice"})
        assert (len(server.requests), store.calls, store.count_reservations()) == (1, [], 1)

        out = loop.invoke(Command(resume={"decisions": [{"type": "approve"}]}))

    assert (out["status"], out["answer"]) == ("completed", "Alice 已预约 WS-101。")
    [(name, event_id, participant, key)] = store.calls
    assert (name, event_id, participant) == ("reserve_seat", "WS-101", "Alice")
    assert key and store.count_reservations() == 2
    assert len(server.requests) == 2
    second = sent_messages(server.requests[1])
    assert second[-2] == assistant_calls(booking)
    assert second[-1]["tool_call_id"] == "call_rsv"
    assert tool_result(second[-1]) == store.find_reservation_by_key(key)
    for sent in server.requests:
        assert "idempotency_key" not in json.dumps(sent)
        assert key not in json.dumps(sent)
    assert_each_call_answered_once(out["messages"])


# --- streams cut in the middle of tool-call arguments -------------------------------------------------


def cut_order(mode: str) -> Reply:
    """Role chunk, call header, then 6 argument pieces of 3 chars: the stream stops inside '"ORD-'."""
    return Reply(tool_calls=[ORDER], arg_chunk_size=3, cut_after_chunks=8, cut_mode=mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["abort", "eof"])
def test_cut_stream_is_retried_and_a_complete_retry_continues(tmp_path: Path, store: CountingStore, mode: str) -> None:
    replies = [cut_order(mode), Reply(tool_calls=[ORDER], arg_chunk_size=3), Reply(content=ANSWER)]
    out, requests = run(tmp_path, store, replies, streaming=True)

    assert (out["status"], out["answer"]) == ("completed", ANSWER)
    assert store.calls == [("query_order", "ORD-2026-001")]
    assert len(requests) == 3
    assert sent_messages(requests[1]) == sent_messages(requests[0]) == [{"role": "user", "content": QUESTION}]
    assert sent_messages(requests[2])[1:] == [
        assistant_calls(ORDER),
        {"role": "tool", "tool_call_id": "call_order", "content": json.dumps(ORDER_RESULT)},
    ]
    assert len(ai_messages(out["messages"])) == 2
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("mode", ["abort", "eof"])
def test_cut_stream_twice_stops_incomplete_and_runs_nothing(tmp_path: Path, store: CountingStore, mode: str) -> None:
    out, requests = run(tmp_path, store, [cut_order(mode), cut_order(mode)], streaming=True)

    assert (out["status"], out["answer"]) == ("incomplete", None)
    assert out["stop_detail"]
    assert store.calls == []
    assert len(requests) == 2
    assert sent_messages(requests[1]) == sent_messages(requests[0])
    assert_only_the_question(out)
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("mode", ["abort", "eof"])
def test_cut_stream_later_in_the_loop_leaves_no_unanswered_call(
    tmp_path: Path, store: CountingStore, mode: str
) -> None:
    """After a completed first turn, the second turn's cut call never runs and the history stays valid."""
    cut_track = Reply(tool_calls=[TRACK], arg_chunk_size=3, cut_after_chunks=5, cut_mode=mode)  # type: ignore[arg-type]
    out, requests = run(tmp_path, store, [Reply(tool_calls=[ORDER]), cut_track, cut_track], streaming=True)

    assert (out["status"], out["answer"]) == ("incomplete", None)
    assert store.calls == [("query_order", "ORD-2026-001")]
    assert len(requests) == 3
    assert sent_messages(requests[2]) == sent_messages(requests[1])
    assert [type(m) for m in out["messages"]] == [HumanMessage, AIMessage, ToolMessage]
    assert [c["id"] for m in ai_messages(out["messages"]) for c in m.tool_calls] == ["call_order"]
    assert_each_call_answered_once(out["messages"])


# --- truncated, filtered, refused and unfinished responses --------------------------------------------

PARTIAL_ORDER = tool_call("query_order", '{"order_id": "ORD-', "call_order")
BAD_RESPONSES = {
    "length-non-streamed": (False, Reply(tool_calls=[PARTIAL_ORDER], finish_reason="length"), "incomplete"),
    "length-streamed": (
        True,
        Reply(tool_calls=[PARTIAL_ORDER], finish_reason="length", arg_chunk_size=3),
        "incomplete",
    ),
    "content-filter-non-streamed": (
        False,
        Reply(content="", tool_calls=[ORDER], finish_reason="content_filter"),
        "refused",
    ),
    "content-filter-streamed": (
        True,
        Reply(content="", tool_calls=[ORDER], finish_reason="content_filter", arg_chunk_size=3),
        "refused",
    ),
    "refusal-non-streamed": (False, Reply(refusal="I can't help with that."), "refused"),
    # langchain-openai drops delta.refusal: what arrives is an empty "stop" answer, which is not an answer.
    "refusal-streamed": (True, Reply(refusal="I can't help with that.", arg_chunk_size=4), "incomplete"),
    "no-finish-streamed": (True, Reply(tool_calls=[ORDER], arg_chunk_size=3, omit_finish=True), "incomplete"),
    "null-finish-non-streamed": (False, Reply(tool_calls=[ORDER], finish_reason=None), "incomplete"),
    "missing-call-id": (False, Reply(tool_calls=[tool_call("query_order", ORDER_ARGS, "")]), "incomplete"),
    "id-reused-in-one-turn": (
        False,
        Reply(
            tool_calls=[tool_call("query_order", ORDER_ARGS, "dup"), tool_call("query_logistics", TRACK_ARGS, "dup")]
        ),
        "incomplete",
    ),
}


@pytest.mark.parametrize(("streaming", "bad", "status"), BAD_RESPONSES.values(), ids=BAD_RESPONSES.keys())
def test_bad_response_twice_runs_no_tool(
    tmp_path: Path, store: CountingStore, streaming: bool, bad: Reply, status: str
) -> None:
    out, requests = run(tmp_path, store, [bad, bad], streaming=streaming)

    assert (out["status"], out["answer"]) == (status, None)
    assert store.calls == []
    assert len(requests) == 2
    assert sent_messages(requests[1]) == sent_messages(requests[0])
    assert_only_the_question(out)


@pytest.mark.parametrize(("streaming", "bad", "status"), BAD_RESPONSES.values(), ids=BAD_RESPONSES.keys())
def test_bad_response_then_a_good_one_continues(
    tmp_path: Path, store: CountingStore, streaming: bool, bad: Reply, status: str
) -> None:
    """The retry sees the same conversation; only the complete response's call runs, with its full arguments."""
    replies = [bad, Reply(tool_calls=[ORDER], arg_chunk_size=3), Reply(content=ANSWER)]
    out, requests = run(tmp_path, store, replies, streaming=streaming)

    assert (out["status"], out["answer"]) == ("completed", ANSWER)
    assert store.calls == [("query_order", "ORD-2026-001")]
    assert len(requests) == 3
    assert sent_messages(requests[1]) == sent_messages(requests[0])
    assert sent_messages(requests[2])[1] == assistant_calls(ORDER)
    assert_each_call_answered_once(out["messages"])


@pytest.mark.parametrize("retry_id", ["call_order", "call_track"], ids=["reused-again", "fresh-id"])
def test_call_id_from_an_earlier_turn_is_not_run(tmp_path: Path, store: CountingStore, retry_id: str) -> None:
    reused = Reply(tool_calls=[tool_call("query_logistics", TRACK_ARGS, "call_order")])
    retry = Reply(tool_calls=[tool_call("query_logistics", TRACK_ARGS, retry_id)])
    replies = [Reply(tool_calls=[ORDER]), reused, retry]
    if retry_id != "call_order":
        replies.append(Reply(content=ANSWER))
    out, requests = run(tmp_path, store, replies, streaming=False)

    assert sent_messages(requests[2]) == sent_messages(requests[1])
    if retry_id == "call_order":
        assert (out["status"], out["answer"]) == ("incomplete", None)
        assert store.calls == [("query_order", "ORD-2026-001")]
        assert len(requests) == 3
        assert [type(m) for m in out["messages"]] == [HumanMessage, AIMessage, ToolMessage]
    else:
        assert (out["status"], out["answer"]) == ("completed", ANSWER)
        assert store.calls == [("query_order", "ORD-2026-001"), ("query_logistics", "SF123456")]
        assert len(requests) == 4
        answered = [m.tool_call_id for m in out["messages"] if isinstance(m, ToolMessage)]
        assert answered == ["call_order", "call_track"]
    assert_each_call_answered_once(out["messages"])


# --- malformed arguments with a finished response -----------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True], ids=["non-streamed", "streamed"])
def test_unparseable_arguments_are_answered_and_the_model_corrects_itself(
    tmp_path: Path, store: CountingStore, streaming: bool
) -> None:
    broken = tool_call("query_order", '{"order_id": ORD-2026-001}', "call_bad")
    replies = [Reply(tool_calls=[broken], arg_chunk_size=2), Reply(tool_calls=[ORDER]), Reply(content=ANSWER)]
    out, requests = run(tmp_path, store, replies, streaming=streaming)

    assert (out["status"], out["answer"]) == ("completed", ANSWER)
    assert store.calls == [("query_order", "ORD-2026-001")]
    assert len(requests) == 3
    second = sent_messages(requests[1])
    assert second[1] == assistant_calls(broken)
    assert second[2]["tool_call_id"] == "call_bad"
    error = tool_result(second[2])
    assert error["ok"] is False
    assert error["error"]["type"] == "invalid_arguments"
    assert error["error"]["retryable"] is True
    assert "Traceback" not in error["error"]["message"] and "JSON" in error["error"]["message"]
    assert sent_messages(requests[2])[:3] == second
    assert sent_messages(requests[2])[3:] == [
        assistant_calls(ORDER),
        {"role": "tool", "tool_call_id": "call_order", "content": json.dumps(ORDER_RESULT)},
    ]
    [bad_ai, _] = ai_messages(out["messages"])[:2]
    assert [c["id"] for c in bad_ai.invalid_tool_calls] == ["call_bad"]
    assert_each_call_answered_once(out["messages"])


def test_unparseable_write_arguments_are_refused_before_anyone_is_asked(tmp_path: Path, store: CountingStore) -> None:
    broken = tool_call("reserve_seat", '{"event_id": "WS-101", "participant": Alice}', "call_rsv")
    out, requests = run(tmp_path, store, [Reply(tool_calls=[broken]), Reply(content="参数有误。")], streaming=False)

    assert "__interrupt__" not in out
    assert (out["status"], out["answer"]) == ("completed", "参数有误。")
    assert store.calls == [] and store.count_reservations() == 1
    assert len(requests) == 2
    last = sent_messages(requests[1])[-1]
    assert last["tool_call_id"] == "call_rsv"
    assert tool_result(last)["error"]["type"] == "invalid_arguments"
    assert_each_call_answered_once(out["messages"])


MALFORMED = {
    "read": ("query_order", '{"order_id": "ORD-2026-00'),
    "write": ("reserve_seat", '{"event_id": "WS-101", "participant": "Ali'),
}


@pytest.mark.parametrize("kind", MALFORMED, ids=MALFORMED.keys())
@pytest.mark.parametrize(
    "streaming",
    [False, True],
    ids=["non-streamed", "streamed"],
)
def test_unterminated_arguments_with_a_finished_status_never_run(
    tmp_path: Path, store: CountingStore, streaming: bool, kind: str
) -> None:
    """Invariant 4: the provider said tool_calls, but the arguments are not JSON; nothing runs, nobody is asked."""
    name, raw = MALFORMED[kind]
    replies = [Reply(tool_calls=[tool_call(name, raw, "call_x")], arg_chunk_size=3), Reply(content="参数有误。")]
    out, requests = run(tmp_path, store, replies, streaming=streaming)

    assert "__interrupt__" not in out
    assert store.calls == []
    assert (out["status"], out["answer"]) == ("completed", "参数有误。")
    assert len(requests) == 2
    last = sent_messages(requests[1])[-1]
    assert last["tool_call_id"] == "call_x"
    assert tool_result(last)["error"]["type"] == "invalid_arguments"
