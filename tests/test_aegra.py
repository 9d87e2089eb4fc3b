"""gatedloop served by Aegra (issue 31): two real Aegra server processes (uvicorn, as docs/deploying.md starts them) on
one Postgres database and one Redis queue, driven by the real `langgraph-sdk`, the graph built as docs/server.md says
(no checkpointer, no `ledger=`: tests/support/aegra_payments.py). Every real payment is a row in an effects file,
counted here. Served with `gatedloop.graph.aegra_auth` (issue 51): ana (staff) asks, bo (finance, a supervisor of her
workspace) answers.

Needs `GATEDLOOP_AEGRA` (the `aegra` executable of a Python 3.12+ venv with gatedloop installed:
`.ci/aegra_venv.sh` makes one), the test Postgres (`GATEDLOOP_TEST_PG_URL`) and Redis (`GATEDLOOP_TEST_REDIS_URL`:
`.ci/start_redis.sh`). Without them the module is skipped with the reason, as in the README's test command;
`.ci/run` then runs it with all three and `GATEDLOOP_AEGRA_REQUIRED=1`, under which a missing one fails instead.

    line=$(.ci/start_redis.sh) && export "$line" && line=$(.ci/aegra_venv.sh) && export "$line"
    GATEDLOOP_AEGRA_REQUIRED=1 .venv/bin/pytest -n 0 tests/test_aegra.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from aegra_servers import (
    AEGRA_ENV,
    APP,
    REDIS_ENV,
    TOKENS,
    AegraServer,
    Deployment,
    deployment,
    fresh_database,
    server_env,
    wait_until,
)
from pg_server import PostgresUnavailable, find_postgres
from sample_app import Effects

pytestmark = pytest.mark.slow
GRAPH = "payments"
HANDED_ON_S = 120.0
"""How long a killed worker's run may take to finish elsewhere: lease (6 s) + reaper (1 s) + a loaded machine."""


REQUIRED_ENV = "GATEDLOOP_AEGRA_REQUIRED"


