"""Notifications through the outbox (issue 23): the approve node queues each approval request once, in the ledger's
database; a deliverer POSTs it, signed by the Standard Webhooks specification (issue 32), to a real HTTP receiver on
127.0.0.1 that verifies the signature with the `standardwebhooks` package and de-duplicates by the signed id.
Failures, restarts and a SIGKILLed deliverer still give exactly one delivery per id."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
import uvicorn
from desk_app import desk_graph
from gate_app import build, effects_for, responder
from langchain_core.tools import InjectedToolArg, tool
from standardwebhooks import Webhook as StandardWebhook
from standardwebhooks.webhooks import WebhookVerificationError
from starlette.testclient import TestClient

from gatedloop.checkpoints import idempotency_key, open_sqlite
from gatedloop.checkpoints.outbox import notification_id
from gatedloop.cli.main import main
from gatedloop.graph import build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel
from gatedloop.inbox import InboxBackend, create_app
from gatedloop.inbox.identity import Reviewer, Sessions
from gatedloop.inbox.notify import Deliverer, NotifyConfig, PassResult, Webhook, closed_reason, notify_config
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import CallContext, ToolPolicy

SECRET = "s3cret-for-tests"
ANA = CallContext(user_id="ana", roles={"staff"})
BO = CallContext(user_id="bo", roles={"finance"})
HIDDEN = "iban-DE0012345678"  # the value of a secret argument: never in a body


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: checks every signature, fails the next `fail` POSTs with a 500, and with
    `hold` set keeps the first POST unanswered until `release` is set (`held` says it arrived)."""

    url: str = ""
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    bad_signatures: int = 0
    raw: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    fail: int = 0
    hold: bool = False
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def unique(self) -> dict[str, dict[str, Any]]:
        """What a receiver that de-duplicates by `webhook-id` keeps."""
        return {notice_id: body for notice_id, body in self.posts}

    def wait_for(self, count: int, timeout: float = 30) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.posts) >= count, timeout), self.posts


def verified(headers: Any, raw: bytes) -> bool:
    """The receiver's check, as the docs show it: `standardwebhooks` over id, timestamp and body (five minutes)."""
    try:
        StandardWebhook(SECRET.encode()).verify(raw, dict(headers.items()))
    except WebhookVerificationError:
        return False
    return True


def verified_the_old_way(headers: Any, raw: bytes) -> bool:
    """The deprecated recipe (still sent for one release): HMAC-SHA256 over `{timestamp}.{body}`."""
    lowered = {k.lower(): v for k, v in headers.items()}
    timestamp = lowered["x-gatedloop-timestamp"]
    expected = "sha256=" + hmac.new(SECRET.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(timestamp)) < 300
    return fresh and hmac.compare_digest(expected, lowered["x-gatedloop-signature"])


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            if not verified(self.headers, raw):
                state.bad_signatures += 1
                self.send_response(401)
                self.end_headers()
                return
            with state.arrived:
                state.posts.append((self.headers["webhook-id"], json.loads(raw)))
                state.raw.append((dict(self.headers.items()), raw))
                state.arrived.notify_all()
            if state.hold and not state.held.is_set():
                state.held.set()
                state.release.wait(30)
            failing = state.fail > 0
            state.fail -= 1 if failing else 0
            self.send_response(500 if failing else 204)
            if failing:
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"receiver down for maintenance")
            else:
                self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


