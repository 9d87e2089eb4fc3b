"""Deciding in Slack (issue 32): `gatedloop notify --slack-channel` posts an approval message with the real
`slack_sdk` client to a fake Slack Web API on 127.0.0.1, and clicks reach the inbox's `/slack/actions` in Slack's
own `block_actions` shape, signed as Slack signs them. Each decision goes through the gate: payments are counted in
the payments app's effects file, and every message Slack is asked to post or update is asserted."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import httpx
import pytest
from desk_app import desk_graph
from devserver import gated_project, run_dev_server
from gate_app import build, effects_for
from http_stub import StubHandler, StubServer
from langgraph_sdk import get_sync_client
from sample_app import Effects
from starlette.testclient import TestClient

from gatedloop.checkpoints import open_sqlite
from gatedloop.cli.main import main
from gatedloop.graph import runs
from gatedloop.inbox import InboxBackend, create_app
from gatedloop.inbox.identity import Sessions
from gatedloop.inbox.notify import notify_config
from gatedloop.inbox.slack_actions import FAILED, UNMAPPED, SlackActions
from gatedloop.tools import CallContext

TOKEN = "xoxb-test-token"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL = "C0APPROVALS"
ANA = CallContext(user_id="ana", roles={"staff"})
USERS = {
    "UBO": {"user_id": "bo", "roles": ["finance"]},
    "UDEE": {"user_id": "dee", "roles": ["finance"]},
    "UCY": {"user_id": "cy", "roles": ["staff"]},
    "USUE": {"user_id": "sue", "roles": ["support"]},
}


@dataclass
class FakeSlack:
    """Slack's Web API as far as gatedloop uses it; every call recorded as (method, arguments)."""

    url: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)
    count: int = 0
    failing: set[str] = field(default_factory=set)
    """Methods answered with Slack's error shape (`{"ok": false, "error": ...}`)."""

    def of(self, method: str) -> list[dict[str, Any]]:
        with self.lock:
            return [args for name, args in self.calls if name == method]

    def wait_for(self, method: str, count: int = 1) -> list[dict[str, Any]]:
        """The calls of `method` once there are `count` (a click under a server is decided after Slack's ack)."""
        with self.lock:
            assert self.lock.wait_for(lambda: len(self.of(method)) >= count, 120), self.calls
        return self.of(method)

    def answer(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.calls.append((method, args))
            self.count += 1
            ts = f"1700000000.{self.count:06d}"
            self.lock.notify_all()
        if method in self.failing:
            return {"ok": False, "error": "message_not_found"}
        if method == "chat.postMessage":
            message = {"type": "message", "text": args["text"], "blocks": args.get("blocks"), "ts": ts, "bot_id": "B1"}
            return {"ok": True, "channel": args["channel"], "ts": ts, "message": message}
        if method == "chat.update":
            message = {"type": "message", "text": args["text"], "blocks": args.get("blocks")}
            return {"ok": True, "channel": args["channel"], "ts": args["ts"], "text": args["text"], "message": message}
        if method == "chat.postEphemeral":
            return {"ok": True, "message_ts": ts}
        return {"ok": False, "error": "unknown_method"}


@pytest.fixture
def slack(monkeypatch) -> Iterator[FakeSlack]:
    state = FakeSlack()

    class Handler(StubHandler):
        def do_POST(self) -> None:
            raw = self.read_body().decode()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                args = json.loads(raw or "{}")
            else:
                args = {k: v[0] for k, v in parse_qs(raw).items()}
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                body = {"ok": False, "error": "not_authed"}
            else:
                body = state.answer(self.path.rsplit("/", 1)[-1], args)
            self.send_body(200, "application/json; charset=utf-8", json.dumps(body).encode())

    with StubServer(Handler, label="fake Slack API") as server:
        state.url = f"{server.origin}/api/"
        monkeypatch.setenv("GATEDLOOP_SLACK_API_URL", state.url)
        monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
        yield state


def graph_of(saver: Any, **policy: Any) -> Any:
    return build(saver, effects_for(saver), approval="always", approvers=frozenset({"finance"}), **policy)


def payments(saver: Any) -> list[dict[str, Any]]:
    return [args for _, args, _ in effects_for(saver).rows("pay")]


def post_request(saver: Any, slack: FakeSlack) -> dict[str, Any]:
    """`gatedloop notify --slack-channel` for one pass; the message Slack was asked to post."""
    before = len(slack.of("chat.postMessage"))
    assert main(["--db", saver.path, "notify", "--once", "--slack-channel", CHANNEL]) == 0
    posted = slack.of("chat.postMessage")
    assert len(posted) == before + 1
    return posted[-1]


@contextmanager
def inbox(graph: Any, saver: Any, **env: str) -> Iterator[TestClient]:
    """The inbox app with its Slack endpoint, as `gatedloop inbox` builds it from the environment."""

    @contextmanager
    def backend() -> Iterator[InboxBackend]:
        yield InboxBackend.over(graph, saver)

    settings = {
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_BOT_TOKEN": TOKEN,
        "GATEDLOOP_SLACK_USERS": json.dumps(USERS),
        "GATEDLOOP_INBOX_URL": "https://review.example/inbox",
        **env,
    }
    actions = SlackActions.from_env({**os.environ, **settings})
    assert actions is not None
    with TestClient(create_app(backend, Sessions(None), slack=actions)) as client:
        yield client


clicks = iter(range(10**6))


def click_body(
    message: dict[str, Any], ts: str, slack_user: str, decision: str = "approve", chosen: dict[int, str] | None = None
) -> bytes:
    """Slack's `block_actions` payload for a click on a button of `message`, form-encoded as Slack sends it;
    `chosen`: the calls' radio buttons the clicker set (call index -> option), sent as Slack's `state`."""
    [button] = [
        e
        for b in message["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"] == f"gatedloop_{decision}"
    ]
    n = next(clicks)
    payload = {
        "type": "block_actions",
        "user": {"id": slack_user, "username": slack_user.lower(), "name": slack_user.lower(), "team_id": "T1"},
        "api_app_id": "A1",
        "token": "verification-token-unused",
        "container": {"type": "message", "message_ts": ts, "channel_id": CHANNEL, "is_ephemeral": False},
        "trigger_id": f"1234567890.{n}.abcdef",
        "team": {"id": "T1", "domain": "example"},
        "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": CHANNEL, "name": "approvals"},
        "message": {**message, "ts": ts, "type": "message"},
        "state": {"values": state_of(message, chosen or {})},
        "response_url": "https://hooks.slack.com/actions/T1/1/abc",
        "actions": [
            {
                "action_id": button["action_id"],
                "block_id": "gatedloop_decide",
                "text": button["text"],
                "value": button["value"],
                "style": button.get("style"),
                "type": "button",
                "action_ts": f"1700000100.{n:06d}",
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def state_of(message: dict[str, Any], chosen: dict[int, str]) -> dict[str, Any]:
    """Slack's `state.values` for the calls' radio buttons: block id -> action id -> the selected option."""
    values: dict[str, Any] = {}
    for index, value in chosen.items():
        [section] = [b for b in message["blocks"] if b.get("block_id") == f"gatedloop_call_{index}"]
        radio = section["accessory"]
        [option] = [o for o in radio["options"] if o["value"] == value]
        values[section["block_id"]] = {radio["action_id"]: {"type": "radio_buttons", "selected_option": option}}
    return values


def signed(body: bytes, *, at: float | None = None, secret: str = SIGNING_SECRET) -> dict[str, str]:
    """Slack's headers: `v0=` HMAC-SHA256 of `v0:{timestamp}:{body}` under the signing secret."""
    timestamp = str(int(time.time() if at is None else at))
    mac = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    return {
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": f"v0={mac}",
        "Content-Type": "application/x-www-form-urlencoded",
    }


def click(client: TestClient, body: bytes, headers: dict[str, str] | None = None) -> int:
    return client.post("/slack/actions", content=body, headers=headers or signed(body)).status_code


def start(saver: Any, thread_id: str = "t1", text: str = "pay 250 to bo as c1", **policy: Any) -> tuple[Any, Any]:
    graph = graph_of(saver, **policy)
    out = runs.start(graph, thread_id, text, context=ANA)
    return graph, out["__interrupt__"][0].value


def test_the_message_carries_the_request_the_digest_and_a_link_to_the_card(db, slack):
    with open_sqlite(db) as saver:
        _, request = start(saver)
        posted = post_request(saver, slack)
    assert posted["channel"] == CHANNEL
    [button] = [e for b in posted["blocks"] if b["type"] == "actions" for e in b["elements"] if "value" in e][:1]
    value = json.loads(button["value"])
    action = request["action_requests"][0]
    assert value == {"t": "t1", "r": request["request_id"], "c": [["c1", action["args_digest"]]]}
    [link] = [e["url"] for b in posted["blocks"] if b["type"] == "actions" for e in b["elements"] if "url" in e]
    assert link.endswith(f"/inbox/requests/{request['request_id']}?thread=t1")


def test_the_message_names_the_thread_as_its_card_does_without_its_secrets(db, slack):
    """The card's title (the thread's first user message, shortened, redacted of the thread's secret values) heads
    the message too, from the notice (the same function makes both)."""
    secret = "iban-DE0012345678"
    with open_sqlite(db) as saver:
        start(saver, text=f"pay 250 to {secret} as c1", secret_args=frozenset({"to"}))
        posted = post_request(saver, slack)
    head = posted["blocks"][0]["text"]["text"].splitlines()
    assert head[:3] == ["*Approval requested: pay*", "“pay 250 to *** as c1”", "Thread `t1`"]
    assert secret not in json.dumps(posted)


def test_a_signed_approve_click_runs_the_write_once_and_updates_the_message(db, slack):
    with open_sqlite(db) as saver:
        graph, _ = start(saver)
        posted = post_request(saver, slack)
        ts = "1700000000.000001"
        with inbox(graph, saver) as client:
            body = click_body(posted, ts, "UBO")
            assert click(client, body) == 200
            assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
            assert click(client, body) == 200  # the same request again (same trigger id): dropped
            assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
        assert runs.output(graph, "t1")["status"] == "completed"
    [update] = slack.of("chat.update")
    assert (update["channel"], update["ts"]) == (CHANNEL, ts)
    assert update["text"].startswith("bo answered at ")
    assert "pay (c1): approved and ran (approved by bo)" in update["text"]
    assert update["text"].endswith("The thread ended: completed.")
    assert [b["type"] for b in update["blocks"]][-1] == "context"
    assert "actions" not in [b["type"] for b in update["blocks"]]  # decided: no buttons left
    assert slack.of("chat.postEphemeral") == []


def test_each_call_gets_its_own_choice_and_submit_decides_them_in_one_answer(db, slack):
    with open_sqlite(db) as saver:
        graph, _ = start(saver, text="pay 250 to bo as c1, 300 to cy as c2")
        posted = post_request(saver, slack)
        radios = [b["accessory"] for b in posted["blocks"] if b.get("block_id", "").startswith("gatedloop_call_")]
        assert [[o["value"] for o in r["options"]] for r in radios] == [["approve", "reject"]] * 2
        ts = "1700000000.000001"
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, ts, "UBO", "submit", {0: "approve"})) == 200
            [told] = slack.of("chat.postEphemeral")
            assert told["text"] == "Choose Approve or Reject for pay (c2): nothing was decided."
            assert payments(saver) == [] and runs.output(graph, "t1").get("__interrupt__")
            assert click(client, click_body(posted, ts, "UBO", "submit", {0: "approve", 1: "reject"})) == 200
            assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
        out = runs.output(graph, "t1")
    assert out["status"] == "completed" and out["answer"] == "done: c1=success; c2=error"
    [update] = slack.of("chat.update")
    assert "pay (c1): approved and ran (approved by bo); pay (c2): rejected by bo" in update["text"]
    assert "actions" not in [b["type"] for b in update["blocks"]]
    assert not [b for b in update["blocks"] if "accessory" in b]  # decided: the choices are gone too


def test_in_a_request_that_mixes_roles_each_click_decides_the_clickers_own_calls(db, slack):
    """The newcomer's case: the message says who may decide each call; bo's Approve decides the refund only
    (nothing runs), then sue's choice on the same message decides the email; each write runs once, in the order
    proposed, and after each click the message tells where every call stands."""
    effects: list[str] = []
    with open_sqlite(db) as saver:
        graph = desk_graph(saver, effects)
        runs.start(graph, "t1", "refund A-1001 and email ana", context=ANA)
        posted = post_request(saver, slack)
        sections = [b["text"]["text"] for b in posted["blocks"] if b.get("block_id", "").startswith("gatedloop_call_")]
        assert ["Who may decide: finance" in sections[0], "Who may decide: support" in sections[1]] == [True, True]
        ts = "1700000000.000001"
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, ts, "UBO")) == 200  # "Approve all": all of his, the refund
            assert effects == [] and runs.output(graph, "t1").get("__interrupt__")
            first = slack.of("chat.update")[-1]
            sue = click_body({**posted, "blocks": first["blocks"]}, ts, "USUE", "submit", {1: "approve"})
            assert click(client, sue) == 200
        assert effects == ["refund A-1001", "email ana"]
        assert runs.output(graph, "t1")["status"] == "completed"
    after_bo, after_sue = slack.of("chat.update")
    assert (
        "refund (r1): approved (approved by bo), not run yet; send_email (e1): waiting for support." in after_bo["text"]
    )
    assert "actions" in [b["type"] for b in after_bo["blocks"]]  # sue's buttons are still there
    assert after_sue["text"].startswith("sue answered at ")
    assert (
        "refund (r1): approved and ran (approved by bo); send_email (e1): approved and ran (approved by sue)"
        in (after_sue["text"])
    )
    assert slack.of("chat.postEphemeral") == []