def missing(reason: str) -> None:
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(f"{REQUIRED_ENV} is set but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def aegra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    executable = os.environ.get(AEGRA_ENV)
    if not executable or not Path(executable).is_file():
        missing(f"Aegra is not installed: set {AEGRA_ENV} to the `aegra` of a Python 3.12 venv (.ci/aegra_venv.sh)")
    redis_url = os.environ.get(REDIS_ENV)
    if not redis_url:
        missing(f'no Redis: set {REDIS_ENV} (line=$(.ci/start_redis.sh) && export "$line")')
    try:
        pg_url = find_postgres()
    except PostgresUnavailable as exc:
        missing(str(exc))
    with deployment(str(executable), pg_url, str(redis_url), tmp_path_factory.mktemp("aegra")) as found:
        yield found


@pytest.fixture
def both(aegra: Deployment) -> Deployment:
    """Both processes running when a test starts (an earlier test may have stopped or killed one)."""
    aegra.ensure_running()
    return aegra


def client(server: Any, user: str, header: str = "authorization", token: str | None = None) -> Any:
    from langgraph_sdk import get_sync_client

    token = token or TOKENS[user]
    headers = {"Authorization": f"Bearer {token}"} if header == "authorization" else {"X-Api-Key": token}
    return get_sync_client(url=server.url, headers=headers, timeout=120)


def ask(sdk: Any, text: str) -> str:
    thread_id = sdk.threads.create()["thread_id"]
    sdk.runs.wait(thread_id, GRAPH, input={"messages": [{"role": "user", "content": text}]})
    return thread_id


def pending(sdk: Any, thread_id: str) -> list[dict[str, Any]]:
    return [i["value"] for i in sdk.threads.get_state(thread_id).get("interrupts") or []]


def answer(sdk: Any, thread_id: str, *decisions: dict[str, Any]) -> Any:
    return sdk.runs.wait(thread_id, GRAPH, command={"resume": {"decisions": list(decisions)}})


def payee(prefix: str) -> str:
    """A payee no other test pays: the effects of a test are the rows paying it."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def payments(aegra: Deployment, to: str) -> list[tuple[str, dict[str, Any], str | None]]:
    return [row for row in Effects(aegra.effects).rows() if row[1]["to"] == to]


def paid_by(aegra: Deployment, to: str) -> list[int]:
    """The process ids that made the payments to `to`."""
    with sqlite3.connect(aegra.effects) as conn:
        rows = conn.execute("SELECT args, pid FROM effects ORDER BY seq").fetchall()
    return [pid for args, pid in rows if json.loads(args)["to"] == to]


def model_pids(aegra: Deployment) -> list[int]:
    path = aegra.control / "model-calls"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def decided(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "decision"]


def audit(aegra: Deployment, thread_id: str) -> list[dict[str, Any]]:
    from gatedloop.checkpoints.postgres import PostgresLedger

    return PostgresLedger(aegra.database_url).audit(thread_id)


def test_an_approval_answered_on_the_other_process_runs_the_write_once(both: Deployment) -> None:
    """(a) Process A asks (ana), only A running; the approval (bo's) goes to process B with A stopped, so the
    approval and the write cannot share a process's memory. Before checkpoints/ledger_for.py gave LangGraph's
    Postgres saver a ledger, B answered the call "never validated" and the thread ended `completed` with no
    payment."""
    a, b = both[0], both[1]
    b.stop()
    to = payee("bo")
    thread_id = ask(client(a, "ana"), f"pay 500 to {to} as a1")
    [request] = pending(client(a, "ana"), thread_id)
    assert request["kind"] == "approval" and request["action_requests"][0]["args"] == {"amount": 500.0, "to": to}
    asked_in = model_pids(both)[-1]
    b.start()
    a.stop()
    out = answer(client(b, "bo", header="x-api-key"), thread_id, {"type": "approve"})  # Agent Chat UI's header
    assert out["status"] == "completed", out
    assert [(args["amount"], args["to"]) for _, args, _ in payments(both, to)] == [(500.0, to)]
    assert paid_by(both, to) == [b.server_pid()] != [asked_in]
    bo_b = client(b, "bo")
    assert bo_b.threads.get(thread_id)["status"] == "idle"
    assert pending(bo_b, thread_id) == []

    a.start()
    with pytest.raises(httpx.HTTPStatusError) as second:  # a second answer, on the other process
        answer(client(a, "bo"), thread_id, {"type": "approve"})
    assert second.value.response.status_code == 400 and "not in interrupted state" in second.value.response.text
    assert len(payments(both, to)) == 1
    assert client(a, "bo").threads.get(thread_id)["status"] == "idle"

    events = audit(both, thread_id)
    decisions = [
        (e["actor"], e["detail"]["decision"], e["detail"]["roles"]) for e in events if e["event"] == "decision"
    ]
    assert decisions == [("bo", "approve", ["finance"])], events  # the token's user and roles
    assert [e["event"] for e in events if e["event"] == "executed"] == ["executed"]


def test_gatedloop_notify_beside_aegra_tells_the_request_its_decision_and_its_end(
    both: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gatedloop notify` run beside the servers on Aegra's own database (where gatedloop's ledger and outbox live)
    delivers the request, then bo's decision made through the other process and how the request ended, to a
    receiver that verifies each body with `standardwebhooks`."""
    from http_stub import StubHandler, StubServer
    from standardwebhooks import Webhook

    from gatedloop.cli.main import main

    secret = "whsec_" + "c2VjcmV0LWZvci1hZWdyYS10ZXN0cw=="
    verifier, received = Webhook(secret), []

    class Receiver(StubHandler):
        def do_POST(self) -> None:
            body = self.read_body()
            received.append(verifier.verify(body, {k.lower(): v for k, v in self.headers.items()}))
            self.send_body(204, "text/plain", b"")

    monkeypatch.setenv("GATEDLOOP_NOTIFY_SECRET", secret)
    a, b = both[0], both[1]
    to = payee("bo")
    with StubServer(Receiver, label="webhook receiver") as server:
        notify = ["--db", both.database_url, "notify", "--once", "--webhook", f"{server.origin}/hook"]
        thread_id = ask(client(a, "ana"), f"pay 500 to {to} as n1")
        assert main(notify) == 0
        answer(client(b, "bo"), thread_id, {"type": "approve"})
        assert main(notify) == 0
    capsys.readouterr()
    mine = [
        (body["type"], body.get("decided_by"), body.get("status"))
        for body in received
        if body["thread_id"] == thread_id
    ]
    assert mine == [
        ("approval_requested", None, None),
        ("approval_decided", "bo", None),
        ("request_finished", None, "completed"),
    ]
    assert len(payments(both, to)) == 1


def test_a_reviewer_without_the_role_is_refused_and_nothing_runs(both: Deployment) -> None:
    a, b = both[0], both[1]
    to = payee("cy")
    thread_id = ask(client(a, "ana"), f"pay 300 to {to} as r1")
    [request] = pending(client(a, "ana"), thread_id)
    answer(client(b, "ana"), thread_id, {"type": "approve"})  # ana is staff: pay needs finance
    assert payments(both, to) == []
    [still] = pending(client(b, "ana"), thread_id)
    assert still["action_requests"][0]["args"] == request["action_requests"][0]["args"]
    assert still["error"] == "pay (r1): deciding this call needs one of the roles ['finance']"
    events = audit(both, thread_id)
    refused = [(e["actor"], e["detail"]["roles"]) for e in events if e["event"].startswith("answer_refused")]
    assert refused == [("ana", ["staff"])], events
    assert not [e for e in events if e["event"] in ("decision", "executed")], events


def status_of(call: Any) -> int:
    """The HTTP status a call of the SDK was refused with (200 when it was not)."""
    try:
        call()
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code
    return 200


def listed(sdk: Any) -> list[str]:
    return [t["thread_id"] for t in sdk.threads.search(limit=1000)]


def test_a_supervisor_of_the_workspace_answers_the_requesters_thread_and_nobody_else_reaches_it(
    both: Deployment,
) -> None:
    """Separate reviewers on Aegra (issue 51). ana (staff) asks on process A. On process B, cy (staff, her
    workspace, not a supervisor) and dee (finance, another workspace) get 404 for the thread, its state, its history
    and an answer, and do not find it in a search; nothing runs. bo (finance, a supervisor of ana's workspace) finds
    it and approves it: the payment runs once, the thread ends idle, the audit names bo (not ana, not the
    workspace, which is Aegra's `identity` and the thread's `owner`)."""
    a, b = both[0], both[1]
    to = payee("sep")
    ana = client(a, "ana")
    thread_id = ask(ana, f"pay 120 to {to} as s1")
    [request] = pending(ana, thread_id)
    assert request["action_requests"][0]["requested_by"] == "ana"

    for outsider in (client(b, "cy"), client(b, "dee")):
        refused = [
            status_of(lambda sdk=outsider: sdk.threads.get(thread_id)),
            status_of(lambda sdk=outsider: sdk.threads.get_state(thread_id)),
            status_of(lambda sdk=outsider: sdk.threads.get_history(thread_id)),
            status_of(lambda sdk=outsider: answer(sdk, thread_id, {"type": "approve"})),
        ]
        assert refused == [404, 404, 404, 404]
        assert thread_id not in listed(outsider)
    assert payments(both, to) == []
    assert [r["request_id"] for r in pending(ana, thread_id)] == [request["request_id"]]

    bo = client(b, "bo")
    assert thread_id in listed(bo)
    assert bo.threads.get(thread_id)["metadata"]["gatedloop_owner"] == "ana"
    assert bo.threads.get(thread_id)["metadata"]["owner"] == "workspace:north"
    out = answer(bo, thread_id, {"type": "approve"})
    assert out["status"] == "completed", out
    assert [args["to"] for _, args, _ in payments(both, to)] == [to]
    assert ana.threads.get(thread_id)["status"] == "idle"
    events = audit(both, thread_id)
    assert [(e["actor"], e["detail"]["decision"]) for e in decided(events)] == [("bo", "approve")], events
    assert not [e for e in events if e["event"].startswith("answer_refused")], events


def test_a_client_cannot_name_the_owner_or_the_reviewer(both: Deployment) -> None:
    """The thread's owner and the answer's sender are the auth's: cy's `gatedloop_owner` metadata is replaced by
    her own name and she may not change it later; her approval sent with bo's user in its `config` and bo's
    identity in its `context` is still hers (staff: refused, nothing runs, the audit names cy)."""
    a, b = both[0], both[1]
    cy = client(a, "cy")
    made = cy.threads.create(metadata={"gatedloop_owner": "bo"})
    assert made["metadata"]["gatedloop_owner"] == "cy"
    assert status_of(lambda: cy.threads.update(made["thread_id"], metadata={"gatedloop_owner": "bo"})) == 403

    to = payee("forge")
    thread_id = ask(cy, f"pay 10 to {to} as f1")
    bo_user = {"identity": "workspace:north", "user_id": "bo", "roles": ["finance"], "gatedloop_auth": "token"}
    client(b, "cy").runs.wait(
        thread_id,
        GRAPH,
        command={"resume": {"decisions": [{"type": "approve"}]}},
        config={"configurable": {"langgraph_auth_user": bo_user, "user_id": "bo"}},
        context={"user_id": "bo", "roles": ["finance"]},
    )
    assert payments(both, to) == []
    [still] = pending(cy, thread_id)
    assert still["error"] == "pay (f1): deciding this call needs one of the roles ['finance']"
    events = audit(both, thread_id)
    refused = [(e["actor"], e["detail"]["roles"]) for e in events if e["event"].startswith("answer_refused")]
    assert refused == [("cy", ["staff"])], events


def settled(sdk: Any, thread_id: str, run_id: str) -> dict[str, Any]:
    """Wait until the run is over (done, failed or paused), wherever it ran, and return the thread."""
    wait_until(
        lambda: sdk.runs.get(thread_id, run_id)["status"] not in ("pending", "running"),
        HANDED_ON_S,
        f"run {run_id} to finish on the surviving process",
        interval_s=0.5,
    )
    return sdk.threads.get(thread_id)


def running_it(aegra: Deployment, pid: int) -> AegraServer:
    [server] = [s for s in aegra.servers if s.alive() and s.server_pid() == pid]
    return server


@pytest.mark.parametrize("when", ["after", "before"])
@pytest.mark.parametrize("tool", ["pay", "wire"])
def test_a_worker_killed_while_a_write_runs_never_writes_twice(both: Deployment, tool: str, when: str) -> None:
    """(b) The process running an approved write is SIGKILLed right before or right after its effect. Aegra's
    reaper hands the run to the surviving process when the lease expires; gatedloop finds the write started by a
    worker that is gone: `pay` asks its system (reconcile) and runs once or reuses the result; `wire`, which nobody
    can reconcile, asks a person whether it happened. Never two payments."""
    to = payee(f"hold-{when}")
    bo = client(both[0], "bo")
    thread_id = ask(client(both[0], "ana"), f"{tool} 70 to {to} as k1")
    run = bo.runs.create(thread_id, GRAPH, command={"resume": {"decisions": [{"type": "approve"}]}})
    marker = both.control / f"{to}.started"
    wait_until(lambda: marker.exists() and marker.read_text(), 60, "the write to start")
    victim = running_it(both, int(marker.read_text()))
    survivor = next(s for s in both.servers if s is not victim)
    assert len(payments(both, to)) == (1 if when == "after" else 0)
    victim.kill_hard()

    on_survivor = client(survivor, "bo")
    thread = settled(on_survivor, thread_id, run["run_id"])
    assert len(payments(both, to)) <= 1
    if tool == "wire":  # nobody can tell: a person is asked, and her answer settles it
        assert thread["status"] == "interrupted", thread
        [question] = pending(on_survivor, thread_id)
        assert question["kind"] == "unknown_outcome", question
        settle = {"type": "done", "result": {"confirmed": True}} if when == "after" else {"type": "not_done"}
        out = answer(on_survivor, thread_id, settle)
        thread = on_survivor.threads.get(thread_id)
    else:
        out = on_survivor.threads.get_state(thread_id)["values"]
    assert thread["status"] == "idle", thread
    assert out["status"] == "completed", out
    assert len(payments(both, to)) == 1
    assert paid_by(both, to)[0] in ((victim_pid := int(marker.read_text())), survivor.server_pid())
    if when == "before":
        assert paid_by(both, to) == [survivor.server_pid()] != [victim_pid]


def test_four_concurrent_answers_through_both_processes_make_one_write(both: Deployment) -> None:
    """(c) One request, four approvals at once, two through each process: one payment, one decision recorded. Aegra
    refuses an answer that arrives when the thread is no longer interrupted (400) or busy (409), and queues the
    others: here two of the four usually became runs, and the later one found the request already answered."""
    to = payee("race")
    thread_id = ask(client(both[0], "ana"), f"pay 40 to {to} as c1")
    sdks = [client(both[i % 2], "bo") for i in range(4)]

    def approve(sdk: Any) -> str:
        try:
            answer(sdk, thread_id, {"type": "approve"})
        except httpx.HTTPStatusError as exc:
            return str(exc.response.status_code)
        return "ran"

    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(approve, sdks))
    bo = client(both[1], "bo")

    # Settled: no run of the thread pending or running. Not the thread's status: when two of the runs finish in the
    # same instant, Aegra (0.11.0) can leave it "busy" for good (each run's finalize sees the other still active).
    def settled() -> bool:
        answers = bo.runs.list(thread_id)  # bo's runs: the answers that were queued
        return bool(answers) and all(run["status"] not in ("pending", "running") for run in answers)

    wait_until(settled, HANDED_ON_S, "the thread's runs to finish")
    effects = (outcomes, paid_by(both, to), [(e["event"], e["actor"]) for e in audit(both, thread_id)])
    assert len(payments(both, to)) == 1, effects
    assert "ran" in outcomes and set(outcomes) <= {"ran", "400", "409"}, outcomes
    assert len(decided(audit(both, thread_id))) == 1, (outcomes, audit(both, thread_id))


DEPLOY = Path(__file__).parent.parent / "deploy" / "aegra"
EXAMPLE_ANA = "ana-example-token-change-me"
EXAMPLE_BO = "bo-example-token-change-me"


@pytest.fixture(scope="module")
def shipped(aegra: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AegraServer]]:
    """deploy/aegra/aegra.json as its README starts it (its reviewers file, the demo's offline model): two
    processes on a fresh database and one Redis queue."""
    executable, redis_url = str(os.environ[AEGRA_ENV]), str(os.environ[REDIS_ENV])
    workdir = tmp_path_factory.mktemp("shipped")
    with fresh_database(find_postgres()) as database_url:
        env = server_env(
            database_url, redis_url, uuid.uuid4().hex[:10], GATEDLOOP_AUTH_FILE=str(DEPLOY / "reviewers.example.json")
        )
        del env["GATEDLOOP_AUTH_TOKENS"], env["PYTHONPATH"]
        servers = [AegraServer(f"deploy-{n}", executable, DEPLOY / "aegra.json", env, workdir) for n in "AB"]
        try:
            for server in servers:
                server.start()
            yield servers
        finally:
            for server in servers:
                server.stop()


