"""The demo tools on a real SQLite file: fields the model relies on, persistence, idempotent writes, the
calculator's refusals, and concurrent writers (threads and processes) that must not oversell a workshop."""

import math
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.tools import BaseTool
from pydantic import ValidationError

from gatedloop.demo import DemoStore, build_demo_tools, demo_policies, safe_eval
from gatedloop.tools.errors import ToolFailure
from gatedloop.tools.policy import CallContext

TOOL_NAMES = {
    "query_order",
    "query_logistics",
    "get_weather",
    "calculator",
    "check_calendar",
    "lookup_contact",
    "create_event",
    "get_train_status",
    "reserve_seat",
}
WRITES = {"create_event", "reserve_seat"}
SEAT_REQUEST = "Reserve a seat in workshop WS-101 for Ana"
LUNCH: dict[str, Any] = {
    "title": "午餐",
    "date": "2026-03-06",
    "start": "12:00",
    "end": "13:00",
    "attendees": ["zhangwei@example.com"],
}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "demo.sqlite"


@pytest.fixture
def store(db: Path) -> DemoStore:
    return DemoStore(db)


@pytest.fixture
def tools(store: DemoStore) -> dict[str, BaseTool]:
    return {t.name: t for t in build_demo_tools(store)}


def run(tools: dict[str, BaseTool], name: str, /, **args: Any) -> Any:
    return tools[name].invoke(args)


@pytest.mark.parametrize("content", [SEAT_REQUEST, [{"type": "text", "text": SEAT_REQUEST}]])
def test_the_offline_model_reads_the_question_as_text_or_as_content_blocks(content: Any) -> None:
    """Agent Chat UI sends a message's content as blocks (`[{"type": "text", "text": ...}]`): the demo's scripted
    model reads the text, not the blocks' repr (which made the participant "Ana', 'type': 'text'}]")."""
    from langchain_core.messages import HumanMessage

    from gatedloop.demo.model import demo_responder

    [proposed] = demo_responder([HumanMessage(content=content)]).tool_calls
    assert (proposed["name"], proposed["args"]) == ("reserve_seat", {"event_id": "WS-101", "participant": "Ana"})


def test_tool_names_are_the_articles_and_each_has_a_one_line_description(tools: dict[str, BaseTool]) -> None:
    assert set(tools) == TOOL_NAMES
    for t in tools.values():
        assert t.description and "\n" not in t.description


def test_order_then_logistics_as_in_the_article(tools: dict[str, BaseTool]) -> None:
    order = run(tools, "query_order", order_id="ORD-2026-001")
    assert order == {"status": "shipped", "tracking_no": "SF123456"}
    assert run(tools, "query_logistics", tracking_no=order["tracking_no"]) == {
        "status": "in_transit",
        "latest_event": "杭州转运中心已发出",
        "updated_at": "2026-09-18T09:20:00+08:00",
    }


@pytest.mark.parametrize("city", ["北京", "Beijing", "beijing", " 北京市 "])
def test_weather_by_chinese_or_english_name(tools: dict[str, BaseTool], city: str) -> None:
    assert run(tools, "get_weather", city=city) == {
        "city": "北京",
        "temperature": 22,
        "unit": "celsius",
        "condition": "晴",
    }


def test_weather_differs_per_city(tools: dict[str, BaseTool]) -> None:
    cities = ["北京", "上海", "深圳", "杭州"]
    reports = [run(tools, "get_weather", city=c) for c in cities]
    assert [r["city"] for r in reports] == cities
    assert len({(r["temperature"], r["condition"]) for r in reports}) == len(cities)


def test_calculator_tool(tools: dict[str, BaseTool]) -> None:
    assert run(tools, "calculator", expression="(12 + 3) * 4") == {"expression": "(12 + 3) * 4", "result": 60}


def test_calendar_lists_busy_and_the_free_gaps(tools: dict[str, BaseTool]) -> None:
    assert run(tools, "check_calendar", date="2026-03-06", user="me") == {
        "date": "2026-03-06",
        "user": "me",
        "busy": [{"start": "09:00", "end": "10:00"}, {"start": "14:00", "end": "15:30"}],
        "free": [{"start": "10:00", "end": "14:00"}, {"start": "15:30", "end": "18:00"}],
    }
    empty = run(tools, "check_calendar", date="2026-03-10")
    assert empty["busy"] == [] and empty["free"] == [{"start": "09:00", "end": "18:00"}]
    assert run(tools, "check_calendar", date="2026-03-06", user="张伟")["busy"] == [{"start": "11:00", "end": "12:30"}]