class Clock:
    """The deliverer's clock, moved by the test instead of sleeping through backoffs and expiry windows."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def pause(saver: Any, thread_id: str, text: str = "pay 250 to " + HIDDEN + " as c1", **policy: Any) -> dict[str, Any]:
    """A thread of the payments app waiting for approval of `pay`, whose `to` is a secret argument."""
    graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), **policy)
    out = runs.start(graph, thread_id, text, context=ANA)
    return out["__interrupt__"][0].value


def deliverer(saver: Any, *webhooks: Webhook, clock: Clock | None = None, **tuning: Any) -> Deliverer:
    config = NotifyConfig(webhooks, SECRET.encode(), "http://inbox.example:8765/inbox", backoff_s=10.0, **tuning)
    return Deliverer(saver.ledger, config, clock=clock or Clock())


def outbox_rows(db: str) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT kind, request_id FROM gatedloop_outbox ORDER BY created_at").fetchall()


def test_a_request_is_queued_once_and_delivered_once_signed_with_its_secret_masked(db, receiver):
    with open_sqlite(db) as saver:
        request = pause(saver, "t1")
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}))
        with pytest.raises(InvalidDecision):
            runs.resume(graph, "t1", {"decisions": []}, context=BO)  # approve re-runs, asks again
        assert (runs.pending_request(graph, "t1") or {})["request_id"] == request["request_id"]
        assert outbox_rows(db) == [("request", request["request_id"])]
        sender = deliverer(saver, Webhook(receiver.url))
        assert sender.run_once().delivered == 1
        assert sender.run_once().delivered == 0
    assert receiver.bad_signatures == 0
    [(notice_id, body)] = receiver.posts
    assert body["id"] == notice_id and body["type"] == "approval_requested"
    assert (body["request_id"], body["thread_id"], body["requested_by"]) == (request["request_id"], "t1", "ana")
    assert [(a["tool"], a["tool_call_id"], a["args"]) for a in body["actions"]] == [
        ("pay", "c1", {"amount": 250.0, "to": "***"})
    ]
    assert body["url"] == f"http://inbox.example:8765/inbox/requests/{request['request_id']}?thread=t1"
    assert HIDDEN not in json.dumps(body)


def test_the_loop_closes_each_decision_and_how_the_request_ended_are_delivered(db, receiver):
    """Issue 32: a quorum of two on one thread, a rejection on another. Each accepted decision is an
    `approval_decided` (who, what per call, whether the request still waits), and a request a reviewer decided
    ends with a `request_finished` (its status and each tool answer); secrets masked, signatures verified, each
    notice once."""
    cy = CallContext(user_id="cy", roles={"finance"})
    with open_sqlite(db) as saver:
        request = pause(saver, "t1", approvals_required=2)
        pause(saver, "t2", "pay 300 to " + HIDDEN + " as c2", approvals_required=2)
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), approvals_required=2)
        assert runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=BO).get("__interrupt__")
        assert runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=cy)["status"] == "completed"
        reason = {"type": "reject", "message": "not this month"}
        assert runs.resume(graph, "t2", {"decisions": [reason]}, context=BO)["status"] == "completed"
        sender = deliverer(saver, Webhook(receiver.url))
        assert sender.run_once().delivered == 5  # 3 decisions, 2 ends (the requests were decided: skipped)
        assert sender.run_once().delivered == 0
    assert receiver.bad_signatures == 0 and len(receiver.unique()) == 5
    told = [b for _, b in receiver.posts if b["type"] in ("approval_decided", "request_finished")]
    summary = [(b["thread_id"], b["type"], b.get("decided_by"), b.get("waiting"), b.get("status")) for b in told]
    assert summary == [
        ("t1", "approval_decided", "bo", True, None),
        ("t1", "approval_decided", "cy", False, None),
        ("t1", "request_finished", None, None, "completed"),
        ("t2", "approval_decided", "bo", False, None),
        ("t2", "request_finished", None, None, "completed"),
    ]
    bo_first, _, t1_end, rejected, t2_end = told
    assert bo_first["request_id"] == request["request_id"] and bo_first["requested_by"] == "ana"
    assert bo_first["actions"] == [
        {"tool": "pay", "tool_call_id": "c1", "decision": "approve", "args": {"amount": 250.0, "to": "***"}}
    ]
    assert rejected["actions"][0]["decision"] == "reject"
    assert t1_end["ran"] == [{"tool": "pay", "tool_call_id": "c1", "status": "success"}]
    assert t2_end["ran"] == [{"tool": "pay", "tool_call_id": "c2", "status": "error"}]
    assert t1_end["url"] == "http://inbox.example:8765/inbox/thread/t1"
    assert HIDDEN not in json.dumps(told)


def test_a_slack_webhook_is_told_who_decided_and_how_it_ended(db, receiver):
    with open_sqlite(db) as saver:
        pause(saver, "t1")
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}))
        assert runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=BO)["status"] == "completed"
        assert deliverer(saver, Webhook(receiver.url, "slack")).run_once().delivered == 2
    texts = [body["text"] for _, body in receiver.posts]
    assert texts[0].startswith("Decided (thread t1): bo approved pay (c1) at ")
    assert texts[1] == "Finished (thread t1): The request ended: completed"
    assert "Tool answers: pay (c1): success" in receiver.posts[1][1]["blocks"][0]["text"]["text"]


def test_each_body_says_who_may_decide_each_call_and_a_decision_what_the_request_still_waits_for(db, receiver):
    """A request that mixes roles (a refund for finance, an email for support): the generic body names each call's
    approvers and what the request waits for; a Slack body says who may decide each call; bo's decision of the
    refund is told with the email still waiting for support."""
    with open_sqlite(db) as saver:
        graph = desk_graph(saver, [])
        runs.start(graph, "t1", "refund A-1001 and email ana", context=ANA)
        runs.resume(graph, "t1", {"decisions": [{"type": "approve", "tool_call_id": "r1"}]}, context=BO)
        sender = deliverer(saver, Webhook(receiver.url), Webhook(receiver.url, "slack"))
        assert sender.run_once().delivered == 4
    bodies = [body for _, body in receiver.posts]
    [asked] = [b for b in bodies if b.get("type") == "approval_requested"]
    assert [(a["tool"], a["approvers"]) for a in asked["actions"]] == [
        ("refund", ["finance"]),
        ("send_email", ["support"]),
    ]
    assert asked["waiting_for"] == "finance: refund; support: send_email"
    [decided] = [b for b in bodies if b.get("type") == "approval_decided"]
    assert (decided["decided_by"], decided["waiting"], decided["waiting_for"]) == ("bo", True, "support: send_email")
    slack_asked, slack_decided = [b["text"] + json.dumps(b["blocks"]) for b in bodies if "type" not in b]
    assert "Who may decide: finance" in slack_asked and "Who may decide: support" in slack_asked
    assert "bo approved refund (r1) at " in slack_decided
    assert "the request still waits for support: send_email" in slack_decided


LADDER = {
    "approvers": frozenset({"finance"}),
    "remind_after_s": 60,
    "escalate_after_s": 120,
    "backup_approvers": frozenset({"ops"}),
}


def test_the_expiry_ladder_reminds_then_escalates_each_step_a_notice_and_an_audit_row(db, receiver):
    """Issue 32: a request that waits is never silent. Past `remind_after_s` a reminder goes out, past
    `escalate_after_s` an escalation naming the backup roles, each once, signed, with an audit row; a request
    decided before its reminder is due has neither."""
    clock = Clock()
    with open_sqlite(db) as saver:
        waiting = pause(saver, "t1", **LADDER)
        pause(saver, "t2", "pay 300 to " + HIDDEN + " as c2", **LADDER)
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), **LADDER)
        assert runs.resume(graph, "t2", {"decisions": [{"type": "approve"}]}, context=BO)["status"] == "completed"
        sender = deliverer(saver, Webhook(receiver.url), clock=clock)
        assert sender.run_once().delivered == 3  # t1's request; t2's decision and end (its request: skipped)
        clock.offset += 61
        assert sender.run_once().delivered == 1
        clock.offset += 60
        assert sender.run_once().delivered == 1
        clock.offset += 600
        assert sender.run_once().delivered == 0
        steps = [(e["event"], e["detail"]) for e in saver.ledger.audit("t1") if e["actor"] == "gatedloop-notify"]
        assert [e["event"] for e in saver.ledger.audit("t2") if e["actor"] == "gatedloop-notify"] == []
    assert receiver.bad_signatures == 0
    ladder = [b for _, b in receiver.posts if b["type"] in ("approval_reminder", "approval_escalated")]
    assert [(b["type"], b["thread_id"], b["request_id"]) for b in ladder] == [
        ("approval_reminder", "t1", waiting["request_id"]),
        ("approval_escalated", "t1", waiting["request_id"]),
    ]
    assert ladder[1]["backup_approvers"] == ["ops"] and HIDDEN not in json.dumps(ladder)
    assert [event for event, _ in steps] == [
        f"approval_reminded:{waiting['request_id']}",
        f"approval_escalated:{waiting['request_id']}",
    ]
    assert steps[1][1]["backup_approvers"] == ["ops"]


def test_past_its_escalation_a_backup_approver_may_decide_and_not_before(db):
    ops = CallContext(user_id="olga", roles={"ops"})
    # 2 s: the refusal below must come before the escalation, and a loaded machine took over 0.5 s to get there
    policy = {**LADDER, "remind_after_s": None, "escalate_after_s": 2.0}
    with open_sqlite(db) as saver:
        request = pause(saver, "t1", **policy)
        [action] = request["action_requests"]
        assert action["backup_approvers"] == ["ops"] and action["escalates_at"] == action["requested_at"] + 2.0
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), **policy)
        with pytest.raises(InvalidDecision, match=r"roles \['finance'\] \(after 2 s waiting, or one of \['ops'\]\)"):
            runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=ops)
        assert effects_for(saver).rows("pay") == []
        time.sleep(max(0.0, action["escalates_at"] - time.time()) + 0.1)
        assert runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=ops)["status"] == "completed"
        [decision] = [e for e in saver.ledger.audit("t1") if e["event"] == "decision"]
        assert (decision["actor"], decision["detail"]["roles"]) == ("olga", ["ops"])
        assert len(effects_for(saver).rows("pay")) == 1


def test_a_captured_post_replayed_with_a_new_id_fails_the_signature(db, receiver):
    """The hole of the old recipe (its id outside the signature): a replay inside the window under a fresh id passed
    the verifier and the de-duplication. Standard Webhooks signs the id."""
    with open_sqlite(db) as saver:
        pause(saver, "t1")
        assert deliverer(saver, Webhook(receiver.url)).run_once().delivered == 1
    [(received, raw)] = receiver.raw
    headers = {k.lower(): v for k, v in received.items() if k.lower().startswith(("webhook-", "x-gatedloop-"))}
    assert headers["webhook-signature"].startswith("v1,")
    new_id = "ntf-replayed-under-a-new-id"
    replayed = {**headers, "webhook-id": new_id, "x-gatedloop-id": new_id}
    with httpx.Client() as client:
        assert client.post(receiver.url, content=raw, headers=replayed).status_code == 401
        assert client.post(receiver.url, content=raw, headers=headers).status_code == 204  # the same id: de-duplicated
    assert receiver.bad_signatures == 1 and len(receiver.unique()) == 1
    assert verified_the_old_way(headers, raw)  # the deprecated headers, kept for one release
    assert verified_the_old_way(replayed, raw)  # ... which is why they go: the old recipe accepts the replay


def test_a_whsec_secret_is_used_as_the_specification_has_it():
    from base64 import b64encode

    from gatedloop.inbox.notify import signed_headers

    secret = "whsec_" + b64encode(b"0123456789abcdef0123456789abcdef").decode()
    headers = signed_headers(secret.encode(), "ntf-1", b'{"a":1}', time.time())
    assert StandardWebhook(secret).verify(b'{"a":1}', headers) == {"a": 1}
    with pytest.raises(WebhookVerificationError):
        StandardWebhook(secret.encode()).verify(b'{"a":1}', headers)  # not the secret's text as bytes


def test_a_failing_receiver_is_retried_with_backoff_and_status_shows_the_error(db, receiver, capsys):
    down = Webhook("http://127.0.0.1:9/never")  # nothing listens on the discard port: connection refused
    clock = Clock()
    with open_sqlite(db) as saver:
        request = pause(saver, "t1")
        sender = deliverer(saver, Webhook(receiver.url), down, clock=clock, max_attempts=3)
        receiver.fail = 2
        assert sender.run_once().failed == 2
        assert sender.run_once().failed == 0 and len(receiver.posts) == 1  # backing off: nothing was due
        assert main(["notify", "--status", "--json", "--db", db]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        by_url = {row["url"]: row for row in rows}
        assert by_url[receiver.url]["state"] == "pending" and by_url[receiver.url]["attempts"] == 1
        assert by_url[receiver.url]["last_error"] == "HTTP 500: receiver down for maintenance"
        assert by_url[receiver.url]["request_id"] == request["request_id"]
        clock.offset += 10
        assert sender.run_once().failed == 2  # second attempts, due after 10 s
        clock.offset += 20
        third = sender.run_once()  # due 20 s later: the receiver is back; the dead URL's last attempt
        assert (third.delivered, third.failed) == (1, 1)
        assert sender.run_once() == PassResult()
        assert main(["notify", "--status", "--db", db]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("failed   http://127.0.0.1:9/never") and "3 attempt(s), given up: ConnectError" in line
    assert len(receiver.posts) == 3 and list(receiver.unique()) == [receiver.posts[0][0]]
    assert receiver.bad_signatures == 0


def test_a_request_whose_calls_expire_at_different_times_is_warned_before_each_while_a_call_waits(db, receiver):
    """The letter expires after 100 s, the refund after 1000: a warning before each deadline, none in between, and
    the request's reminders are not closed by the letter's expiry (the refund may still be decided)."""
    from dataclasses import replace

    from desk_app import POLICIES as DESK

    clock = Clock()
    policies = {
        "refund": replace(DESK["refund"], approval_ttl_s=1000),
        "send_email": replace(DESK["send_email"], approval_ttl_s=100),
    }
    with open_sqlite(db) as saver:
        graph = desk_graph(saver, [], policies)
        config = {"configurable": {"thread_id": "t1"}}
        request = graph.invoke({"messages": [("user", "refund and tell ana")]}, config, context=ANA)
        deadline = {a["tool_call_id"]: a["expires_at"] for a in request["__interrupt__"][0].value["action_requests"]}
        sender = deliverer(saver, Webhook(receiver.url), clock=clock, expiry_warning_s=30)
        assert sender.run_once().delivered == 1
        for at, told in ((deadline["e1"] - 10, 1), (deadline["e1"] + 5, 0), (deadline["r1"] - 10, 1)):
            clock.offset = at - time.time()
            assert sender.run_once().delivered == told, at
    told = [(b["type"], b["expires_at"]) for _, b in receiver.posts]
    assert told == [
        ("approval_requested", deadline["e1"]),  # the first deadline a reviewer faces
        ("approval_expiring", deadline["e1"]),
        ("approval_expiring", deadline["r1"]),
    ]


def test_an_expiry_notice_goes_out_once_and_only_for_a_request_still_undecided(db, receiver):
    clock = Clock()
    with open_sqlite(db) as saver:
        waiting = pause(saver, "t1", approval_ttl_s=100)
        decided = pause(saver, "t2", "pay 300 to " + HIDDEN + " as c2", approval_ttl_s=100)
        sender = deliverer(saver, Webhook(receiver.url), clock=clock, expiry_warning_s=30)
        assert sender.run_once().delivered == 2
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), approval_ttl_s=100)
        done = runs.resume(graph, "t2", {"decisions": [{"type": "approve"}]}, context=BO)
        assert done["status"] == "completed"
        assert sender.run_once().delivered == 2  # t2's decision and its end; t1 is not yet near its expiry
        clock.offset += 75
        assert sender.run_once().delivered == 1
        clock.offset += 10
        assert sender.run_once().delivered == 0
    told = [b["type"] for _, b in receiver.posts[2:4]]
    assert told == ["approval_decided", "request_finished"]
    expiring = [(b["type"], b["request_id"], b["thread_id"]) for _, b in receiver.posts[4:]]
    assert expiring == [("approval_expiring", waiting["request_id"], "t1")]
    assert decided["request_id"] != waiting["request_id"]
    assert len(receiver.unique()) == 5


def test_an_extended_request_is_warned_again_before_its_new_deadline_past_the_first(db, receiver):
    """Issue 32: one `approval_expiring` per deadline. Warned before its first deadline, then extended by an
    approver, the request is warned again before the new deadline, once the first one has passed, and the warning
    names the deadline it warns of; the first warning, were it still to go out, is skipped."""
    clock = Clock()
    with open_sqlite(db) as saver:
        request = pause(saver, "t1", approval_ttl_s=100)
        graph = build(saver, effects_for(saver), approval="always", secret_args=frozenset({"to"}), approval_ttl_s=100)
        first = request["action_requests"][0]["expires_at"]
        sender = deliverer(saver, Webhook(receiver.url), clock=clock, expiry_warning_s=0.2)
        assert sender.run_once().delivered == 1
        clock.offset = first - 0.1 - time.time()
        assert sender.run_once().delivered == 1  # within 0.2 s of the first deadline
        time.sleep(0.5)  # the extension (on the gate's real clock) gives a deadline 0.5 s past the first one
        until = runs.extend(graph, "t1", context=BO, request_id=request["request_id"]).until
        assert until >= first + 0.5
        clock.offset = first + 0.1 - time.time()
        assert sender.run_once().delivered == 0  # past the first deadline, not yet near the new one
        clock.offset = until - 0.1 - time.time()
        assert sender.run_once().delivered == 1
        assert sender.run_once().delivered == 0
        clock.offset = until + 1 - time.time()
        assert sender.run_once().delivered == 0
        warned_first = next(n for _, n in saver.ledger.deliveries(["delivered"]) if n.kind == "expiring")
        assert closed_reason(saver.ledger, warned_first, first - 0.1) == "extended before delivery"
    assert receiver.bad_signatures == 0
    warnings = [b for _, b in receiver.posts if b["type"] == "approval_expiring"]
    assert [(b["request_id"], b["expires_at"]) for b in warnings] == [
        (request["request_id"], d) for d in (first, until)
    ]
    assert len({b["id"] for b in warnings}) == 2 and HIDDEN not in json.dumps(warnings)


def test_a_slack_webhook_gets_slacks_body_with_the_link_and_masked_arguments(db, receiver):
    config = notify_config(
        [], [receiver.url], inbox_url="https://review.example/inbox", env={"GATEDLOOP_NOTIFY_SECRET": SECRET}
    )
    assert config is not None
    with open_sqlite(db) as saver:
        request = pause(saver, "t1")
        assert Deliverer(saver.ledger, config).run_once().delivered == 1
    [(_, body)] = receiver.posts
    link = f"https://review.example/inbox/requests/{request['request_id']}?thread=t1"
    assert body["text"].startswith("Approval requested: pay (thread t1)") and body["text"].endswith(link)
    section, actions = body["blocks"]
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert "`pay`" in section["text"]["text"] and '"to": "***"' in section["text"]["text"]
    assert actions["elements"][0]["url"] == link
    assert HIDDEN not in json.dumps(body)


def test_two_deliverers_never_post_the_same_delivery_at_once(db, receiver):
    receiver.hold = True
    with open_sqlite(db) as saver:
        pause(saver, "t1")
        first, second = deliverer(saver, Webhook(receiver.url)), deliverer(saver, Webhook(receiver.url))
        running = threading.Thread(target=first.run_once)
        running.start()
        assert receiver.held.wait(30)
        assert second.run_once().delivered == 0  # the first one's lease holds while its POST is in flight
        receiver.release.set()
        running.join(30)
        assert second.run_once().delivered == 0
    assert len(receiver.posts) == 1


def notify_command(db: str, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gatedloop.cli.main", "--db", db, "notify", "--webhook", url, *extra]


def test_a_deliverer_killed_mid_delivery_is_followed_by_one_that_delivers_the_same_id(db, receiver, tmp_path, capsys):
    env = {**os.environ, "GATEDLOOP_NOTIFY_SECRET": SECRET}
    with open_sqlite(db) as saver:
        request = pause(saver, "t1")
    receiver.hold = True
    log = tmp_path / "notify.log"
    with log.open("wb") as out:
        killed = subprocess.Popen(notify_command(db, receiver.url), env=env, stdout=out, stderr=out)
    try:
        assert receiver.held.wait(60), log.read_text()
        killed.kill()  # SIGKILL, the POST in flight and unrecorded
        killed.wait(30)
    finally:
        if killed.poll() is None:
            killed.kill()
    receiver.release.set()
    again = subprocess.run(
        notify_command(db, receiver.url, "--once", "--json"), env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["delivered"] == 1
    assert len(receiver.posts) == 2  # posted again under the same id: at least once
    [(notice_id, body)] = receiver.unique().items()
    assert body["request_id"] == request["request_id"] and body["id"] == notice_id
    assert receiver.bad_signatures == 0
    assert main(["--db", db, "notify", "--status", "--json"]) == 0
    assert capsys.readouterr().out == ""  # nothing pending or failed


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--webhook", "ftp://hooks.example/x"], {"GATEDLOOP_NOTIFY_SECRET": SECRET}, "is not an http(s) URL"),
        (["--webhook", "https://hooks.example/x"], {}, "GATEDLOOP_NOTIFY_SECRET is not set"),
        ([], {"GATEDLOOP_NOTIFY_URLS": "https://a.example/x, https:///nohost"}, "is not an http(s) URL with a host"),
        ([], {}, "no webhook configured"),
        (
            ["--webhook", "https://a.example/x"],
            {"GATEDLOOP_NOTIFY_SECRET": "whsec_not*base64!"},
            "starts with whsec_ but the rest is not base64",
        ),
        (
            ["--webhook", "https://a.example/x", "--inbox-url", "inbox"],
            {"GATEDLOOP_NOTIFY_SECRET": SECRET},
            "inbox URL",
        ),
    ],
)
def test_bad_notify_configuration_is_refused_with_one_line(db, capsys, monkeypatch, argv, env, message):
    for name in ("GATEDLOOP_NOTIFY_URLS", "GATEDLOOP_NOTIFY_SECRET", "GATEDLOOP_INBOX_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["--db", db, "notify", "--once", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and message in err
    assert not Path(db).exists()  # refused before the database was opened


def test_the_inbox_runs_the_deliverer_and_links_to_its_own_page(db, receiver, tmp_path):
    with open_sqlite(db) as saver:
        request = pause(saver, "t1")
    port = free_port()
    env = {**os.environ, "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": "", "GATEDLOOP_GRAPH": "demo"}
    env.update(GATEDLOOP_NOTIFY_SECRET=SECRET, GATEDLOOP_NOTIFY_URLS=receiver.url)
    for name in ("GATEDLOOP_AUTH_TOKENS", "GATEDLOOP_AUTH_FILE", "GATEDLOOP_INBOX_URL"):
        env.pop(name, None)
    command = [sys.executable, "-m", "gatedloop.cli.main", "--db", db, "inbox", "--as", "bo", "--port", str(port)]
    log = tmp_path / "inbox.log"
    with log.open("wb") as out:
        inbox = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    try:
        receiver.wait_for(1, timeout=60)
    finally:
        inbox.terminate()
        inbox.wait(30)
    [(_, body)] = receiver.posts
    page = f"http://127.0.0.1:{port}/inbox/requests/{request['request_id']}?thread=t1"
    assert body["url"] == page, log.read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_outbox_keeps_one_row_per_request_and_one_lease_holder_on_each_backend(backend):
    from pg_server import new_thread_id

    thread_id = new_thread_id("notify") if backend.name == "postgres" else "t1"
    with backend.open() as saver:
        ledger = saver.ledger
        payload = {"request_id": "req-1", "actions": []}
        first = ledger.record_notification(thread_id, "req-1", "request", payload, created_at=1.0, expires_at=None)
        again = ledger.record_notification(thread_id, "req-1", "request", {}, created_at=2.0, expires_at=None)
        assert (first, again) == (True, False)
        notice = notification_id(thread_id, "req-1", "request")
        assert ledger.notification(notice).payload == payload
        ledger.dispatch([(notice, "e1", "http://x/", "pending", None)], now=1.0)
        ledger.dispatch([(notice, "e1", "http://x/", "skipped", "late")], now=1.0)  # kept as first dispatched
        won = [ledger.claim_delivery(notice, "e1", who, 5.0, 65.0, None) for who in ("a#1", "b#2")]
        assert won == [True, False]
        assert ledger.claim_delivery(notice, "e1", "b#2", 5.0, 65.0, "a#1")  # a#1 seen dead: taken over
        assert not ledger.finish_delivery(notice, "e1", "a#1", "delivered", now=6.0, next_attempt_at=6.0, error=None)
        assert ledger.finish_delivery(notice, "e1", "b#2", "delivered", now=6.0, next_attempt_at=6.0, error=None)
        assert [d.state for d, n in ledger.deliveries(["delivered"]) if n.id == notice] == ["delivered"]


def test_each_deadline_of_a_request_is_warned_of_once_on_each_backend(backend):
    """The outbox's side of one warning per deadline, in each backend's SQL: an extension moves the request's
    deadline (never back), `unwarned` selects it again past the first deadline, and a second `expiring` notice for
    the request is a row of its own."""
    from pg_server import new_thread_id

    thread_id = new_thread_id("warned") if backend.name == "postgres" else "t1"
    with backend.open() as saver:
        ledger = saver.ledger
        ledger.record_notification(thread_id, "req-1", "request", {}, created_at=1.0, expires_at=100.0)

        def unwarned(now: float) -> list[float | None]:
            return [n.expires_at for n in ledger.unwarned(now) if n.thread_id == thread_id]

        def warn(deadline: float) -> bool:
            return ledger.record_notification(
                thread_id, "req-1", "expiring", {}, created_at=deadline - 1, expires_at=deadline, part=repr(deadline)
            )

        assert unwarned(50.0) == [100.0]
        assert warn(100.0) and not warn(100.0)
        assert unwarned(50.0) == []
        assert ledger.extend_notification(thread_id, "req-1", 150.0)
        assert not ledger.extend_notification(thread_id, "req-1", 140.0)  # never back
        assert not ledger.extend_notification(thread_id, "req-other", 150.0)  # no such request
        assert unwarned(120.0) == [150.0]  # past the first deadline
        assert warn(150.0)
        assert unwarned(120.0) == [] and unwarned(200.0) == []
        warnings = [
            ledger.notification(notification_id(thread_id, "req-1", "expiring", repr(d))) for d in (100.0, 150.0)
        ]
        assert [n.expires_at for n in warnings] == [100.0, 150.0]


OLD_OUTBOX = """CREATE TABLE gatedloop_outbox (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('request', 'expiring', 'unknown')),
    thread_id TEXT NOT NULL, request_id TEXT NOT NULL, payload TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL
)"""
"""The outbox as gatedloop made it before the `decided` and `finished` notices (stop 36)."""


@contextmanager
def old_outbox(kind: str, tmp_path: Path) -> Iterator[Any]:
    """A database whose outbox has the old CHECK and one old row, opened as gatedloop opens it now."""
    row = ("ntf-old", "request", "t0", "req-0", "{}", 1.0, None)
    if kind == "sqlite":
        path = str(tmp_path / "old.sqlite")
        with sqlite3.connect(path) as conn:
            conn.execute(OLD_OUTBOX)
            conn.execute("INSERT INTO gatedloop_outbox VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        with open_sqlite(path) as saver:
            yield saver.ledger
        return
    import psycopg
    from aegra_servers import fresh_database
    from pg_server import require_postgres

    from gatedloop.checkpoints.postgres import open_postgres

    with fresh_database(require_postgres()) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(OLD_OUTBOX.replace("REAL", "DOUBLE PRECISION"))
            conn.execute("INSERT INTO gatedloop_outbox VALUES (%s, %s, %s, %s, %s, %s, %s)", row)
        with open_postgres(url) as saver:
            yield saver.ledger


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_an_outbox_made_before_the_loop_closed_takes_the_new_notices_and_keeps_its_rows(kind, tmp_path):
    with old_outbox(kind, tmp_path) as ledger:
        for notice in ("decided", "finished", "grant_used"):
            assert ledger.record_notification("t1", "req-1", notice, {"n": notice}, created_at=2.0, expires_at=None)
        assert ledger.notification("ntf-old").request_id == "req-0"
        assert ledger.notification(notification_id("t1", "req-1", "finished")).payload == {"n": "finished"}


# --- questions about a write whose outcome is unknown ---------------------------------------------------------------

DONE = {"decisions": [{"type": "done", "result": {"payment": "seen at the bank"}}]}


def lossy_graph(saver: Any, **policy: Any) -> Any:
    """The payments app with an ungated `pay` whose connection drops after the payment is made, and no
    `reconcile`: every payment's outcome is unknown and a person is asked (`policy`: more of `pay`'s policy)."""
    effects = effects_for(saver)

    @tool
    def pay(amount: float, to: str, idempotency_key: Annotated[str | None, InjectedToolArg] = None) -> dict[str, Any]:
        """Pay an amount to someone (write)."""
        effects.add("pay", {"amount": amount, "to": to}, idempotency_key)
        raise ConnectionError("connection reset after the request was sent")

    rules = ToolPolicy(effect="write", approval="never", secret_args=frozenset({"to"}), **policy)
    return build_graph(
        ScriptedChatModel(responder=responder), [pay], policies={"pay": rules}, checkpointer=saver, name="lossy"
    )


def ask_unknown(saver: Any, thread_id: str = "u1", **policy: Any) -> Any:
    return ask_unknown_question(saver, thread_id, **policy)[0]


def ask_unknown_question(saver: Any, thread_id: str = "u1", **policy: Any) -> tuple[Any, dict[str, Any]]:
    """The lossy graph, and the question it puts about `thread_id`'s payment."""
    graph = lossy_graph(saver, **policy)
    out = runs.start(graph, thread_id, "pay 250 to " + HIDDEN + " as c1", context=ANA)
    question = out["__interrupt__"][0].value
    assert question["kind"] == "unknown_outcome"
    return graph, question