def test_the_shipped_deployment_serves_the_demo_and_the_bookings_graphs(shipped: list[AegraServer]) -> None:
    """The three graphs are listed; the demo's gated seat is asked for and reserved once the requester approves it
    on the other process; a booking waits for a `hosts` reviewer (ana's own approval is refused for the role, and the
    SDK is told so, over `runs.wait` and over a stream, while the request still waits)."""
    ana, on_b = (client(s, "ana", token=EXAMPLE_ANA) for s in shipped)
    assert {a["graph_id"] for a in ana.assistants.search()} == {"gatedloop", "tables", "rooms"}

    thread_id = ana.threads.create()["thread_id"]
    ana.runs.wait(
        thread_id,
        "gatedloop",
        input={"messages": [{"role": "user", "content": "Reserve a seat in workshop WS-101 for Ana"}]},
    )
    [request] = pending(ana, thread_id)
    assert request["action_requests"][0]["requested_by"] == "ana"
    out = on_b.runs.wait(thread_id, "gatedloop", command={"resume": {"decisions": [{"type": "approve"}]}})
    assert out["status"] == "completed" and out["answer"].startswith("Reserved: "), out

    thread_id = ana.threads.create()["thread_id"]
    ana.runs.wait(thread_id, "tables", input={"messages": [{"role": "user", "content": "a table for 4 at Chez Ana"}]})
    [request] = pending(ana, thread_id)
    assert request["action_requests"][0]["approvers"] == ["hosts"]
    approve = {"resume": {"decisions": [{"type": "approve"}]}}
    with pytest.raises(Exception, match=r"^AnswerRefused: .*needs one of the roles \['hosts'\]"):
        on_b.runs.wait(thread_id, "tables", command=approve)  # the refusal reaches the SDK (inbox.refusals)
    [still] = pending(on_b, thread_id)
    assert "hosts" in still["error"], still
    events = list(on_b.runs.stream(thread_id, "tables", command=approve, stream_mode=["values", "messages-tuple"]))
    assert events[-1].event == "error", [e.event for e in events]  # as Agent Chat UI resumes: the event it shows
    assert events[-1].data == {"error": "AnswerRefused", "message": still["error"]}
    assert [r["request_id"] for r in pending(ana, thread_id)] == [still["request_id"]]
    assert not (shipped[0].workdir / ".gatedloop" / "bookings.sqlite").exists()


