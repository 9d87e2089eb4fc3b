"""The Studio entry under the real `langgraph dev`, driven through langgraph-sdk as Studio or Agent Chat UI would.

Two servers, each started once for this module: the repo's own `langgraph.json` (the demo graph
`gatedloop`, gatedloop's SQLite checkpointer on `GATEDLOOP_DB`, the ledger in the same file), and a small
config in tmp_path serving `tests/support/studio_app.py`, whose one write times out so its outcome is unknown.
Each test uses its own thread. The repo config is served without its `env` file, so a developer's
local `.env` cannot override the test's environment.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import sqlite3
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from devserver import STUDIO_CHECKPOINTER, gated_project, run_dev_server
from invariants import assert_each_call_answered_once
from langchain_core.messages import BaseMessage, ToolMessage, messages_from_dict
from langgraph_sdk import get_sync_client
from otlp_receiver import OtlpReceiver, Span
from refused import resumed

from gatedloop.checkpoints.ledger import LedgerEntry, SqliteLedger, idempotency_key

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
STUDIO_APP = Path(__file__).parent / "support" / "studio_app.py"
GRAPH = "gatedloop"
SEAT_CALL = "call_1_seat"
ALL_DECISIONS = ["approve", "edit", "reject", "respond"]
WAIT_S = 30.0


@dataclass
class Server:
    client: Any
    db: Path
    workdir: Path
    folder: Path
    url: str = ""

    def ledger(self, thread_id: str, call_id: str) -> LedgerEntry | None:
        ledger = SqliteLedger(self.db)
        try:
            return ledger.get(thread_id, call_id)
        finally:
            ledger.close()

    def audit(self, thread_id: str) -> list[dict[str, Any]]:
        ledger = SqliteLedger(self.db)
        try:
            return ledger.audit(thread_id)
        finally:
            ledger.close()

    def query(self, db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with closing(sqlite3.connect(db, timeout=30)) as conn:
            return conn.execute(sql, params).fetchall()


def _client(url: str) -> Any:
    return get_sync_client(url=url, api_key=None, timeout=60)


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    """Where the studio server exports its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`), for the telemetry test."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("studio")
    db = folder / "studio.sqlite"
    env = {
        "GATEDLOOP_MODEL": "demo",
        "GATEDLOOP_DB": str(db),
        "GATEDLOOP_LEDGER": None,
        "OPENAI_API_KEY": None,
        "GATEDLOOP_AUTH_TOKENS": None,
        "GATEDLOOP_AUTH_FILE": None,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_SERVICE_NAME": "studio",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRICS_EXPORTER": "none",
    }
    workdir = folder / "server"
    with run_dev_server(ROOT, env=env, workdir=workdir, config_overrides={"env": None}) as url:
        yield Server(_client(url), db, workdir, folder, url)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("lab")
    project = gated_project(folder, {"studio_app": f"{STUDIO_APP}:graph"})
    db = folder / "studio.sqlite"
    control = folder / "control"
    env = {"GATEDLOOP_DB": str(db), "STUDIO_APP_DIR": str(control)}
    with run_dev_server(project, env=env, workdir=folder / "server") as url:
        try:
            yield Server(_client(url), db, folder / "server", control)
        finally:
            (control / "release-all").touch()


# --- helpers --------------------------------------------------------------------------------------------------


def messages(values: dict[str, Any]) -> list[BaseMessage]:
    """SDK message dicts as LangChain messages (tool_calls and invalid_tool_calls kept)."""
    return messages_from_dict([{"type": m["type"], "data": m} for m in values["messages"]])


def tool_message(values: dict[str, Any], call_id: str) -> ToolMessage:
    [found] = [m for m in messages(values) if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    return found


def start(server: Server, graph: str, text: str) -> tuple[str, dict[str, Any]]:
    """A new thread run to its first interrupt; returns the thread id and the interrupt value from the state."""
    client = server.client
    thread_id = client.threads.create()["thread_id"]
    out = client.runs.wait(thread_id, graph, input={"messages": [{"role": "user", "content": text}]})
    return thread_id, paused(server, thread_id, out)


def paused(server: Server, thread_id: str, out: Any) -> dict[str, Any]:
    """The run stopped at exactly one interrupt, and the thread's state says so too."""
    assert isinstance(out, dict)
    assert len(out.get("__interrupt__", [])) == 1, out
    state = server.client.threads.get_state(thread_id)
    [interrupt] = state["interrupts"]
    assert interrupt["value"] == out["__interrupt__"][0]["value"]
    assert server.client.threads.get(thread_id)["status"] == "interrupted"
    return interrupt["value"]


def resume(
    server: Server, thread_id: str, graph: str, answer: dict[str, Any], who: str | None = None
) -> dict[str, Any]:
    context = {"user_id": who} if who else None
    if graph != GRAPH:  # `lab`: a project of its own, with no http.app, so no middleware reports refusals
        return server.client.runs.wait(thread_id, graph, command={"resume": answer}, context=context)
    return resumed(server.client, thread_id, graph, answer, context=context)  # a refusal is also its __error__


def decide(
    server: Server, thread_id: str, answer: dict[str, Any], graph: str = GRAPH, who: str | None = None
) -> dict[str, Any]:
    """Resume with a valid answer as reviewer `who` (the run's context); the run must end (see `finished`)."""
    return finished(server, thread_id, resume(server, thread_id, graph, answer, who))


def finished(server: Server, thread_id: str, out: Any) -> dict[str, Any]:
    """The run ended: no interrupt, thread idle, its state equal to what the run returned."""
    assert isinstance(out, dict)
    assert "__interrupt__" not in out, out["__interrupt__"]
    state = server.client.threads.get_state(thread_id)
    assert state["interrupts"] == []
    assert state["next"] == []
    assert {key: state["values"].get(key) for key in out} == out
    assert server.client.threads.get(thread_id)["status"] == "idle"
    assert_each_call_answered_once(messages(out))
    return out


def workshop(participant: str) -> str:
    return f"Reserve a seat in workshop WS-101 for {participant}"


def reservations(server: Server, thread_id: str) -> list[str]:
    """Participants booked under this thread's seat call (the store deduplicates on the idempotency key)."""
    key = idempotency_key(thread_id, SEAT_CALL)
    sql = "SELECT participant FROM reservations WHERE idempotency_key=?"
    return [r[0] for r in server.query(server.folder / "demo-data.sqlite", sql, key)]


def booked(server: Server, participant: str) -> bool:
    sql = "SELECT 1 FROM reservations WHERE event_id='WS-101' AND participant=?"
    return bool(server.query(server.folder / "demo-data.sqlite", sql, participant))


def start_workshop(server: Server, participant: str) -> tuple[str, dict[str, Any]]:
    thread_id, request = start(server, GRAPH, workshop(participant))
    args = {"event_id": "WS-101", "participant": participant}
    assert request["kind"] == "approval"
    [action] = request["action_requests"]
    assert {k: action[k] for k in ("name", "args", "tool_call_id")} == {
        "name": "reserve_seat",
        "args": args,
        "tool_call_id": SEAT_CALL,
    }
    assert isinstance(action["args_digest"], str) and action["args_digest"]
    assert request["review_configs"] == [{"action_name": "reserve_seat", "allowed_decisions": ALL_DECISIONS}]
    assert "error" not in request
    assert server.ledger(thread_id, SEAT_CALL) is None, "nothing runs before the reviewer answers"
    return thread_id, request


# --- the repo's langgraph.json: demo graph, SQLite checkpointer, each approval decision -----------------------------


def test_repo_config_serves_the_demo_graph_on_the_sqlite_checkpointer(studio: Server) -> None:
    config = json.loads((ROOT / "langgraph.json").read_text())
    assert config["graphs"] == {GRAPH: "gatedloop.demo.studio:graph"}
    assert config["checkpointer"] == {"path": STUDIO_CHECKPOINTER}
    assert [a["graph_id"] for a in studio.client.assistants.search(graph_id=GRAPH)] == [GRAPH]
    log = (studio.workdir / "langgraph-dev.log").read_text()
    assert "Using custom checkpointer: GatedAsyncSqliteSaver" in log
    startup = log[: log.index("Application started up")]
    assert not [line for line in startup.splitlines() if "[warning" in line or "[error" in line], startup


def test_the_inbox_is_served_at_slash_inbox_and_answers_through_the_checked_path(studio: Server) -> None:
    """`http.app` in langgraph.json: the same server serves /inbox. With no auth configured the reviewer is the
    API's local user (as for the API); the checkpoint (what Studio and the SDK read) shows the thread completed."""
    thread_id, _ = start_workshop(studio, "Inbox Ines")
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def send(path: str, **form: str) -> str:
        data = urllib.parse.urlencode(form).encode() if form else None
        with browser.open(f"{studio.url}{path}", data=data, timeout=60) as response:
            return response.read().decode()

    page = send("/inbox")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf is not None and "Reviewer token" not in page
    card = page[page.index(f'data-key="{thread_id}"') :]
    assert "reserve_seat" in card and "Inbox Ines" in card
    request_id = re.search(r'name="request_id" value="([^"]+)"', card)
    assert request_id is not None
    answer = {"thread_id": thread_id, "request_id": request_id.group(1), "decision-0": "approve"}
    page = send("/inbox/answer", csrf=csrf.group(1), **answer)
    assert f"Thread {thread_id}: decided; the thread ended: completed" in page
    assert studio.client.threads.get_state(thread_id)["values"]["status"] == "completed"
    assert reservations(studio, thread_id) == ["Inbox Ines"]
    assert [e["actor"] for e in studio.audit(thread_id) if e["event"] == "decision"] == ["local"]


def test_approve_runs_the_reservation_and_the_answer_reports_it(studio: Server) -> None:
    thread_id, _ = start_workshop(studio, "李娜")
    out = decide(studio, thread_id, {"decisions": [{"type": "approve"}], "reviewer": "a note"}, who="alice")

    assert out["status"] == "completed"
    result = json.loads(tool_message(out, SEAT_CALL).content)
    assert result["participant"] == "李娜" and result["event_id"] == "WS-101"
    expected = f"Reserved: {result['reservation_id']} for 李娜 in WS-101 ({result['seats_left']} seats left)."
    assert out["answer"] == expected
    assert reservations(studio, thread_id) == ["李娜"]

    # Checkpoints, ledger and audit trail share GATEDLOOP_DB; nothing went to the old default paths.
    entry = studio.ledger(thread_id, SEAT_CALL)
    assert entry is not None and entry.state == "done" and entry.attempts == 1
    decisions = [a for a in studio.audit(thread_id) if a["event"] == "decision"]
    assert [(a["call_id"], a["actor"], a["detail"]["decision"]) for a in decisions] == [(SEAT_CALL, "alice", "approve")]
    [(checkpoints,)] = studio.query(studio.db, "SELECT count(*) FROM checkpoints WHERE thread_id=?", thread_id)
    assert checkpoints >= 4
    assert not (studio.workdir / ".gatedloop").exists()


def test_edit_runs_the_edited_participant_not_the_proposed_one(studio: Server) -> None:
    thread_id, _ = start_workshop(studio, "Bob")
    edited = {"name": "reserve_seat", "args": {"event_id": "WS-101", "participant": "王芳"}}
    out = decide(studio, thread_id, {"decisions": [{"type": "edit", "edited_action": edited}]})

    assert out["status"] == "completed"
    message = tool_message(out, SEAT_CALL)
    assert message.status == "success"
    body = json.loads(message.content)
    assert body["ran_with"] == edited["args"]
    assert body["result"]["participant"] == "王芳"
    assert "王芳" in out["answer"] and "Bob" not in out["answer"]
    assert reservations(studio, thread_id) == ["王芳"]
    assert not booked(studio, "Bob")


def test_reject_with_a_reason_reaches_the_model_and_reserves_nothing(studio: Server) -> None:
    thread_id, _ = start_workshop(studio, "Carol")
    answer = {"decisions": [{"type": "reject", "message": "the workshop budget is frozen"}], "reviewer": "alice"}
    out = decide(studio, thread_id, answer)

    message = tool_message(out, SEAT_CALL)
    assert message.status == "error"
    assert json.loads(message.content) == {
        "ok": False,
        "error": {"type": "rejected_by_reviewer", "message": "the workshop budget is frozen", "retryable": False},
    }
    assert out["status"] == "completed"
    assert "rejected_by_reviewer" in out["answer"] and "the workshop budget is frozen" in out["answer"]
    assert reservations(studio, thread_id) == []
    assert not booked(studio, "Carol")
    assert studio.ledger(thread_id, SEAT_CALL) is None


@pytest.fixture(scope="module")
def responded(studio: Server) -> tuple[str, dict[str, Any]]:
    thread_id, _ = start_workshop(studio, "Dave")
    answer = {"decisions": [{"type": "respond", "message": "Dave already has a seat via his team."}]}
    return thread_id, decide(studio, thread_id, answer)


def test_respond_gives_the_model_the_reviewers_message_instead_of_running(
    studio: Server, responded: tuple[str, dict[str, Any]]
) -> None:
    thread_id, out = responded
    message = tool_message(out, SEAT_CALL)
    assert message.status == "success"
    assert json.loads(message.content) == {
        "ok": True,
        "answered_by": "reviewer",
        "result": "Dave already has a seat via his team.",
    }
    assert reservations(studio, thread_id) == []
    assert not booked(studio, "Dave")
    assert studio.ledger(thread_id, SEAT_CALL) is None


def test_respond_completes(studio: Server) -> None:
    client = studio.client
    thread_id = client.threads.create()["thread_id"]
    client.runs.wait(thread_id, GRAPH, input={"messages": [{"role": "user", "content": workshop("Frank")}]})
    answer = {"decisions": [{"type": "respond", "message": "Frank is on leave that week."}]}
    out = resume(studio, thread_id, GRAPH, answer)
    assert (out["status"], out["stop_detail"]) == ("completed", None)


def refused(request: dict[str, Any], error: str) -> dict[str, Any]:
    """The same request again with the reason, also in each action's description (all Agent Chat UI shows)."""
    actions = [
        {**a, "description": f"{a['description']}\n\nPrevious answer refused: {error}"}
        for a in request["action_requests"]
    ]
    return {**request, "action_requests": actions, "error": error}


def test_malformed_answers_change_nothing_and_the_same_request_can_then_be_answered(studio: Server) -> None:
    thread_id, request = start_workshop(studio, "Erin")

    two = {"decisions": [{"type": "approve"}, {"type": "approve"}]}
    again = paused(studio, thread_id, resume(studio, thread_id, GRAPH, two))
    assert again == refused(request, "expected 1 decision(s), one per action, got 2")

    unknown = {"decisions": [{"type": "maybe"}]}
    again = paused(studio, thread_id, resume(studio, thread_id, GRAPH, unknown))
    complaint = f"decision 0 (reserve_seat): unknown type 'maybe'; expected one of {ALL_DECISIONS}"
    assert again == refused(request, complaint)
    assert studio.ledger(thread_id, SEAT_CALL) is None
    assert not booked(studio, "Erin")

    out = decide(studio, thread_id, {"decisions": [{"type": "approve"}]})
    assert out["status"] == "completed"
    assert "Erin" in out["answer"]
    assert reservations(studio, thread_id) == ["Erin"]


def test_read_only_question_needs_no_approval(studio: Server) -> None:
    client = studio.client
    thread_id = client.threads.create()["thread_id"]
    text = "订单 ORD-2026-001 到哪里了?"
    out = client.runs.wait(thread_id, GRAPH, input={"messages": [{"role": "user", "content": text}]})
    out = finished(studio, thread_id, out)
    assert out["status"] == "completed"
    assert [m.name for m in messages(out) if isinstance(m, ToolMessage)] == ["query_order", "query_logistics"]
    assert out["answer"].startswith("订单已经发货")


def test_an_approval_turn_under_langgraph_dev_is_exported_as_spans(studio: Server, otlp: OtlpReceiver) -> None:
    """With `OTEL_EXPORTER_OTLP_ENDPOINT` set on the server (docs/observability.md), an approval turn run through
    langgraph-sdk (start, interrupt, resume with an approval) is one trace: the run that asks, the approval's span
    (decider, seconds waited) under it, and the run that takes the answer continuing it, with the model calls and
    the tool run (GenAI attributes); the participant (an argument) is in no span."""
    thread_id, request = start_workshop(studio, "Olga Otel")
    decide(studio, thread_id, {"decisions": [{"type": "approve"}]}, who="alice")

    def turn(spans: list[Span]) -> list[Span]:
        roots = [s for s in spans if s.attributes.get("gen_ai.conversation.id") == thread_id]
        return [s for s in spans if s.trace_id in {r.trace_id for r in roots}]

    def complete(spans: list[Span]) -> bool:
        ran = turn(spans)
        return any(s.attributes.get("gatedloop.status") for s in ran) and any(
            s.name == "approval reserve_seat" for s in ran
        )

    spans = turn(otlp.wait_for(complete))
    [asking] = [s for s in spans if s.attributes.get("gatedloop.interrupted") and s.name.startswith("invoke_")]
    [answering] = [s for s in spans if s.attributes.get("gatedloop.status") == "completed"]
    assert {s.trace_id for s in spans} == {asking.trace_id}
    assert answering.parent_id == asking.span_id and answering.service == "studio"
    [approval] = [s for s in spans if s.attributes.get("gatedloop.request.id") == request["request_id"]]
    assert approval.name == "approval reserve_seat" and approval.parent_id == asking.span_id
    assert (approval.attributes["gatedloop.decider"], approval.attributes["gatedloop.verdict"]) == ("alice", "approve")
    assert approval.attributes["gatedloop.waited_s"] > 0
    [seat] = [s for s in spans if s.attributes.get("gen_ai.tool.name") == "reserve_seat"]
    assert seat.attributes["gen_ai.operation.name"] == "execute_tool"
    assert seat.attributes["gen_ai.tool.call.id"] == SEAT_CALL
    chats = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert {c.start_ns < answering.start_ns for c in chats} == {True, False}  # the model asked, then answered
    assert not [body for body in otlp.bodies if b"Olga Otel" in body]


# --- unknown outcomes: support/studio_app.py, a write that times out with no reconcile --------------------------------


def slot_call(slot: str) -> str:
    return f"call_1_{slot}"


def attempts(server: Server, thread_id: str, slot: str) -> int:
    key = idempotency_key(thread_id, slot_call(slot))
    [(count,)] = server.query(server.folder / "effects.sqlite", "SELECT count(*) FROM attempts WHERE key=?", key)
    return int(count)


def effects(server: Server, thread_id: str, slot: str) -> int:
    key = idempotency_key(thread_id, slot_call(slot))
    [(count,)] = server.query(server.folder / "effects.sqlite", "SELECT count(*) FROM effects WHERE key=?", key)
    return int(count)


def start_unknown(server: Server, slot: str) -> tuple[str, dict[str, Any]]:
    thread_id, request = start(server, "studio_app", f"book {slot}")
    assert request == {
        "kind": "unknown_outcome",
        "calls": [
            {
                "tool_call_id": slot_call(slot),
                "name": "book_slot",
                "args": {"slot": slot},
                "idempotency_key": idempotency_key(thread_id, slot_call(slot)),
                "reason": "timeout",
            }
        ],
        "allowed_decisions": ["done", "not_done", "abandon"],
    }
    entry = server.ledger(thread_id, slot_call(slot))
    assert entry is not None and entry.state == "claimed" and entry.attempts == 1
    assert attempts(server, thread_id, slot) == 1
    return thread_id, request


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_unknown_outcome_marked_done_completes_with_the_given_result(lab: Server) -> None:
    thread_id, request = start_unknown(lab, "done-1")

    again = paused(lab, thread_id, resume(lab, thread_id, "studio_app", {"decisions": [{"type": "done"}]}))
    assert again == {**request, "error": 'decision 0: "done" needs the "result" the write produced'}

    answer = {"decisions": [{"type": "done", "result": {"booking": "B-77"}}], "reviewer": "bob"}
    out = decide(lab, thread_id, answer, "studio_app")
    assert out["status"] == "completed"
    message = tool_message(out, slot_call("done-1"))
    assert (message.status, json.loads(message.content)) == ("success", {"booking": "B-77"})
    assert out["answer"] == 'success: {"booking": "B-77"}'
    entry = lab.ledger(thread_id, slot_call("done-1"))
    assert entry is not None and entry.state == "done" and entry.attempts == 1
    decided = [(a["actor"], a["detail"]) for a in lab.audit(thread_id) if a["event"] == "unknown_outcome_decision"]
    assert decided == [("anonymous", {"decision": "done", "note": "bob"})]  # no identity here: "bob" is a note
    assert attempts(lab, thread_id, "done-1") == 1, "a write marked done is not run again"


def test_unknown_outcome_abandoned_ends_the_thread_needing_attention(lab: Server) -> None:
    thread_id, _ = start_unknown(lab, "abandon-1")
    out = decide(lab, thread_id, {"decisions": [{"type": "abandon"}]}, "studio_app")

    assert out["status"] == "needs_attention"
    assert out.get("answer") is None
    assert out["stop_detail"] == "a write's outcome is unknown and was left to a person"
    message = tool_message(out, slot_call("abandon-1"))
    assert message.status == "error"
    assert json.loads(message.content)["error"]["type"] == "outcome_unknown"
    entry = lab.ledger(thread_id, slot_call("abandon-1"))
    assert entry is not None and entry.state == "abandoned"
    assert attempts(lab, thread_id, "abandon-1") == 1


def test_not_done_is_refused_while_the_first_attempt_is_still_running(lab: Server) -> None:
    """Starting the write again while its first attempt may still land would risk a second effect."""
    thread_id, request = start_unknown(lab, "lost-1")
    again = paused(lab, thread_id, resume(lab, thread_id, "studio_app", {"decisions": [{"type": "not_done"}]}))
    assert "may still be running" in again["error"]
    assert {k: v for k, v in again.items() if k != "error"} == request
    assert attempts(lab, thread_id, "lost-1") == 1

    (lab.folder / "release-lost-1").touch()

    def recorded() -> bool:
        entry = lab.ledger(thread_id, slot_call("lost-1"))
        return entry is not None and entry.state != "claimed"

    wait_for(recorded, "the first attempt's failure to be recorded")
    out = decide(lab, thread_id, {"decisions": [{"type": "not_done"}]}, "studio_app")
    assert out["status"] == "completed"
    message = tool_message(out, slot_call("lost-1"))
    assert message.status == "error" and json.loads(message.content)["error"]["type"] == "tool_error"
    assert attempts(lab, thread_id, "lost-1") == 1
    assert effects(lab, thread_id, "lost-1") == 0


def test_not_done_after_the_first_attempt_finished_late_is_not_run_again(lab: Server) -> None:
    """The ledger recorded the late finish before the person answered: `not_done` must not replay the write."""
    thread_id, _ = start_unknown(lab, "late-1")
    (lab.folder / "release-late-1").touch()

    def recorded() -> bool:
        entry = lab.ledger(thread_id, slot_call("late-1"))
        return entry is not None and entry.state != "claimed"

    wait_for(recorded, "the late write to be recorded in the ledger")
    assert effects(lab, thread_id, "late-1") == 1

    out = decide(lab, thread_id, {"decisions": [{"type": "not_done"}]}, "studio_app")
    assert attempts(lab, thread_id, "late-1") == 1
    assert effects(lab, thread_id, "late-1") == 1
    entry = lab.ledger(thread_id, slot_call("late-1"))
    assert entry is not None and entry.state == "done" and entry.attempts == 1
    assert out["status"] == "completed"