def test_a_forged_or_replayed_click_is_refused_and_changes_nothing(db, slack):
    with open_sqlite(db) as saver:
        graph, request = start(saver)
        posted = post_request(saver, slack)
        with inbox(graph, saver) as client:
            body = click_body(posted, "1.2", "UBO")
            assert click(client, body, signed(body, secret="not-the-signing-secret")) == 401
            old = signed(body, at=time.time() - 600)  # a captured click replayed after Slack's window
            assert click(client, body, old) == 401
            tampered = body.replace(b"UBO", b"UDEE")
            assert click(client, tampered, signed(body)) == 401  # the signature of another body
        assert payments(saver) == []
        assert (runs.pending_request(graph, "t1") or {})["request_id"] == request["request_id"]
    assert slack.of("chat.update") == [] and slack.of("chat.postEphemeral") == []


def test_a_user_without_the_role_and_an_unmapped_user_decide_nothing(db, slack):
    with open_sqlite(db) as saver:
        graph, request = start(saver)
        posted = post_request(saver, slack)
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UCY")) == 200
            assert click(client, click_body(posted, "1.2", "USTRANGER")) == 200
            assert click(client, click_body(posted, "1.2", "UCY", "reject")) == 200
        assert payments(saver) == []
        assert (runs.pending_request(graph, "t1") or {})["request_id"] == request["request_id"]
        refused = [e for e in saver.ledger.audit("t1") if e["event"].startswith("answer_refused")]
        assert {e["actor"] for e in refused} == {"cy"}  # judged by the gate, as cy
    no_role, unmapped, no_role_reject = slack.of("chat.postEphemeral")
    assert (no_role["user"], no_role["channel"]) == ("UCY", CHANNEL)
    assert no_role["text"].startswith("Not accepted:") and "finance" in no_role["text"]
    assert no_role_reject["text"].startswith("Not accepted:")
    assert (unmapped["user"], unmapped["text"]) == ("USTRANGER", UNMAPPED)
    assert slack.of("chat.update") == []