def test_the_inbox_served_by_aegra_lists_approves_with_an_edit_and_rejects_in_chromium(
    shipped: list[AegraServer],
) -> None:
    """The shipped deployment's http.app is the inbox (gatedloop.inbox.aegra): in Debian's chromium, ana signs in
    with her token on process A and sees her two waiting requests; she approves one with an edited participant and
    rejects the other with a reason. Each answer is a run in Aegra's queue, as ana: the edited seat is the one
    reserved, the rejection's reason reaches the model, both threads end `completed` over the API of process B,
    and the audit names ana."""
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = os.environ.get("GATEDLOOP_CHROMIUM", "/usr/bin/chromium")
    if not Path(chromium).exists():
        missing(f"no chromium at {chromium} (.ci/start_chromium.sh installs it)")
    ana = client(shipped[0], "ana", token=EXAMPLE_ANA)
    threads = {}
    for who in ("Edda", "Rolf"):
        thread_id = ana.threads.create()["thread_id"]
        text = f"Reserve a seat in workshop WS-101 for {who}"
        ana.runs.wait(thread_id, "gatedloop", input={"messages": [{"role": "user", "content": text}]})
        threads[who] = thread_id
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
        page.set_default_timeout(60_000)
        page.goto(f"{shipped[0].url}/inbox")
        page.fill("input[name=token]", EXAMPLE_ANA)
        page.click("button:has-text('Sign in')")
        page.wait_for_selector("header >> text=ana")
        edda, rolf = (page.locator(f'section[data-key="{threads[w]}"]') for w in ("Edda", "Rolf"))
        edda.wait_for()
        assert "Edda" in edda.inner_text() and "Rolf" in rolf.inner_text()
        edda.locator("input[value=edit]").check()
        edda.locator("input[name=arg-0-participant]").fill("Edda Berg")
        edda.locator("button.send").click()
        page.wait_for_selector(f".flash.ok >> text={threads['Edda']}")
        rolf = page.locator(f'section[data-key="{threads["Rolf"]}"]')
        rolf.locator("input[value=reject]").check()
        rolf.locator("textarea[name=message-0]").fill("the workshop is full")
        rolf.locator("button.send").click()
        page.wait_for_selector(f".flash.ok >> text={threads['Rolf']}")
        browser.close()
    on_b = client(shipped[1], "ana", token=EXAMPLE_ANA)
    for who, thread_id in threads.items():
        values = on_b.threads.get_state(thread_id)["values"]
        assert values["status"] == "completed", (who, values)
        [answer] = [m for m in values["messages"] if m["type"] == "tool"]
        if who == "Edda":
            assert answer["status"] == "success" and "Edda Berg" in answer["content"], answer
        else:
            assert answer["status"] == "error" and "the workshop is full" in answer["content"], answer
    from gatedloop.checkpoints.postgres import PostgresLedger

    ledger = PostgresLedger(shipped[0].env["DATABASE_URL"])
    decisions = {
        w: [(e["actor"], e["detail"]["decision"]) for e in ledger.audit(t) if e["event"] == "decision"]
        for w, t in threads.items()
    }
    assert decisions == {"Edda": [("ana", "edit")], "Rolf": [("ana", "reject")]}