def test_an_unknown_outcome_question_is_delivered_once_with_its_reason_key_and_masked_arguments(db, receiver):
    with open_sqlite(db) as saver:
        graph = ask_unknown(saver)
        with pytest.raises(InvalidDecision):
            runs.resume(graph, "u1", {"decisions": []}, context=BO)  # the settle task re-runs and asks again
        assert (runs.pending_request(graph, "u1") or {})["kind"] == "unknown_outcome"
        assert outbox_rows(db) == [("unknown", "unknown:c1")]
        sender = deliverer(saver, Webhook(receiver.url))
        assert sender.run_once().delivered == 1
        asked = next(e["detail"]["asked_at"] for e in saver.ledger.audit("u1") if e["event"].startswith("unknown_"))
        assert runs.resume(graph, "u1", DONE, context=BO)["status"] == "completed"
        assert sender.run_once() == PassResult()
        assert outbox_rows(db) == [("unknown", "unknown:c1")]
    assert receiver.bad_signatures == 0
    [(notice_id, body)] = receiver.posts
    assert body["id"] == notice_id and body["type"] == "outcome_unknown"
    assert body.keys() == {"id", "type", "request_id", "thread_id", "requested_by", "requested_at", "expires_at"} | {
        "actions",
        "url",
    }
    assert (body["request_id"], body["thread_id"], body["requested_by"]) == ("unknown:c1", "u1", "ana")
    assert (body["requested_at"], body["expires_at"]) == (asked, None)
    assert body["actions"] == [
        {
            "tool": "pay",
            "tool_call_id": "c1",
            "args": {"amount": 250.0, "to": "***"},
            "idempotency_key": idempotency_key("u1", "c1"),
            "reason": "connection_lost",
        }
    ]
    assert body["url"] == "http://inbox.example:8765/inbox/thread/u1"
    assert HIDDEN not in json.dumps(body)