def test_two_approvers_of_a_quorum_run_the_write_after_the_second(db, slack):
    with open_sqlite(db) as saver:
        graph, _ = start(saver, approvals_required=2)
        posted = post_request(saver, slack)
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UBO")) == 200
            assert payments(saver) == []
            first = slack.of("chat.update")[-1]
            assert click(client, click_body(posted, "1.2", "UBO")) == 200  # bo again: counts once
            assert payments(saver) == []
            assert click(client, click_body({**posted, "blocks": first["blocks"]}, "1.2", "UDEE")) == 200
            assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
    first_update, *_, last = slack.of("chat.update")
    assert "pay (c1): approved, waiting for 1 more approval (so far: bo; 2 needed)" in first_update["text"]
    assert "ran" not in first_update["text"]
    assert "actions" in [b["type"] for b in first_update["blocks"]]  # still waiting for a second approver
    assert last["text"].startswith("dee answered at ")
    assert "pay (c1): approved and ran (approved by bo, dee)" in last["text"]
    assert "actions" not in [b["type"] for b in last["blocks"]]
    assert "bo answered at " in json.dumps(last["blocks"])  # the first approval is still told


def test_a_click_after_the_request_expired_is_reported_too_late_and_told_to_the_clicker(db, slack):
    """The gate counts no answer past the deadline: the message says the call expired and nothing ran (not that
    bo approved), and bo is told privately that his click came too late."""
    with open_sqlite(db) as saver:
        # 3 s: notify posts the request before it expires on a loaded machine too (1 s was missed at load 4.5)
        graph, request = start(saver, approval_ttl_s=3.0)
        posted = post_request(saver, slack)
        time.sleep(max(0.0, request["action_requests"][0]["expires_at"] + 0.05 - time.time()))
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UBO")) == 200
        assert payments(saver) == []
    [update] = slack.of("chat.update")
    assert "pay (c1): too late: its approval window closed at " in update["text"]
    assert "nothing ran" in update["text"] and "approved" not in update["text"]
    [told] = slack.of("chat.postEphemeral")
    assert told["user"] == "UBO" and told["text"].startswith("Too late: pay (c1)")
    assert "your answer was not counted and nothing ran" in told["text"]