def test_contacts(tools: dict[str, BaseTool]) -> None:
    assert run(tools, "lookup_contact", name="张伟") == {"name": "张伟", "email": "zhangwei@example.com"}
    assert run(tools, "lookup_contact", name="alice")["email"] == "alice@example.com"


def test_train_status_on_time_unless_a_delay_is_recorded(tools: dict[str, BaseTool]) -> None:
    assert run(tools, "get_train_status", train_no="G1234", date="2026-03-06") == {
        "train_no": "G1234",
        "date": "2026-03-06",
        "status": "on_time",
        "delay_minutes": 0,
    }
    delayed = run(tools, "get_train_status", train_no="g1234", date="2026-03-07")
    assert (delayed["train_no"], delayed["status"], delayed["delay_minutes"]) == ("G1234", "delayed", 25)


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("query_order", {"order_id": "ORD-1999-404"}),
        ("query_logistics", {"tracking_no": "YT000000"}),
        ("get_weather", {"city": "Atlantis"}),
        ("check_calendar", {"date": "2026-03-06", "user": "Nobody"}),
        ("lookup_contact", {"name": "Nobody"}),
        ("get_train_status", {"train_no": "Z9999", "date": "2026-03-06"}),
        ("reserve_seat", {"event_id": "WS-999", "participant": "Bob", "idempotency_key": "k"}),
    ],
)
def test_unknown_ids_are_not_found(tools: dict[str, BaseTool], name: str, args: dict[str, Any]) -> None:
    with pytest.raises(ToolFailure, match="not found") as failure:
        tools[name].invoke(args)
    assert failure.value.error_type == "invalid_arguments"
    assert failure.value.retryable


BAD_DATES = ["2026-02-30", "2026/03/06", "20260306", "2026-3-6", "２０２６-03-06", "soon"]


@pytest.mark.parametrize("bad", BAD_DATES)
@pytest.mark.parametrize("name", ["check_calendar", "get_train_status", "create_event"])
def test_schemas_reject_bad_dates(tools: dict[str, BaseTool], name: str, bad: str) -> None:
    args = {**LUNCH, "train_no": "G1234", "date": bad}
    fields = tools[name].tool_call_schema.model_fields  # type: ignore[union-attr]
    args = {k: v for k, v in args.items() if k in fields}
    with pytest.raises(ValidationError):
        tools[name].tool_call_schema.model_validate(args)  # type: ignore[union-attr]
    with pytest.raises(ValidationError):
        tools[name].invoke({**args, "idempotency_key": "k"} if name in WRITES else args)
    tools[name].tool_call_schema.model_validate({**args, "date": "2026-03-06"})  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["12", "24:00", "9:00", "12:60"])
def test_create_event_rejects_bad_times(tools: dict[str, BaseTool], bad: str) -> None:
    with pytest.raises(ValidationError):
        tools["create_event"].tool_call_schema.model_validate({**LUNCH, "start": bad})  # type: ignore[union-attr]


def test_idempotency_key_is_injected_not_shown_to_the_model(tools: dict[str, BaseTool]) -> None:
    for name, t in tools.items():
        visible = t.tool_call_schema.model_json_schema()["properties"]  # type: ignore[union-attr]
        assert "idempotency_key" not in visible
        assert ("idempotency_key" in t.args_schema.model_fields) == (name in WRITES)  # type: ignore[union-attr]


def test_a_write_without_its_key_is_refused(tools: dict[str, BaseTool], store: DemoStore) -> None:
    with pytest.raises(ValidationError):
        tools["create_event"].invoke(LUNCH)
    assert store.count_events() == 0


def test_writes_persist_in_the_file(tools: dict[str, BaseTool], db: Path) -> None:
    event = run(tools, "create_event", **LUNCH, idempotency_key="evt-1")
    seat = run(tools, "reserve_seat", event_id="WS-101", participant="Alice", idempotency_key="rsv-1")
    assert event == {**LUNCH, "event_id": "EVT-0001"}
    assert seat["reservation_id"].startswith("RSV-")
    assert (seat["event_id"], seat["participant"], seat["seats_left"]) == ("WS-101", "Alice", 19)

    reopened = DemoStore(db)
    assert reopened.find_event_by_key("evt-1") == event
    assert reopened.find_reservation_by_key("rsv-1") == seat
    assert (reopened.count_events(), reopened.count_reservations("WS-101")) == (1, 1)
    calendar = {t.name: t for t in build_demo_tools(reopened)}["check_calendar"]
    assert {"start": "12:00", "end": "13:00"} in calendar.invoke({"date": "2026-03-06"})["busy"]