@contextlib.contextmanager
def signed_in(server: AegraServer, token: str) -> Iterator[httpx.Client]:
    """A browser's session with the inbox of `server`, signed in with `token` (the login form's CSRF field, the
    session cookie)."""
    with httpx.Client(base_url=server.url, timeout=120) as browser:
        form = re.search(r'name="csrf" value="([^"]+)"', browser.get("/inbox").text)
        assert form is not None
        assert browser.post("/inbox/login", data={"csrf": form[1], "token": token}).status_code == 303
        yield browser


def card(page: str, thread_id: str) -> str:
    """The inbox page's card for a thread, "" when the page lists none."""
    start = page.find(f'data-key="{thread_id}"')
    return "" if start < 0 else page[start : page.index("</section>", start)]


def test_the_inbox_served_by_aegra_lists_the_requesters_request_for_her_reviewer_who_answers_it(
    shipped: list[AegraServer],
) -> None:
    """Separate reviewers in the shipped deployment (issue 51; its reviewers file names no workspaces: one
    workspace). ana (staff) asks for a table on process A; bo (hosts, a supervisor) signs in to the inbox of process
    B, where her request waits for him, "requested by ana", and approves it there (a run as bo, on Aegra's queue):
    the table is booked, and the audit names bo. ana's own inbox does not offer it to her (she is not a host)."""
    ana = client(shipped[0], "ana", token=EXAMPLE_ANA)
    thread_id = ana.threads.create()["thread_id"]
    ana.runs.wait(thread_id, "tables", input={"messages": [{"role": "user", "content": "a table for 2 at Chez Bo"}]})
    [request] = pending(ana, thread_id)

    with signed_in(shipped[1], EXAMPLE_BO) as bo, signed_in(shipped[0], EXAMPLE_ANA) as her:
        shown = card(bo.get("/inbox").text, thread_id)
        assert "requested by ana" in shown and "reserve_table" in shown, shown
        assert card(her.get("/inbox").text, thread_id) == ""
        csrf = re.search(r'name="csrf" value="([^"]+)"', shown)
        assert csrf is not None
        sent = {"csrf": csrf[1], "thread_id": thread_id, "request_id": request["request_id"], "decision-0": "approve"}
        assert bo.post("/inbox/answer", data=sent).status_code == 303
        after = bo.get("/inbox").text
        assert re.search(rf'class="flash ok"[^>]*>[^<]*{thread_id}', after), after  # "answered", with the thread

    values = client(shipped[0], "ana", token=EXAMPLE_ANA).threads.get_state(thread_id)["values"]
    assert values["status"] == "completed", values
    [booked] = [m for m in values["messages"] if m["type"] == "tool"]
    assert booked["status"] == "success", booked
    from gatedloop.checkpoints.postgres import PostgresLedger

    events = PostgresLedger(shipped[0].env["DATABASE_URL"]).audit(thread_id)
    assert [(e["actor"], e["detail"]["decision"]) for e in decided(events)] == [("bo", "approve")], events