def test_an_unknown_outcome_settled_before_delivery_is_skipped_with_its_reason(db, receiver):
    with open_sqlite(db) as saver:
        graph = ask_unknown(saver)
        assert runs.resume(graph, "u1", DONE, context=BO)["status"] == "completed"
        assert deliverer(saver, Webhook(receiver.url)).run_once() == PassResult()
        [(delivery, notice)] = saver.ledger.deliveries(["skipped"])
        assert (notice.kind, delivery.last_error) == ("unknown", "settled before delivery")
    assert receiver.posts == []


def test_an_unknown_outcomes_question_is_reminded_then_escalated_each_step_a_notice_and_an_audit_row(db, receiver):
    """Issue 32's ladder for the second kind of question: past `remind_after_s` from its first asking a reminder,
    past `escalate_after_s` an escalation naming the backup roles, each once, signed, with the question's body (no
    approval fields) and an audit row; a question settled before its reminder is due has neither."""
    clock = Clock()
    with open_sqlite(db) as saver:
        graph, question = ask_unknown_question(saver, "u1", **LADDER)
        ask_unknown(saver, "u2", **LADDER)
        [call] = question["calls"]
        asked = next(e["detail"]["asked_at"] for e in saver.ledger.audit("u1") if e["event"].startswith("unknown_"))
        assert (call["remind_at"], call["escalates_at"], call["backup_approvers"]) == (asked + 60, asked + 120, ["ops"])
        assert runs.resume(graph, "u2", DONE, context=BO)["status"] == "completed"
        sender = deliverer(saver, Webhook(receiver.url), clock=clock)
        assert sender.run_once().delivered == 1  # u1's question (u2's was settled: skipped)
        clock.offset += 61
        assert sender.run_once().delivered == 1
        clock.offset += 60
        assert sender.run_once().delivered == 1
        clock.offset += 600
        assert sender.run_once().delivered == 0
        steps = [(e["event"], e["detail"]) for e in saver.ledger.audit("u1") if e["actor"] == "gatedloop-notify"]
        assert [e["event"] for e in saver.ledger.audit("u2") if e["actor"] == "gatedloop-notify"] == []
        skipped = sorted((n.thread_id, n.kind, d.last_error) for d, n in saver.ledger.deliveries(["skipped"]))
    assert skipped == [("u2", kind, "settled before delivery") for kind in ("escalated", "reminder", "unknown")]
    assert receiver.bad_signatures == 0
    ladder = [b for _, b in receiver.posts[1:]]
    assert [(b["type"], b["thread_id"], b["request_id"]) for b in ladder] == [
        ("outcome_unknown_reminder", "u1", "unknown:c1"),
        ("outcome_unknown_escalated", "u1", "unknown:c1"),
    ]
    assert [b["actions"] for b in ladder] == [receiver.posts[0][1]["actions"]] * 2  # the question's own body
    assert ladder[1]["backup_approvers"] == ["ops"] and ladder[1]["url"] == "http://inbox.example:8765/inbox/thread/u1"
    assert HIDDEN not in json.dumps(ladder)
    assert [event for event, _ in steps] == [
        "unknown_outcome_reminded:unknown:c1",
        "unknown_outcome_escalated:unknown:c1",
    ]
    assert steps[0][1]["due_at"] == asked + 60 and steps[1][1]["backup_approvers"] == ["ops"]