def test_a_click_on_a_decided_or_replaced_request_is_refused_with_the_current_one(db, slack):
    with open_sqlite(db) as saver:
        graph, first = start(saver)
        posted = post_request(saver, slack)
        out = graph.invoke(
            {"messages": [("user", "pay 900 to cy as c2")]},
            {"configurable": {"thread_id": "t1"}},
            context=ANA,
            durability="sync",
        )
        current = out["__interrupt__"][0].value
        assert current["request_id"] != first["request_id"]
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UBO")) == 200
            assert payments(saver) == []
            replaced = slack.of("chat.postEphemeral")[-1]
            newer = post_request(saver, slack)
            assert click(client, click_body(newer, "1.3", "UBO", "reject")) == 200
            assert click(client, click_body(newer, "1.3", "UBO")) == 200  # decided: rejected already
        assert payments(saver) == []
        assert runs.output(graph, "t1")["status"] == "completed"
    assert "changed since it was shown" in replaced["text"] and current["request_id"] in replaced["text"]
    assert "review.example/inbox/requests/" in replaced["text"]
    decided = slack.of("chat.postEphemeral")[-1]
    assert "already decided" in decided["text"]
    [update] = slack.of("chat.update")
    assert "pay (c2): rejected by bo (“Rejected in Slack by bo.”), not run" in update["text"]