def test_reopening_does_not_reseed(db: Path) -> None:
    for _ in range(3):
        store = DemoStore(db)
    assert store.count_reservations() == 1
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 3
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_same_key_returns_the_first_result_once(tools: dict[str, BaseTool], store: DemoStore) -> None:
    first = run(tools, "create_event", **LUNCH, idempotency_key="evt-1")
    again = run(tools, "create_event", **{**LUNCH, "title": "晚餐"}, idempotency_key="evt-1")
    assert again == first and store.count_events() == 1

    seat = run(tools, "reserve_seat", event_id="WS-102", participant="Bob", idempotency_key="rsv-1")
    assert run(tools, "reserve_seat", event_id="WS-102", participant="Bob", idempotency_key="rsv-1") == seat
    assert store.count_reservations("WS-102") == 1
    assert store.get_workshop("WS-102") == {
        "event_id": "WS-102",
        "title": "LangGraph 实战",
        "date": "2026-03-27",
        "capacity": 2,
        "seats_left": 1,
    }


def test_reserve_seat_refuses_when_full(tools: dict[str, BaseTool], store: DemoStore) -> None:
    left = [
        run(tools, "reserve_seat", event_id="WS-102", participant=p, idempotency_key=f"k-{p}")["seats_left"]
        for p in ("Alice", "Bob")
    ]
    assert left == [1, 0]
    with pytest.raises(ToolFailure, match="full") as failure:
        run(tools, "reserve_seat", event_id="WS-102", participant="张伟", idempotency_key="k-zw")
    assert not failure.value.retryable
    assert store.count_reservations("WS-102") == 2
    assert store.find_reservation_by_key("k-zw") is None
    with pytest.raises(ToolFailure, match="full"):
        run(tools, "reserve_seat", event_id="WS-103", participant="Bob", idempotency_key="k-103")


def test_a_participant_gets_one_seat_per_workshop(tools: dict[str, BaseTool], store: DemoStore) -> None:
    run(tools, "reserve_seat", event_id="WS-101", participant="Bob", idempotency_key="a")
    with pytest.raises(ToolFailure, match="already holds a seat"):
        run(tools, "reserve_seat", event_id="WS-101", participant="Bob", idempotency_key="b")
    assert store.count_reservations("WS-101") == 1


def test_create_event_refuses_an_end_before_its_start(tools: dict[str, BaseTool], store: DemoStore) -> None:
    with pytest.raises(ToolFailure) as failure:
        run(tools, "create_event", **{**LUNCH, "end": "11:00"}, idempotency_key="k")
    assert failure.value.error_type == "invalid_arguments"
    assert store.count_events() == 0


def test_threads_never_oversell(tools: dict[str, BaseTool], store: DemoStore) -> None:
    def reserve(i: int) -> bool:
        try:
            run(tools, "reserve_seat", event_id="WS-101", participant=f"p{i}", idempotency_key=f"k{i}")
        except ToolFailure:
            return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(reserve, range(30)))
        same_key = set(map(str, pool.map(lambda _: store.create_event(**LUNCH, idempotency_key="one"), range(16))))
    assert sum(outcomes) == 20 and store.count_reservations("WS-101") == 20
    assert len(same_key) == 1 and store.count_events() == 1


_PROCESS_SCRIPT = """
import sys
from gatedloop.demo import DemoStore
from gatedloop.tools.errors import ToolFailure
store = DemoStore(sys.argv[1])
try:
    store.reserve_seat(event_id="WS-102", participant=sys.argv[2], idempotency_key=sys.argv[3])
except ToolFailure:
    sys.exit(3)
"""


@pytest.mark.slow
def test_processes_opening_a_fresh_file_seed_once_and_never_oversell(db: Path) -> None:
    args = [[sys.executable, "-c", _PROCESS_SCRIPT, str(db), f"p{i}", f"k{i % 4}"] for i in range(8)]
    procs = [subprocess.Popen(a) for a in args]
    codes = [p.wait(timeout=60) for p in procs]
    assert set(codes) <= {0, 3}
    store = DemoStore(db)
    assert store.count_reservations("WS-102") == 2
    assert store.count_reservations() == 3
    assert codes.count(0) >= 2


def test_policies_cover_every_tool(store: DemoStore) -> None:
    policies = demo_policies(store)
    assert set(policies) == TOOL_NAMES
    for name, policy in policies.items():
        if name in WRITES:
            assert (policy.effect, policy.approval, policy.timeout_s) == ("write", "always", 15)
            assert policy.reconcile is not None
        else:
            assert (policy.effect, policy.approval, policy.timeout_s) == ("read", "never", 10)
            assert policy.reconcile is None and not policy.needs_approval({}, CallContext())