def test_past_its_escalation_a_backup_approver_may_settle_an_unknown_outcome_and_not_before(db):
    """The escalation is judged from the question's first asking, by the gate itself: no step needs to run."""
    ops = CallContext(user_id="olga", roles={"ops"})
    with open_sqlite(db) as saver:
        graph, question = ask_unknown_question(saver, "u1", **{**LADDER, "remind_after_s": None, "escalate_after_s": 1})
        [call] = question["calls"]
        assert "remind_at" not in call and call["backup_approvers"] == ["ops"]
        with pytest.raises(InvalidDecision, match=r"roles \['finance'\] \(after 1 s waiting, or one of \['ops'\]\)"):
            runs.resume(graph, "u1", DONE, context=ops)
        assert saver.ledger.get("u1", "c1").state == "claimed"  # not settled
        with TestClient(inbox_for(graph, saver)) as client:
            assert "escalates to ops at " in client.get("/inbox").text  # the card shows when
        time.sleep(max(0.0, call["escalates_at"] - time.time()) + 0.1)
        assert runs.resume(graph, "u1", DONE, context=ops)["status"] == "completed"
        [decision] = [e for e in saver.ledger.audit("u1") if e["event"] == "unknown_outcome_decision"]
        assert (decision["actor"], decision["detail"]["decision"]) == ("olga", "done")
        assert saver.ledger.get("u1", "c1").state == "done"