def test_a_message_that_cannot_be_updated_is_told_privately_and_the_decision_stands(db, slack):
    slack.failing.add("chat.update")
    with open_sqlite(db) as saver:
        graph, _ = start(saver)
        posted = post_request(saver, slack)
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UBO")) == 200
        assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
    [told] = slack.of("chat.postEphemeral")
    assert told["text"] == FAILED and told["user"] == "UBO"


def test_a_post_slack_refuses_is_retried_and_status_shows_slacks_error(db, slack, capsys):
    slack.failing.add("chat.postMessage")
    with open_sqlite(db) as saver:
        start(saver)
        assert main(["--db", db, "notify", "--once", "--slack-channel", CHANNEL]) == 1
        capsys.readouterr()
        assert main(["--db", db, "notify", "--status", "--json"]) == 0
    [row] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["url"], row["state"], row["attempts"]) == (f"slack channel {CHANNEL}", "pending", 1)
    assert row["last_error"] == "Slack: message_not_found"


def test_notify_refuses_a_slack_channel_without_a_bot_token(db, capsys, monkeypatch):
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    assert main(["--db", db, "notify", "--once", "--slack-channel", CHANNEL]) == 2
    assert "SLACK_BOT_TOKEN is not set" in capsys.readouterr().err
    assert notify_config([], [], [CHANNEL], env={"SLACK_BOT_TOKEN": TOKEN}) is not None


SUPPORT = Path(__file__).resolve().parent / "support"


def served_with_slack(
    tmp_path: Path, slack: FakeSlack, users: dict[str, Any], auth: dict[str, Any] | None = None
) -> tuple[Path, Path, dict[str, str | None]]:
    """The payments app under `langgraph dev` with the inbox as its `http.app`, its Slack endpoint and the fake Slack
    API; with `auth`, gatedloop's token auth. (project folder, database, server environment)"""
    project = gated_project(tmp_path, {"gate_app": str(SUPPORT / "gate_server_app.py:graph")})
    config = json.loads((project / "langgraph.json").read_text())
    (project / "langgraph.json").write_text(json.dumps({**config, "http": {"app": "gatedloop.inbox.server:app"}}))
    db = tmp_path / "gate.sqlite"
    env: dict[str, str | None] = {
        "GATEDLOOP_DB": str(db),
        "GATEDLOOP_LEDGER": None,
        "GATEDLOOP_AUTH_TOKENS": json.dumps(auth) if auth else None,
        "GATEDLOOP_AUTH_FILE": None,
        "PYTHONPATH": os.pathsep.join(p for p in [str(SUPPORT), os.environ.get("PYTHONPATH")] if p),
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_BOT_TOKEN": TOKEN,
        "GATEDLOOP_SLACK_USERS": json.dumps(users),
        "GATEDLOOP_SLACK_API_URL": slack.url,
    }
    return project, db, env