def test_reconcile_answers_from_the_store(tools: dict[str, BaseTool], store: DemoStore) -> None:
    policies = demo_policies(store)
    reconcile_event, reconcile_seat = policies["create_event"].reconcile, policies["reserve_seat"].reconcile
    assert reconcile_event is not None and reconcile_seat is not None
    args = {"event_id": "WS-101", "participant": "Bob"}
    assert reconcile_event(LUNCH, "evt-1") is None and reconcile_seat(args, "rsv-1") is None
    event = run(tools, "create_event", **LUNCH, idempotency_key="evt-1")
    seat = run(tools, "reserve_seat", **args, idempotency_key="rsv-1")
    assert reconcile_event(LUNCH, "evt-1") == event
    assert reconcile_seat(args, "rsv-1") == seat


def test_write_validators_refuse_before_anyone_is_asked(tools: dict[str, BaseTool], store: DemoStore) -> None:
    policies, ctx = demo_policies(store), CallContext()
    event_check, seat_check = policies["create_event"].validator, policies["reserve_seat"].validator
    assert event_check is not None and seat_check is not None
    assert event_check(LUNCH, ctx) is None
    assert event_check({**LUNCH, "end": "12:00"}, ctx)
    assert seat_check({"event_id": "WS-102", "participant": "Bob"}, ctx) is None
    assert "full" in (seat_check({"event_id": "WS-103", "participant": "Bob"}, ctx) or "")
    assert "not found" in (seat_check({"event_id": "WS-999", "participant": "Bob"}, ctx) or "")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-(+3)", -3),
        ("  1.5 * 4 ", 6.0),
        ("1_000 + 0x10", 1016),
        ("10 ** 99", 10**99),
        ("((((1))))", 1),
    ],
)
def test_calculator_accepts_arithmetic(expression: str, expected: float) -> None:
    result = safe_eval(expression)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    "expression",
    [
        "x + 1",
        "__import__('os').system('true')",
        "abs(-1)",
        "(1).real",
        "(lambda: 1)()",
        "'a' * 3",
        "b'1'",
        "True + 1",
        "None",
        "1j * 1j",
        "1 < 2",
        "[1, 2]",
        "1 if 1 else 2",
        "(x := 1)",
        "1; 2",
        "",
        "1 +",
        "1 & 3",
        "~1",
        "10 ** 100",
        "9 ** 9 ** 9",
        "2 ** 1000",
        "2 ** 101",
        "(-8) ** 0.5",
        "1e999",
        "1e300 * 1e300",
        "9" * 101,
        "1 / 0",
        "1 // 0",
        "1 % 0",
        "0 ** -1",
        "1" + " + 1" * 50,
        "-" * 150 + "1",
        "\x00",
    ],
)
def test_calculator_refuses_everything_else(expression: str) -> None:
    with pytest.raises(ToolFailure) as failure:
        safe_eval(expression)
    assert failure.value.error_type == "invalid_arguments"
    assert failure.value.message.startswith(("The ", "Unsupported ", "Division "))


def test_calculator_refuses_long_input() -> None:
    assert safe_eval("1" + "+1" * 99) == 100
    with pytest.raises(ToolFailure, match="too long"):
        safe_eval("1" + "+1" * 100)


@pytest.mark.parametrize("expression", ["9**9**9", "9**9**9**9", "(10**99)**99", "2**(2**(2**(2**2)))"])
def test_huge_powers_are_refused_instantly(expression: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ToolFailure, match="too large"):
        safe_eval(expression)
    assert time.perf_counter() - started < 0.5


def test_calculator_refusal_reaches_the_tool_caller(tools: dict[str, BaseTool]) -> None:
    with pytest.raises(ToolFailure, match="Division by zero"):
        run(tools, "calculator", expression="1/0")


ARITHMETIC_ISH = st.text(alphabet="0123456789.+-*/%() e_x", max_size=60)


@settings(derandomize=True, max_examples=300)
@given(st.one_of(st.text(max_size=250), ARITHMETIC_ISH))
def test_safe_eval_returns_a_bounded_number_or_refuses(expression: str) -> None:
    try:
        result = safe_eval(expression)
    except ToolFailure as failure:
        assert failure.error_type == "invalid_arguments"
        return
    assert type(result) in (int, float)
    assert math.isfinite(result) and abs(result) < 10**100