def test_a_slack_webhook_is_told_the_outcome_is_unknown_and_why(db, receiver):
    config = notify_config(
        [], [receiver.url], inbox_url="https://review.example/inbox", env={"GATEDLOOP_NOTIFY_SECRET": SECRET}
    )
    assert config is not None
    with open_sqlite(db) as saver:
        ask_unknown(saver)
        assert Deliverer(saver.ledger, config).run_once().delivered == 1
    [(_, body)] = receiver.posts
    link = "https://review.example/inbox/thread/u1"
    assert body["text"] == f"Outcome unknown: pay (thread u1): {link}"
    text = body["blocks"][0]["text"]["text"]
    assert "Why unknown: connection_lost" in text and '"to": "***"' in text
    assert body["blocks"][1]["elements"][0]["url"] == link
    assert HIDDEN not in json.dumps(body)


def test_the_unknown_outcome_link_opens_a_page_of_the_real_inbox_that_shows_the_question(db, receiver):
    with open_sqlite(db) as saver:
        graph = ask_unknown(saver)
        with listening_socket() as sock:
            inbox_url = f"http://127.0.0.1:{sock.getsockname()[1]}/inbox"
            config = NotifyConfig((Webhook(receiver.url),), SECRET.encode(), inbox_url)
            assert Deliverer(saver.ledger, config).run_once().delivered == 1
            [(_, body)] = receiver.posts
            with serving(inbox_for(graph, saver), sock), httpx.Client(follow_redirects=True) as client:
                page = client.get(body["url"])
                assert page.status_code == 200 and "Waiting for an answer (outcome unknown)" in page.text
                assert "pay: connection_lost" in page.text and HIDDEN not in page.text
                [question] = [href for href in _links(page.text) if href.startswith("/inbox/requests/")]
                card = client.get(inbox_url.removesuffix("/inbox") + question)
                assert card.status_code == 200 and "It happened (done, with its result)" in card.text