@pytest.mark.slow
def test_under_langgraph_dev_a_click_at_inbox_slack_actions_decides_through_the_server(tmp_path, slack):
    """The inbox as `langgraph dev`'s `http.app`: the click endpoint is `/inbox/slack/actions`, and the decision is a
    run through the server's API (no auth configured: the run's context names the mapped reviewer)."""
    project, db, env = served_with_slack(tmp_path, slack, USERS)
    with run_dev_server(project, env=env, workdir=tmp_path / "server") as url:
        client = get_sync_client(url=url, api_key=None, timeout=60)
        thread_id = client.threads.create()["thread_id"]
        ask = {"messages": [{"role": "user", "content": "pay 500 to bo as c1"}]}
        assert client.runs.wait(thread_id, "gate_app", input=ask, context={"user_id": "ana", "roles": ["staff"]})
        assert main(["--db", str(db), "notify", "--once", "--slack-channel", CHANNEL]) == 0
        [posted] = slack.of("chat.postMessage")
        with httpx.Client(timeout=60) as http:
            body, endpoint = click_body(posted, "1.2", "UBO"), f"{url}/inbox/slack/actions"
            assert http.post(endpoint, content=body, headers=signed(body, secret="x")).status_code == 401
            assert http.post(endpoint, content=body, headers=signed(body)).status_code == 200
            [update] = slack.wait_for("chat.update")
        thread = client.threads.get(thread_id)
    assert thread["status"] == "idle" and thread["values"]["status"] == "completed"
    assert "pay (c1): approved and ran (approved by bo)" in update["text"]
    assert update["text"].endswith("The thread ended: completed.")
    paid = Effects(db.with_name("effects.sqlite")).rows("pay")
    assert [args for _, args, _ in paid] == [{"amount": 500.0, "to": "bo"}]


API_TOKENS = {"ana": "ana-api-token-5e1f0c2b9d", "bo": "bo-api-token-7a3d6e1c4f", "cy": "cy-api-token-2b8e4d7a1c"}
API_AUTH = {
    "supervisor_roles": ["finance"],
    "tokens": {
        API_TOKENS["ana"]: {"user_id": "ana", "roles": ["staff"]},
        API_TOKENS["bo"]: {"user_id": "bo", "roles": ["finance"]},
        API_TOKENS["cy"]: {"user_id": "cy", "roles": ["staff"]},
    },
}


@pytest.mark.slow
def test_under_a_servers_auth_a_click_acts_with_the_mapped_reviewers_token(tmp_path, slack):
    """`langgraph dev` with gatedloop's auth: a Slack user maps to a reviewer's API token, and the click's decision is
    a run through the server's API as that token's user. cy's click (staff) is refused by the gate for the role and
    told privately; bo's approves it, and the audit names bo, the token's user."""
    users = {"UBO": {"token": API_TOKENS["bo"]}, "UCY": {"token": API_TOKENS["cy"]}}
    project, db, env = served_with_slack(tmp_path, slack, users, auth=API_AUTH)
    with run_dev_server(project, env=env, workdir=tmp_path / "server") as url:
        ana = get_sync_client(url=url, api_key=None, headers={"Authorization": f"Bearer {API_TOKENS['ana']}"})
        thread_id = ana.threads.create()["thread_id"]
        assert ana.runs.wait(
            thread_id, "gate_app", input={"messages": [{"role": "user", "content": "pay 500 to bo as c1"}]}
        )
        assert main(["--db", str(db), "notify", "--once", "--slack-channel", CHANNEL]) == 0
        [posted] = slack.of("chat.postMessage")
        with httpx.Client(timeout=60) as http:
            endpoint = f"{url}/inbox/slack/actions"
            body = click_body(posted, "1.2", "UCY")
            assert http.post(endpoint, content=body, headers=signed(body)).status_code == 200
            [told] = slack.wait_for("chat.postEphemeral")
            body = click_body(posted, "1.2", "UBO")
            assert http.post(endpoint, content=body, headers=signed(body)).status_code == 200
            [update] = slack.wait_for("chat.update")
        thread = ana.threads.get(thread_id)
    assert told == {
        **told,
        "user": "UCY",
        "text": "Not accepted: pay (c1): deciding this call needs one of the roles ['finance']",
    }
    assert thread["status"] == "idle" and thread["values"]["status"] == "completed"
    assert "pay (c1): approved and ran (approved by bo)" in update["text"]
    paid = Effects(db.with_name("effects.sqlite")).rows("pay")
    assert [args for _, args, _ in paid] == [{"amount": 500.0, "to": "bo"}]
    from gatedloop.checkpoints.ledger import SqliteLedger

    ledger = SqliteLedger(db)
    try:
        assert [e["actor"] for e in ledger.audit(thread_id) if e["event"] == "decision"] == ["bo"]
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("users", "served", "message"),
    [
        ({"U1": {"token": "not-a-configured-token-0000"}}, False, "the token of 'U1' is not one of the auth"),
        ({"U1": {"token": API_TOKENS["bo"], "user_id": "bo"}}, False, "the token names the user"),
        ({"U1": {"user_id": "bo", "roles": ["finance"]}}, True, "'U1' needs a token: under the server's auth"),
    ],
)
def test_a_slack_user_map_that_cannot_work_under_auth_is_refused_in_one_line(users, served, message):
    from gatedloop.graph.auth import AuthConfig
    from gatedloop.inbox.slack_actions import SlackConfigError, parse_users

    with pytest.raises(SlackConfigError) as refused:
        parse_users(json.dumps(users), AuthConfig.model_validate(API_AUTH), served=served)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    [bo] = parse_users(json.dumps({"U1": {"token": API_TOKENS["bo"]}}), AuthConfig.model_validate(API_AUTH)).values()
    assert (bo.user_id, bo.roles, bo.authorization) == ("bo", frozenset({"finance"}), f"Bearer {API_TOKENS['bo']}")