def test_a_bad_auth_configuration_stops_the_shipped_deployment(aegra: Deployment, tmp_path: Path) -> None:
    """Aegra alone would log the auth module's error and serve everyone as one anonymous user; the deployment's graph
    modules import gatedloop's auth, so the server does not start."""
    env = server_env(aegra.database_url, str(os.environ[REDIS_ENV]), uuid.uuid4().hex[:10])
    env["GATEDLOOP_AUTH_TOKENS"] = json.dumps({"tokens": {"short": {"user_id": "x"}}})
    server = AegraServer("bad-auth", str(os.environ[AEGRA_ENV]), DEPLOY / "aegra.json", env, tmp_path)
    with pytest.raises(RuntimeError, match="exited"):
        server.start(timeout_s=120)
    assert "AuthConfigError: gatedloop auth config (GATEDLOOP_AUTH_TOKENS): tokens: entry #1" in server.log.read_text()


def test_a_server_killed_with_sigkill_stops_serving(aegra: Deployment, tmp_path: Path) -> None:
    """Aegra started as docs/deploying.md says (`serve_command`: uvicorn itself) stops serving when its process is
    SIGKILLed, as under the OOM killer or a supervisor's `kill -9`. Started as `aegra serve`, the killed process was
    the CLI, whose uvicorn child (reparented to init) still answered /health 5 s later, its workers on the queue."""
    tag = uuid.uuid4().hex[:10]
    env = server_env(aegra.database_url, str(os.environ[REDIS_ENV]), tag, **_files_of(aegra))
    server = AegraServer("killed", str(os.environ[AEGRA_ENV]), APP, env, tmp_path)
    server.start()
    try:
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGKILL)
        wait_until(lambda: not _serving(server.url), 10, f"{server.url} to stop serving after its SIGKILL")
    finally:
        server.kill_hard()