def _links(html: str) -> list[str]:
    return [href.replace("&amp;", "&") for href in re.findall(r'href="([^"]+)"', html)]


def inbox_for(graph: Any, saver: Any) -> Any:
    """The inbox app as `gatedloop inbox --as bo` builds it, over this graph and database."""

    @contextmanager
    def backend() -> Iterator[InboxBackend]:
        yield InboxBackend.over(graph, saver)

    return create_app(backend, Sessions(None, Reviewer("bo", frozenset({"finance"}), "fixed")))


@contextmanager
def listening_socket() -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1 before the server starts: a GET waits in its backlog, no polling needed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        yield sock
    finally:
        sock.close()


@contextmanager
def serving(app: Any, sock: socket.socket) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(30)


# --- standing grants (issue 53) -------------------------------------------------------------------------------------


def test_a_grant_made_used_and_revoked_is_told_with_its_bounds_masked_and_its_uses_only_when_asked_for(
    tmp_path, receiver, capsys, monkeypatch
):
    """Each notice is queued in the transaction that writes what it tells: the payment the tenant's limit refused
    took no use of the grant, so it queued no `grant_used`. A deliverer sends `grant_created` and `grant_revoked`
    (the bounds masked by the policy in force: `to` became secret before the revocation), and `grant_used` only
    where it opted in (`--grant-uses`); elsewhere it is skipped and says how to opt in."""
    from dataclasses import replace

    from grants_app import ANA as PAYER
    from grants_app import BO as FINANCE
    from grants_app import POLICIES, make_tools
    from grants_app import build as grants_graph
    from grants_app import responder as grants_responder
    from sample_app import Effects

    from gatedloop.inbox.notify import GRANT_USES_SKIPPED

    db = str(tmp_path / "runs.sqlite")
    with open_sqlite(db) as saver:
        graph = grants_graph(saver, Effects(tmp_path / "effects.sqlite"))
        where = ["to=bo", "amount<=400"]
        grant_id = runs.grant(graph, "pay", context=FINANCE, where=where, uses=3, expires_in_s=600, requester="ana")
        assert runs.start(graph, "a", "pay bo 300", context=PAYER)["status"] == "completed"
        refused = runs.start(graph, "b", "pay bo 300", context=PAYER)  # 600 past the tenant's 500: refused
        assert "limit_exceeded" in [m for m in refused["messages"] if m.type == "tool"][-1].content
        secret = {**POLICIES, "pay": replace(POLICIES["pay"], secret_args=frozenset({"to"}))}
        tools = make_tools(Effects(tmp_path / "effects.sqlite"))
        hiding = build_graph(ScriptedChatModel(responder=grants_responder), tools, policies=secret, checkpointer=saver)
        runs.revoke(hiding, grant_id, context=FINANCE)
        assert [kind for kind, _ in outbox_rows(db)] == ["grant_created", "grant_used", "grant_revoked"]
        assert deliverer(saver, Webhook(receiver.url)).run_once().delivered == 2
        [(_, skipped)] = saver.ledger.deliveries(["skipped"])
        assert (skipped.kind, saver.ledger.deliveries(["skipped"])[0][0].last_error) == (
            "grant_used",
            GRANT_USES_SKIPPED,
        )
        monkeypatch.setenv("GATEDLOOP_NOTIFY_SECRET", SECRET)
        monkeypatch.setenv("GATEDLOOP_INBOX_URL", "http://inbox.example:8765/inbox")
        assert main(["--db", db, "notify", "--once", "--webhook", receiver.url + "?uses", "--grant-uses"]) == 0
    capsys.readouterr()
    assert receiver.bad_signatures == 0 and (len(receiver.posts), len(receiver.unique())) == (5, 3)
    made, revoked, *again = [body for _, body in receiver.posts]
    assert made == {
        "id": made["id"],
        "type": "grant_created",
        "grant_id": grant_id,
        "tool": "pay",
        "bounds": {"amount": {"max": 400}, "to": {"eq": "bo"}},
        "bounds_text": "amount<=400, to=bo",
        "requester": "ana",
        "uses": 3,
        "uses_left": 3,
        "expires_at": made["expires_at"],
        "granted_by": "bo",
        "created_at": made["created_at"],
        "status": "live",
        "approvals_required": 1,
        "note": None,
        "url": "http://inbox.example:8765/inbox/grants",
    }
    assert (revoked["type"], revoked["revoked_by"], revoked["uses_left"]) == ("grant_revoked", "bo", 2)
    assert revoked["bounds"] == {"amount": {"max": 400}, "to": {"eq": "***"}}
    assert revoked["bounds_text"] == "amount<=400, to=***"
    [used] = [body for body in again if body["type"] == "grant_used"]
    assert {k: used[k] for k in ("grant_id", "tool", "thread_id", "tool_call_id", "uses", "uses_left")} == {
        "grant_id": grant_id,
        "tool": "pay",
        "thread_id": "a",
        "tool_call_id": "c1_0",
        "uses": 3,
        "uses_left": 2,
    }
    assert used["url"].endswith("/inbox/thread/a")