def test_a_request_too_large_for_slacks_limits_keeps_its_link_and_cuts_its_arguments():
    from gatedloop.inbox.slack import MAX_VALUE, approval_message

    calls = [
        {"tool": "pay", "tool_call_id": f"call-{i:040d}", "args": {"note": "x" * 4000}, "args_digest": "d" * 64}
        for i in range(30)
    ]
    payload = {"thread_id": "t1", "request_id": "req-1", "requested_by": "ana", "expires_at": None, "actions": calls}
    message = approval_message(payload, "https://review.example/inbox/requests/req-1?thread=t1")
    [buttons] = [b["elements"] for b in message["blocks"] if b["type"] == "actions"]
    assert [b["text"]["text"] for b in buttons] == ["Edit in inbox"]  # the buttons' value would pass MAX_VALUE
    assert all(len(b["text"]["text"]) <= 3000 for b in message["blocks"] if b["type"] == "section")
    assert len(json.dumps([[c["tool_call_id"], c["args_digest"]] for c in calls])) > MAX_VALUE


# --- Approve + grant (issue 53) ------------------------------------------------------------------------------------


def buttons_of(message: dict[str, Any]) -> list[str]:
    return [e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


def test_approve_and_grant_is_offered_only_where_the_tools_policy_is_grantable(db, slack):
    with open_sqlite(db) as saver:
        start(saver, "plain")
        plain = post_request(saver, slack)
        start(saver, "granting", grantable=True)
        granting = post_request(saver, slack)
        start(saver, "several", "pay 250 to bo as c1, 300 to cy as c2", grantable=True)
        several = post_request(saver, slack)
    assert "gatedloop_grant" not in buttons_of(plain)
    assert buttons_of(granting) == ["gatedloop_approve", "gatedloop_grant", "gatedloop_reject", "gatedloop_open"]
    [grant] = [
        e for b in granting["blocks"] if b["type"] == "actions" for e in b["elements"] if "grant" in e["action_id"]
    ]
    assert grant["text"]["text"] == "Approve + grant"
    radios = [b["accessory"] for b in several["blocks"] if b.get("block_id", "").startswith("gatedloop_call_")]
    assert [[o["value"] for o in r["options"]] for r in radios] == [["approve", "grant", "reject"]] * 2
    assert "gatedloop_grant" not in buttons_of(several)  # a grant is a call's choice, never "all"


def test_approve_and_grant_approves_the_call_and_the_next_identical_call_runs_with_no_request(db, slack):
    """bo's click approves ana's payment and grants ana's calls with exactly its arguments (uses and expiry as the
    Slack app is configured): her next identical payment runs with no request, another amount still asks, and the
    channel is told of the grant in one line."""
    settings = {"GATEDLOOP_SLACK_GRANT_USES": "2", "GATEDLOOP_SLACK_GRANT_EXPIRES": "30m"}
    with open_sqlite(db) as saver:
        graph, _ = start(saver, grantable=True)
        posted = post_request(saver, slack)
        with inbox(graph, saver, **settings) as client:
            assert click(client, click_body(posted, "1.2", "UBO", "grant")) == 200
        assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
        [made] = runs.grants(graph)
        assert (made.bounds, made.requester, made.uses, made.granted_by, made.status) == (
            "amount=250.0, to=bo",
            "ana",
            2,
            ["bo"],
            "live",
        )
        assert 1790 < made.expires_at - time.time() <= 1800
        again = runs.start(graph, "t2", "pay 250 to bo as c2", context=ANA)
        assert again["status"] == "completed" and "__interrupt__" not in again
        assert payments(saver) == [{"amount": 250.0, "to": "bo"}] * 2 and runs.grants(graph)[0].uses_left == 1
        assert runs.start(graph, "t3", "pay 251 to bo as c3", context=ANA).get("__interrupt__")
        assert main(["--db", saver.path, "notify", "--once", "--slack-channel", CHANNEL]) == 0
    [update] = slack.of("chat.update")
    assert "pay (c1): approved and ran (approved by bo)" in update["text"]
    assert f"Granted {made.grant_id}: pay calls by ana where amount=250.0, to=bo, 2 uses, until " in update["text"]
    [line] = [p["text"] for p in slack.of("chat.postMessage") if p["text"].startswith("Grant ")]
    assert line.startswith(f"Grant {made.grant_id} created by bo: pay where amount=250.0, to=bo, ana's calls; 2 uses")
    assert line.endswith("; live (Approve + grant in Slack (thread t1, call c1))")
    assert slack.of("chat.postEphemeral") == []


def test_approve_and_grant_by_a_clicker_who_may_not_grant_decides_nothing_and_records_nothing(db, slack):
    """cy has no approver role, and ana may not grant her own calls: each is told why, privately, and nothing is
    recorded (no approval, no refusal row, no grant); bo's plain Approve still decides it."""
    users = {**USERS, "UANA": {"user_id": "ana", "roles": ["finance"]}}
    with open_sqlite(db) as saver:
        graph, request = start(saver, grantable=True)
        posted = post_request(saver, slack)
        audit_before = saver.ledger.audit("t1")
        with inbox(graph, saver, GATEDLOOP_SLACK_USERS=json.dumps(users)) as client:
            assert click(client, click_body(posted, "1.2", "UCY", "grant")) == 200
            assert click(client, click_body(posted, "1.2", "UANA", "grant")) == 200
            assert saver.ledger.audit("t1") == audit_before and saver.ledger.approvals("t1", ["c1"]) == []
            assert runs.grants(graph) == [] and payments(saver) == []
            assert (runs.pending_request(graph, "t1") or {})["request_id"] == request["request_id"]
            assert click(client, click_body(posted, "1.2", "UBO")) == 200
        assert payments(saver) == [{"amount": 250.0, "to": "bo"}] and runs.grants(graph) == []
    no_role, own = slack.of("chat.postEphemeral")
    assert no_role["user"] == "UCY" and no_role["text"].startswith("Not accepted: pay (c1): granting calls of pay")
    assert "finance" in no_role["text"] and no_role["text"].endswith(
        "Nothing was decided (Approve decides the call without a grant)."
    )
    assert own["user"] == "UANA" and "ana may not grant her own calls of pay" in own["text"]
    [update] = slack.of("chat.update")
    assert update["text"].startswith("bo answered at ") and "Grant" not in update["text"]
    with pytest.raises(Exception, match="GATEDLOOP_SLACK_GRANT_USES='0'"):
        SlackActions.from_env(
            {"SLACK_SIGNING_SECRET": "s", "SLACK_BOT_TOKEN": TOKEN, "GATEDLOOP_SLACK_GRANT_USES": "0"}
        )


def test_approve_and_grant_of_a_quorum_tool_gives_a_pending_grant_a_second_granter_confirms(db, slack):
    with open_sqlite(db) as saver:
        graph, _ = start(saver, grantable=True, approvals_required=2)
        posted = post_request(saver, slack)
        with inbox(graph, saver) as client:
            assert click(client, click_body(posted, "1.2", "UBO", "grant")) == 200
            first = slack.of("chat.update")[-1]
            assert click(client, click_body({**posted, "blocks": first["blocks"]}, "1.2", "UDEE")) == 200
        assert payments(saver) == [{"amount": 250.0, "to": "bo"}]
        [pending] = runs.grants(graph)
        assert pending.status == "pending (1 of 2 granters)"
        assert runs.start(graph, "t2", "pay 250 to bo as c2", context=ANA).get("__interrupt__")  # covers nothing yet
        runs.confirm_grant(graph, pending.grant_id, context=CallContext(user_id="dee", roles={"finance"}))
        assert runs.start(graph, "t3", "pay 250 to bo as c3", context=ANA)["status"] == "completed"
    assert "pay (c1): approved, waiting for 1 more approval (so far: bo; 2 needed)" in first["text"]
    assert f"Granted {pending.grant_id}: " in first["text"]
    assert (
        f"; pending (1 of 2 granters): it covers nothing until another granter confirms it (gatedloop grant confirm"
        f" {pending.grant_id})." in first["text"]
    )