def _files_of(aegra: Deployment) -> dict[str, str]:
    return {"AEGRA_TEST_EFFECTS": str(aegra.effects), "AEGRA_TEST_CONTROL": str(aegra.control)}


def _serving(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# The rules themselves, without a server: the handlers called as Aegra 0.11 picks and calls them.

NORTH = {
    "supervisor_roles": ["finance"],
    "tokens": {
        "ana-token-rules-0001": {"user_id": "ana", "roles": ["staff"], "workspace": "north"},
        "bo-token-rules-00002": {"user_id": "bo", "roles": ["finance"], "workspace": "north"},
        "dee-token-rules-0004": {"user_id": "dee", "roles": ["finance"], "workspace": "south"},
    },
}


def config_of(data: dict[str, Any]) -> Any:
    from gatedloop.graph.auth import TOKENS_ENV, load_auth_config

    return load_auth_config({TOKENS_ENV: json.dumps(data)})


def handle(auth: Any, user: dict[str, Any], resource: str, action: str, value: dict[str, Any]) -> Any:
    """One `@auth.on` handler as Aegra 0.11 picks it (aegra_api.core.auth_handlers: the most specific of
    (resource, action), (resource, *), (*, action), (*, *), else the global one) and calls it."""
    import asyncio
    from types import SimpleNamespace

    from langgraph_sdk import Auth

    keys = [(resource, action), (resource, "*"), ("*", action), ("*", "*")]
    handler = next((auth._handlers[k][-1] for k in keys if auth._handlers.get(k)), None) or auth._global_handlers[-1]
    ctx = Auth.types.AuthContext(permissions=[], user=SimpleNamespace(**user), resource=resource, action=action)
    return asyncio.run(handler(ctx=ctx, value=value))


def aegra_user_of(auth: Any, token: str) -> dict[str, Any]:
    import asyncio

    return asyncio.run(auth._authenticate_handler({"authorization": f"Bearer {token}"}))  # as Aegra calls it


def test_a_reviewers_file_names_a_workspace_in_every_token_or_in_none() -> None:
    from gatedloop.graph.auth import DEFAULT_WORKSPACE, AuthConfigError

    config = config_of(NORTH)
    assert config.names_workspaces and [config.workspace_of(u) for u in ("ana", "dee")] == ["north", "south"]
    today = config_of({"supervisor_roles": ["finance"], "tokens": {"bo-token-rules-00002": {"user_id": "bo"}}})
    assert not today.names_workspaces and today.workspace_of("bo") == DEFAULT_WORKSPACE
    some = {"tokens": {**NORTH["tokens"], "cy-token-rules-00003": {"user_id": "cy"}}}
    with pytest.raises(AuthConfigError, match="tokens: name a workspace in every token, or in none"):
        config_of(some)
    moved = {"tokens": {**NORTH["tokens"], "ana-token-rules-other": {"user_id": "ana", "roles": ["staff"]}}}
    moved["tokens"]["ana-token-rules-other"]["workspace"] = "south"
    with pytest.raises(AuthConfigError, match=r"entry #4 \(user 'ana'\): this user has another token in another"):
        config_of(moved)


def test_under_langgraph_dev_a_supervisor_sees_her_workspace_and_a_file_without_workspaces_is_unchanged() -> None:
    """The same file under `gatedloop.graph.auth` (langgraph-api applies each handler's filter to the thread's
    metadata): with workspaces a supervisor's filter is her workspace, stamped on every thread made; without, none."""
    from gatedloop.graph.auth import build_auth

    auth = build_auth(config_of(NORTH))
    made: dict[str, Any] = {"metadata": {"owner": "dee", "workspace": "south"}}
    assert handle(auth, {"identity": "bo"}, "threads", "create", made) == {"workspace": "north"}
    assert made["metadata"] == {"owner": "bo", "workspace": "north"}
    assert handle(auth, {"identity": "ana"}, "threads", "read", {}) == {"owner": "ana"}
    assert handle(auth, {"identity": "dee"}, "threads", "search", {}) == {"workspace": "south"}
    with pytest.raises(Exception, match="owner of a thread cannot be changed"):
        handle(auth, {"identity": "bo"}, "threads", "update", {"metadata": {"workspace": "south"}})

    one_workspace = {
        "supervisor_roles": ["finance"],
        "tokens": {"bo-token-rules-00002": {"user_id": "bo", "roles": ["finance"]}},
    }
    today = build_auth(config_of(one_workspace))
    made = {"metadata": None}
    assert handle(today, {"identity": "bo"}, "threads", "create", made) is None
    assert made["metadata"] == {"owner": "bo"}
    assert handle(today, {"identity": "bo"}, "threads", "update", {"metadata": {"workspace": "x"}}) is None


def test_aegra_s_user_is_scoped_to_her_workspace_and_the_graph_reads_the_person_from_it() -> None:
    """Aegra scopes by `identity`: the workspace. The person rides beside it and is who the gate sees, whatever the
    run's client puts in its `context`; a file without workspaces is one workspace."""
    from gatedloop.graph.aegra_auth import build_aegra_auth
    from gatedloop.nodes.wire.identity import authenticated_context, caller_context
    from gatedloop.tools.policy import CallContext

    user = aegra_user_of(build_aegra_auth(config_of(NORTH)), "ana-token-rules-0001")
    assert (user["identity"], user["user_id"], user["roles"]) == ("workspace:north", "ana", ["staff"])
    one = build_aegra_auth(config_of({"tokens": {"bo-token-rules-00002": {"user_id": "bo"}}}))
    assert aegra_user_of(one, "bo-token-rules-00002")["identity"] == "workspace:default"

    class AegraUser:  # Aegra hands a run its pydantic `User`, whose `dict()` has the handler's extra fields
        def dict(self) -> dict[str, Any]:
            return dict(user)

    for served in (user, AegraUser()):
        config: Any = {"configurable": {"langgraph_auth_user": served}}
        caller = caller_context({"user_id": "bo", "roles": ["finance"], "tenant": "t1"}, config)
        assert (caller.user_id, caller.roles, caller.extra) == ("ana", frozenset({"staff"}), {"tenant": "t1"})
        seen = authenticated_context(CallContext(user_id="bo", roles=frozenset({"finance"})), CallContext, config)
        assert (seen.user_id, seen.roles) == ("ana", frozenset({"staff"}))  # what the tools see


def test_aegra_handlers_keep_a_user_who_is_not_a_supervisor_to_her_own_threads() -> None:
    """Aegra 0.11 applies a handler's filter only to listings, searches, gets and deletes; elsewhere it keeps only a
    refusal. So a thread the request names is looked up and refused unless hers; a supervisor is not looked up."""
    from gatedloop.graph.aegra_auth import build_aegra_auth

    threads = {("t-ana", "workspace:north"): {"owner": "workspace:north", "gatedloop_owner": "ana"}}
    looked_up: list[str] = []

    async def metadata(thread_id: str, identity: str) -> Any:
        looked_up.append(thread_id)
        return threads.get((thread_id, identity))

    auth = build_aegra_auth(config_of(NORTH), metadata)
    ana, bo, cy = ({"identity": "workspace:north", "user_id": u} for u in ("ana", "bo", "cy"))
    assert handle(auth, ana, "threads", "read", {"thread_id": "t-ana"}) == {"gatedloop_owner": "ana"}
    assert handle(auth, ana, "threads", "search", {}) == {"gatedloop_owner": "ana"}
    assert handle(auth, ana, "threads", "create_run", {"thread_id": "t-new"}) is None  # a thread the run makes
    for action in ("read", "create_run", "update", "delete", "search"):
        with pytest.raises(Exception, match="Thread 't-ana' not found") as caught:
            handle(auth, cy, "threads", action, {"thread_id": "t-ana"})
        assert getattr(caught.value, "status_code", None) == 404
    with pytest.raises(Exception, match="only supervisors may cancel runs by status"):
        handle(auth, ana, "threads", "update", {"status": "all"})
    with pytest.raises(Exception, match="only supervisors may create crons"):
        handle(auth, ana, "crons", "create", {})

    looked_up.clear()
    assert handle(auth, bo, "threads", "create_run", {"thread_id": "t-ana"}) is None
    assert handle(auth, bo, "threads", "read", {"thread_id": "t-ana"}) is None
    assert looked_up == []
    made: dict[str, Any] = {"thread_id": None, "metadata": {"gatedloop_owner": "bo"}}
    assert handle(auth, ana, "threads", "create", made) is None
    assert made["metadata"] == {"gatedloop_owner": "ana"}