def test_a_slack_webhook_is_told_of_a_grant_in_one_line(db, receiver):
    with open_sqlite(db) as saver:
        graph = build(saver, effects_for(saver), approval="always", grantable=True)
        grant_id = runs.grant(graph, "pay", context=BO, where=["to=bo"], uses=2, expires_in_s=600, note="rent")
        assert deliverer(saver, Webhook(receiver.url, "slack")).run_once().delivered == 1
    [(_, body)] = receiver.posts
    assert body["text"].startswith(f"Grant {grant_id} created by bo: pay where to=bo; 2 uses; until ")
    assert body["text"].endswith("; live (rent)")
    assert body["blocks"][0]["text"]["text"].endswith("<http://inbox.example:8765/inbox/grants|Open in inbox>")


def test_a_pending_grant_is_told_when_a_second_granter_makes_it_live_and_each_use_names_its_requester(
    tmp_path, receiver
):
    """A grant of a two-approver tool is made pending by bo; cy's confirmation queues `grant_confirmed` in its own
    transaction, saying who confirmed, every granter so far and the status it left (live); ana's wire inside it then
    queues `grant_used` naming ana. A second confirmation by the same person is refused and queues nothing."""
    from grants_app import ANA, BO, CY
    from grants_app import build as grants_graph
    from sample_app import Effects

    from gatedloop.nodes.gate.grants import GrantNotAllowed

    db = str(tmp_path / "runs.sqlite")
    with open_sqlite(db) as saver:
        graph = grants_graph(saver, Effects(tmp_path / "effects.sqlite"))
        grant_id = runs.grant(graph, "wire", context=BO, where=["to=bo", "amount<=90"], uses=2, expires_in_s=600)
        assert runs.confirm_grant(graph, grant_id, context=CY).status == "live"
        with pytest.raises(GrantNotAllowed, match="already a granter"):
            runs.confirm_grant(graph, grant_id, context=CY)
        assert runs.start(graph, "w1", "wire bo 80", context=ANA)["status"] == "completed"
        assert [kind for kind, _ in outbox_rows(db)] == ["grant_created", "grant_confirmed", "grant_used"]
        assert deliverer(saver, Webhook(receiver.url), grant_uses=True).run_once().delivered == 3
        assert deliverer(saver, Webhook(receiver.url + "?slack", "slack")).run_once().delivered == 2
    made, confirmed, used, *slack = [body for _, body in receiver.posts]
    assert made["status"] == "pending (1 of 2 granters)"
    assert {k: v for k, v in confirmed.items() if k not in ("id", "expires_at", "confirmed_at")} == {
        "type": "grant_confirmed",
        "grant_id": grant_id,
        "tool": "wire",
        "bounds": {"amount": {"max": 90}, "to": {"eq": "bo"}},
        "bounds_text": "amount<=90, to=bo",
        "requester": None,
        "uses": 2,
        "uses_left": 2,
        "confirmed_by": "cy",
        "granted_by": ["bo", "cy"],
        "status": "live",
        "approvals_required": 2,
        "note": None,
        "url": "http://inbox.example:8765/inbox/grants",
    }
    assert (used["type"], used["requester"], used["thread_id"], used["uses_left"]) == ("grant_used", "ana", "w1", 1)
    assert [body["text"] for body in slack][1] == (
        f"Grant {grant_id} confirmed by cy: wire where amount<=90, to=bo; live (granted by bo, cy)"
    )
