"""The approval inbox in a real browser: Debian's chromium driven by Playwright, against the inbox served by
uvicorn in a child process on a real SQLite file; the threads are started here through `runs.start`.

Set GATEDLOOP_SCREENSHOTS=DIR to also save the screenshots the README shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from inbox_browser import CHROMIUM, free_port, shot, wait_ready
from inbox_browser import sign_in as signed_in
from langchain_core.messages import ToolMessage

from gatedloop.graph import runs
from gatedloop.tools.policy import CallContext

SUPPORT = Path(__file__).resolve().parent / "support"
TOKENS = {
    "ana": "ana-token-0123456789",
    "cy": "cy-token-0123456789ab",
    "bo": "bo-token-0123456789ab",
    "dee": "dee-token-0123456789a",
    "sue": "sue-token-0123456789a",
}
ROLES = {"ana": ["events"], "cy": ["events"], "bo": ["staff", "finance"], "dee": [], "sue": ["support"]}
"""dee is not an approver of anything; bo (finance) and sue (support) decide a refund and its email."""

sync_api = pytest.importorskip("playwright.sync_api")

if not Path(CHROMIUM).exists():
    if os.environ.get("CI") == "true":
        pytest.fail(f"no chromium at {CHROMIUM} (.ci/start_chromium.sh installs it)", pytrace=False)
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)


@dataclass
class Inbox:
    url: str
    graph: Any
    saver: Any
    store: Any

    def pause(self, thread_id: str, text: str, requester: str | None = None) -> dict[str, Any]:
        out = runs.start(self.graph, thread_id, text, context=CallContext(user_id=requester))
        assert out.get("__interrupt__"), out
        return out["__interrupt__"][0].value

    def output(self, thread_id: str) -> dict[str, Any]:
        return runs.output(self.graph, thread_id)

    def tool_message(self, thread_id: str) -> ToolMessage:
        return next(m for m in self.output(thread_id)["messages"] if isinstance(m, ToolMessage))

    def decisions(self, thread_id: str) -> list[dict[str, Any]]:
        return [e for e in self.saver.ledger.audit(thread_id) if e["event"] == "decision"]


@pytest.fixture(scope="module")
def inbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inbox]:
    from inbox_app import app_parts

    folder = tmp_path_factory.mktemp("inbox")
    db = str(folder / "runs.sqlite")
    reviewers = folder / "reviewers.json"
    tokens = {TOKENS[u]: {"user_id": u, "roles": ROLES[u]} for u in TOKENS}
    reviewers.write_text(json.dumps({"supervisor_roles": ["events", "staff", "support"], "tokens": tokens}))
    port = free_port()
    log = folder / "inbox.log"
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "GATEDLOOP_MODEL": "demo"}
    with app_parts(db) as (graph, saver, _tools, _policies, store), log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "inbox_app.py"), db, str(port), str(reviewers)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            wait_ready(f"{url}/inbox", proc, log)
            yield Inbox(url, graph, saver, store)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def sign_in(browser: Any, inbox: Inbox, user: str) -> Any:
    return signed_in(browser, inbox.url, user, TOKENS[user])


def card(page: Any, thread_id: str) -> Any:
    return page.locator(f'section[data-key="{thread_id}"]')


SEAT = "Reserve a seat in workshop WS-101 for {who}"


def test_a_request_appears_live_is_approved_and_leaves_other_reviewers_pages(browser, inbox):
    ana, cy = sign_in(browser, inbox, "ana"), sign_in(browser, inbox, "cy")
    inbox.pause("a1", SEAT.format(who="Alice"))
    card(ana, "a1").wait_for()  # no reload: the page polls
    card(cy, "a1").wait_for()
    text = card(ana, "a1").inner_text()
    assert "reserve_seat" in text and "WS-101" in text and "Alice" in text and "approvals 0 of 1" in text
    assert "Reserve a seat in workshop WS-101 for Alice" in text  # the thread's recent conversation
    card(ana, "a1").locator("button.send").click()  # nothing chosen: the browser does not send the form
    assert card(ana, "a1").count() == 1 and inbox.output("a1").get("__interrupt__")
    card(ana, "a1").locator("input[value=approve]").check()
    card(ana, "a1").locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=a1")
    assert "the thread ended: completed" in ana.inner_text(".flash.ok")
    assert card(ana, "a1").count() == 0
    card(cy, "a1").wait_for(state="detached")  # answered elsewhere: gone from cy's page without a reload
    assert inbox.output("a1")["status"] == "completed"
    assert [(d["actor"], d["detail"]["decision"]) for d in inbox.decisions("a1")] == [("ana", "approve")]
    ana.goto(f"{inbox.url}/inbox/thread/a1")
    audit = ana.inner_text("#audit")
    assert "approved by ana" in audit and "ran: ok" in audit


def test_an_invalid_edit_shows_its_error_and_a_valid_one_runs_the_edited_call(browser, inbox):
    ana = sign_in(browser, inbox, "ana")
    inbox.pause("e1", SEAT.format(who="Alice"), requester="rita")
    form = card(ana, "e1")
    form.wait_for()
    form.locator("input[value=edit]").check()
    form.locator("input[name=arg-0-event_id]").fill("WS-999")
    form.locator("button.send").click()
    error = ana.wait_for_selector(".flash.error")
    assert "not accepted" in error.inner_text() and "WS-999" in error.inner_text()
    assert "Previous answer refused" in card(ana, "e1").inner_text()
    # What she typed and chose is kept (the form does not reset), with why it was refused, on the card itself.
    form = card(ana, "e1")
    assert form.locator("input[name=arg-0-event_id]").input_value() == "WS-999"
    assert (
        form.locator("input[value=edit]").is_checked()
        and form.locator("details.edit").get_attribute("open") is not None
    )
    assert "Your choices and values are kept" in form.inner_text()
    shot(ana, "inbox-refused-edit")
    assert inbox.output("e1").get("__interrupt__")  # still waiting, nothing ran
    form = card(ana, "e1")
    form.locator("input[value=edit]").check()
    form.locator("input[name=arg-0-event_id]").fill("WS-101")
    form.locator("input[name=arg-0-participant]").fill("Bob")
    form.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=e1")
    assert inbox.output("e1")["status"] == "completed"
    body = json.loads(inbox.tool_message("e1").content)
    assert body.get("result", body)["participant"] == "Bob"


def test_changing_an_argument_and_choosing_approve_runs_the_change_never_the_original(browser, inbox):
    """Issue 23's first finding (a person approves exactly the arguments that run): the reviewer typed a new
    participant and chose "approve"; the call ran with what she typed, recorded as her edit."""
    ana = sign_in(browser, inbox, "ana")
    inbox.pause("x1", SEAT.format(who="Alice"), requester="rita")
    form = card(ana, "x1")
    form.wait_for()
    form.locator("details.edit summary").click()
    form.locator("input[name=arg-0-participant]").fill("Bea Ortiz")
    form.locator("input[value=approve]").check()
    form.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=x1")
    body = json.loads(inbox.tool_message("x1").content)
    assert body["ran_with"]["participant"] == "Bea Ortiz", body
    assert body["result"]["participant"] == "Bea Ortiz", body
    assert [(d["actor"], d["detail"]["decision"]) for d in inbox.decisions("x1")] == [("ana", "edit")]


def test_a_reject_with_a_reason_reaches_the_model(browser, inbox):
    ana = sign_in(browser, inbox, "ana")
    request = inbox.pause("r1", SEAT.format(who="Alice"))
    form = card(ana, "r1")
    form.wait_for()
    form.locator("input[value=reject]").check()
    form.locator("textarea[name=message-0]").fill("no budget this quarter")
    form.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=r1")
    rejected = inbox.tool_message("r1")
    assert rejected.status == "error" and "no budget this quarter" in rejected.content
    assert [d["detail"]["decision"] for d in inbox.decisions("r1")] == ["reject"]
    ana.goto(f"{inbox.url}/requests/{request['request_id']}")  # the link notifications carry, without the thread
    assert "Not run: rejected_by_reviewer: no budget this quarter" in ana.inner_text(".story")
    assert "rejected by ana" in ana.inner_text(".story .timeline")


def test_a_reviewer_without_the_role_does_not_see_the_request(browser, inbox):
    inbox.pause("v1", SEAT.format(who="Alice"), requester="rita")  # reserve_seat: approvers {"events"}
    inbox.pause("v2", "Schedule lunch with Alice on 2026-03-06", requester="rita")  # create_event: any reviewer
    ana, bo = sign_in(browser, inbox, "ana"), sign_in(browser, inbox, "bo")
    card(ana, "v1").wait_for()
    card(ana, "v2").wait_for()
    shot(ana, "inbox-two-requests")
    card(bo, "v2").wait_for()
    assert card(bo, "v1").count() == 0
    inbox.pause("v3", "Schedule lunch with Bob on 2026-03-09", requester="dee")
    dee = sign_in(browser, inbox, "dee")  # not an approver: only the requests she asked for (as on the API)
    card(dee, "v3").wait_for()
    assert card(dee, "v2").count() == 0 and card(dee, "v1").count() == 0
    assert bo.goto(f"{inbox.url}/inbox/thread/v1").status == 404  # nor its audit trail
    forged = bo.request.post(
        f"{inbox.url}/inbox/answer", form={"thread_id": "v2", "request_id": "x", "decision-0": "approve"}
    )
    assert forged.status == 403  # no CSRF token: refused
    assert inbox.output("v2").get("__interrupt__") and inbox.output("v1").get("__interrupt__")


def test_a_request_that_mixes_roles_is_decided_call_by_call_by_each_reviewer(browser, inbox):
    """The newcomer's case: one turn asks for a refund (finance decides it) and an email (support decides it). bo
    (finance) sees the request with the email read-only, naming who decides it, and approves the refund: nothing
    runs. sue (support) sees the refund decided by bo and approves the email; both writes run once, in the order
    the model proposed them."""
    request = inbox.pause("mx1", "Refund order A-1001 and email ana@example.com", requester="rita")
    bo = sign_in(browser, inbox, "bo")
    form = card(bo, "mx1")
    form.wait_for()
    assert "waiting for finance: refund; support: send_email" in form.inner_text()
    email = form.locator('fieldset[data-call="call_email"]')
    assert "Decided by support, not by you" in email.inner_text() and email.locator("input[type=radio]").count() == 0
    form.locator("input[name=decision-0][value=approve]").check()
    form.locator("button.send").click()
    assert (
        "the request still waits for support: send_email" in bo.wait_for_selector(".flash.ok >> text=mx1").inner_text()
    )
    assert inbox.saver.ledger.entries("mx1") == []  # the refund waits for the email's decision
    sue = sign_in(browser, inbox, "sue")
    form = card(sue, "mx1")
    form.wait_for()
    assert "decided: approved by bo" in form.locator('fieldset[data-call="call_refund"]').inner_text()
    assert "waiting for support: send_email" in form.inner_text()
    # A form shown before bo's answer (the email second) is refused whole: a position may now name another call.
    shown_before = {"call-0": "call_refund", "call-1": "call_email", "decision-1": "approve"}
    fields = {"csrf": form.locator("input[name=csrf]").first.input_value(), "thread_id": "mx1"}
    stale = sue.request.post(
        f"{inbox.url}/inbox/answer", form={**fields, "request_id": request["request_id"], **shown_before}
    )
    assert "calls since it was shown; nothing was sent" in stale.text()
    assert inbox.saver.ledger.entries("mx1") == []
    form.locator("input[name=decision-0][value=approve]").check()
    form.locator("button.send").click()
    assert "the thread ended: completed" in sue.wait_for_selector(".flash.ok >> text=mx1").inner_text()
    audit = inbox.saver.ledger.audit("mx1")
    assert [e["call_id"] for e in audit if e["event"] == "executed"] == ["call_refund", "call_email"]
    assert [(e["call_id"], e["actor"]) for e in audit if e["event"] == "decision"] == [
        ("call_refund", "bo"),
        ("call_email", "sue"),
    ]
    sue.goto(f"{inbox.url}/requests/{request['request_id']}?thread=mx1")
    assert sue.locator(".story").evaluate_all("stories => stories.map(s => s.dataset.call)") == [
        "call_refund",
        "call_email",
    ]


def _hold_answers_until_all_are_sent(pages: list[Any]) -> list[Any]:
    """Each page's answer waits in its browser until every page has sent one, so the server gets them together.
    Without this the first answer can end the request before the second is sent, and the second page's poll takes
    its card away under the click."""
    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)
        if len(held) == len(pages):
            for waiting in held:
                waiting.continue_()

    for page in pages:
        page.route("**/inbox/answer", hold)
    return held


def test_two_reviewers_answering_at_once_exactly_one_wins(browser, inbox):
    inbox.pause("c1", SEAT.format(who="Carla"))
    ana, cy = sign_in(browser, inbox, "ana"), sign_in(browser, inbox, "cy")
    card(ana, "c1").wait_for()
    card(cy, "c1").wait_for()
    for page in (ana, cy):
        card(page, "c1").locator("input[value=approve]").check()
    held = _hold_answers_until_all_are_sent([ana, cy])
    card(ana, "c1").locator("button.send").click(no_wait_after=True)
    card(cy, "c1").locator("button.send").click(no_wait_after=True)
    notes = [page.wait_for_selector(".flash").inner_text() for page in (ana, cy)]
    assert len(held) == 2, "both answers were held and sent together"
    won = [n for n in notes if "the thread ended: completed" in n]
    lost = [n for n in notes if "already answered" in n or "not accepted" in n or "another answer" in n]
    assert len(won) == 1 and len(lost) == 1, notes
    assert len(inbox.decisions("c1")) == 1
    assert [e.state for e in inbox.saver.ledger.entries("c1")] == ["done"]  # the write ran once


def _session_cookie(context: Any) -> dict[str, Any]:
    """The inbox's own cookie (path /inbox), not one planted beside it."""
    [cookie] = [c for c in context.cookies() if c["name"] == "gatedloop_inbox" and c["path"] == "/inbox"]
    return cookie


def _plant(context: Any, inbox: Inbox, value: str) -> None:
    """What a page on another port of the same host can do: set a cookie for this host, here for every path."""
    context.add_cookies([{"name": "gatedloop_inbox", "value": value, "domain": "127.0.0.1", "path": "/"}])


@pytest.mark.parametrize("planted", ["issued", "made-up"])
def test_a_planted_session_cookie_is_worth_nothing_after_the_reviewer_signs_in(browser, inbox, planted):
    """Issue 19, finding 5 (session fixation): an attacker who can plant a cookie for this host (a page on another
    port) plants a session id, one the inbox issued to the attacker or one made up; the reviewer signs in. The
    reviewer's session is a new id, and the planted one is not signed in."""
    attacker = browser.new_context()
    page = attacker.new_page()
    page.goto(f"{inbox.url}/inbox")
    fixed = _session_cookie(attacker)["value"] if planted == "issued" else "attacker-chosen.session-id"
    victim = browser.new_context()
    _plant(victim, inbox, fixed)
    bo = victim.new_page()
    bo.set_default_timeout(20_000)
    bo.goto(f"{inbox.url}/inbox")
    bo.fill("input[name=token]", TOKENS["bo"])
    bo.click("button:has-text('Sign in')")
    bo.wait_for_selector("header >> text=bo")
    cookie = _session_cookie(victim)
    assert cookie["value"] != fixed
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/inbox"
    attacker.clear_cookies()
    _plant(attacker, inbox, fixed)
    page.goto(f"{inbox.url}/inbox")
    assert page.locator("input[name=token]").count() == 1, "the planted id is not signed in"
    # Signing out starts a new id too: the old one is no longer signed in.
    signed_in = cookie["value"]
    bo.click("button:has-text('Sign out')")
    bo.wait_for_selector("input[name=token]")
    assert _session_cookie(victim)["value"] != signed_in
    attacker.clear_cookies()
    _plant(attacker, inbox, signed_in)
    page.goto(f"{inbox.url}/inbox")
    assert page.locator("input[name=token]").count() == 1
    attacker.close()
    victim.close()


def test_gatedloop_inbox_serves_the_page_for_a_database_and_needs_a_reviewer(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    env = {**os.environ, "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": "", "GATEDLOOP_GRAPH": "demo"}
    for name in ("GATEDLOOP_AUTH_TOKENS", "GATEDLOOP_AUTH_FILE"):
        env.pop(name, None)
    command = [sys.executable, "-m", "gatedloop.cli.main", "--db", db, "inbox"]
    refused = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2 and "--auth-file FILE" in refused.stderr and len(refused.stderr.splitlines()) == 1
    port = free_port()
    log = tmp_path / "inbox.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--as", "ana", "--port", str(port), "--json"], env=env, stdout=out, stderr=out
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}/inbox", proc, log)
        started = {"type": "inbox", "url": f"http://127.0.0.1:{port}/inbox", "db": db}
        assert [json.loads(line) for line in log.read_text().splitlines()] == [started]  # --json: its one line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/inbox", timeout=10) as response:
            page = response.read().decode()
        assert "ana" in page and "Nothing is waiting for you." in page
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_edit_forms_follow_the_argument_schema_and_refuse_values_that_do_not_parse():
    from langchain_core.tools import tool

    from gatedloop.inbox.forms import FormError, edit_fields, parse_edit

    @tool
    def pay(amount_cents: int, note: str, urgent: bool = False, tags: list[str] | None = None) -> str:
        """Pay someone."""
        return "ok"

    fields = edit_fields(pay, {"amount_cents": 1200, "note": "rent", "tags": ["home"]})
    assert [(f.name, f.kind, f.value) for f in fields] == [
        ("amount_cents", "integer", "1200"),
        ("note", "text", "rent"),
        ("urgent", "boolean", ""),
        ("tags", "json", '[\n "home"\n]'),
    ]
    form = {"amount_cents": "1500", "note": "rent, March", "urgent": "true", "tags": '["home", "march"]'}
    assert parse_edit(fields, form) == {
        "amount_cents": 1500,
        "note": "rent, March",
        "urgent": True,
        "tags": ["home", "march"],
    }
    masked = edit_fields(pay, {"amount_cents": 1200, "note": "***"}, secret=frozenset({"note"}))
    assert [f.value for f in masked][:2] == ["1200", ""]  # a secret is typed again, never sent back as "***"
    with pytest.raises(FormError, match=r"amount_cents: '15\.5' is not a whole number"):
        parse_edit(fields, {**form, "amount_cents": "15.5"})
    with pytest.raises(FormError, match="tags: not JSON"):
        parse_edit(fields, {**form, "tags": "[home"})


def test_under_langgraph_dev_with_auth_reviewers_sign_in_with_their_api_tokens(tmp_path):
    """The repo's langgraph.json (auth + http.app) under the real `langgraph dev`: ana (not an approver) asks through
    the API with her bearer token; in the inbox she sees only her own request, bo (an approver) sees it and approves
    it; the graph records bo, the user of his token, as the approver."""
    import http.cookiejar
    import re
    import urllib.parse

    from devserver import run_dev_server
    from langgraph_sdk import get_sync_client

    users = {"ana": ("ana-api-token-7f3c9e1d2b", ["staff"]), "bo": ("bo-api-token-1d6f2a9e3c", ["finance"])}
    config = {"supervisor_roles": ["finance"], "tokens": {t: {"user_id": u, "roles": r} for u, (t, r) in users.items()}}
    env = {
        "GATEDLOOP_MODEL": "demo",
        "OPENAI_API_KEY": None,
        "GATEDLOOP_DB": str(tmp_path / "studio.sqlite"),
        "GATEDLOOP_LEDGER": None,
        "GATEDLOOP_AUTH_TOKENS": json.dumps(config),
        "GATEDLOOP_AUTH_FILE": None,
    }
    root = SUPPORT.parent.parent
    with run_dev_server(root, env=env, workdir=tmp_path / "server", config_overrides={"env": None}) as url:
        ana_api = get_sync_client(url=url, api_key=None, headers={"Authorization": f"Bearer {users['ana'][0]}"})
        thread_id = ana_api.threads.create()["thread_id"]
        ask = {"messages": [{"role": "user", "content": SEAT.format(who="Ana")}]}
        assert ana_api.runs.wait(thread_id, "gatedloop", input=ask)["__interrupt__"]

        def signed_in(user: str) -> tuple[Any, str, str]:
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
            page = opener.open(f"{url}/inbox", timeout=60).read().decode()
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
            assert csrf is not None and "Reviewer token" in page  # auth configured: nobody is let in unsigned
            form = urllib.parse.urlencode({"csrf": csrf.group(1), "token": users[user][0]}).encode()
            page = opener.open(f"{url}/inbox/login", data=form, timeout=60).read().decode()
            fresh = re.search(r'name="csrf" value="([0-9a-f]+)"', page)  # signing in started a new session
            assert fresh is not None and fresh.group(1) != csrf.group(1)
            return opener, fresh.group(1), page

        _, _, ana_page = signed_in("ana")
        assert f'data-key="{thread_id}"' in ana_page and "requested by ana" in ana_page
        bo, csrf, bo_page = signed_in("bo")
        card = bo_page[bo_page.index(f'data-key="{thread_id}"') :]
        request_id = re.search(r'name="request_id" value="([^"]+)"', card)
        assert request_id is not None
        answer = {"csrf": csrf, "thread_id": thread_id, "request_id": request_id.group(1), "decision-0": "approve"}
        page = bo.open(f"{url}/inbox/answer", data=urllib.parse.urlencode(answer).encode(), timeout=60).read()
        assert f"Thread {thread_id}: decided; the thread ended: completed" in page.decode()
        state = ana_api.threads.get_state(thread_id)
        assert state["values"]["status"] == "completed"
    from gatedloop.checkpoints.ledger import SqliteLedger

    ledger = SqliteLedger(tmp_path / "studio.sqlite")
    try:
        assert [e["actor"] for e in ledger.audit(thread_id) if e["event"] == "decision"] == ["bo"]
    finally:
        ledger.close()


def test_the_request_page_decides_an_edit_and_then_shows_the_diff_the_result_and_the_timeline(browser, inbox):
    """`/requests/<id>` (the notifications' link) shows the card while pending, with the tool's description, its
    effect and the policy facts; answered there, it shows what the reviewer changed, what the tool returned, and
    who did what when."""
    request = inbox.pause("d1", SEAT.format(who="Dora"), requester="rita")
    ana = sign_in(browser, inbox, "ana")
    ana.goto(f"{inbox.url}/requests/{request['request_id']}?thread=d1")
    pending = card(ana, "d1")
    text = pending.inner_text()
    assert "Reserve a workshop seat" in pending.locator(".summary").inner_text()  # the tool's own description
    assert "writes (a side effect)" in text and "approvers: events" in text and "approvals 0 of 1" in text
    pending.locator("details.edit summary").click()
    pending.locator("input[name=arg-0-participant]").fill("Dora Kim")
    assert pending.locator("input[value=edit]").is_checked()  # typing an argument is an edit, visibly
    pending.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=d1")
    story = ana.locator(".story")
    assert ana.locator("h2#decided-title").inner_text().endswith("decided")
    assert story.locator(".diff del").inner_text() == "Dora" and story.locator(".diff ins").inner_text() == "Dora Kim"
    result = json.loads(story.locator(".result.ok pre").inner_text())
    assert result["result"]["participant"] == "Dora Kim", result
    timeline = story.locator(".timeline li").all_inner_texts()
    assert "proposed by the model, asked by rita: needs approval" in timeline[0]
    assert any("edited and approved by ana" in line for line in timeline)
    assert "ran: ok in" in timeline[-1]
    shot(ana, "inbox-decided-request")
    assert ana.goto(f"{inbox.url}/requests/req-000000000000?thread=d1").status == 404
    bo = sign_in(browser, inbox, "bo")  # not an approver of reserve_seat, took no part: not his to see
    assert bo.goto(f"{inbox.url}/requests/{request['request_id']}?thread=d1").status == 404


def test_several_calls_in_one_request_each_get_their_own_decision_in_one_submission(browser, inbox):
    request = inbox.pause("m1", "Reserve seats in WS-101 for Mia and Noor", requester="rita")
    assert [a["args"]["participant"] for a in request["action_requests"]] == ["Mia", "Noor"]
    ana = sign_in(browser, inbox, "ana")
    form = card(ana, "m1")
    form.wait_for()
    assert form.locator("fieldset.action").count() == 2 and "(2 calls)" in form.locator("h2").inner_text()
    form.locator("input[name=decision-0][value=approve]").check()
    form.locator("input[name=decision-1][value=reject]").check()
    form.locator("textarea[name=message-1]").fill("Noor is already registered elsewhere")
    form.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=m1")
    decided = {d["call_id"]: d["detail"]["decision"] for d in inbox.decisions("m1")}
    assert decided == {"call_seat_0": "approve", "call_seat_1": "reject"}
    answers = {m.tool_call_id: m for m in inbox.output("m1")["messages"] if isinstance(m, ToolMessage)}
    assert answers["call_seat_0"].status == "success" and answers["call_seat_1"].status == "error"
    ana.goto(f"{inbox.url}/requests/{request['request_id']}?thread=m1")
    stories = ana.locator(".story")
    assert '"participant": "Mia"' in stories.nth(0).locator(".result.ok").inner_text()
    assert "Noor is already registered elsewhere" in stories.nth(1).locator(".result.refused").inner_text()


def test_filters_and_order_narrow_the_list_and_the_title_counts_what_is_shown(browser, inbox):
    inbox.pause("f-1", "Reserve a seat in workshop WS-102 for Fay", requester="rita")
    inbox.pause("f-2", "Schedule lunch with Alice on 2026-03-10", requester="sam")
    inbox.pause("f-3", "Pay invoice INV-3 with card 4000056655665556", requester="rita")  # expires in 10 min
    ana = sign_in(browser, inbox, "ana")

    def shown(query: str) -> list[str]:
        ana.goto(f"{inbox.url}/inbox?{query}")
        return ana.locator("section.card").evaluate_all("cards => cards.map(c => c.dataset.key)")

    assert shown("thread=f-") == ["f-1", "f-2", "f-3"] and ana.title() == "(3) gatedloop inbox"
    assert shown("thread=f-&order=newest") == ["f-3", "f-2", "f-1"]
    assert shown("thread=f-&order=expiry") == ["f-3", "f-1", "f-2"]
    assert shown("thread=f-&requester=sam") == ["f-2"]
    assert shown("thread=f-&expiring=1") == ["f-3"]
    assert shown("thread=f-&older=60") == [] and "No request matches these filters." in ana.inner_text("#cards")
    assert shown("thread=f-&older=soon") == ["f-1", "f-2", "f-3"]
    assert "'soon' is not a whole number of minutes" in ana.inner_text(".flash.error")
    # The form's controls, by their labels, as a keyboard or screen-reader user reaches them.
    ana.goto(f"{inbox.url}/inbox?thread=f-")
    ana.get_by_label("Tool", exact=True).select_option("reserve_seat")
    ana.get_by_role("button", name="Filter").click()
    ana.wait_for_url("**tool=reserve_seat**")
    assert ana.locator("section.card").evaluate_all("cards => cards.map(c => c.dataset.key)") == ["f-1"]
    assert ana.title() == "(1) gatedloop inbox"
    inbox.pause("f-4", "Reserve a seat in workshop WS-102 for Gus", requester="rita")
    card(ana, "f-4").wait_for()  # the live refresh keeps the filters: a new match appears, and the count follows
    ana.wait_for_function("document.title === '(2) gatedloop inbox'")
    assert card(ana, "f-2").count() == 0


def test_the_inbox_works_with_javascript_disabled(browser, inbox):
    """Live refresh is an enhancement: signing in, filtering, deciding and reading the outcome are plain forms
    and links (POST, then a redirect), and a phone-sized window gets the same page."""
    inbox.pause("n1", SEAT.format(who="Nina"), requester="rita")
    context = browser.new_context(java_script_enabled=False, viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(f"{inbox.url}/inbox")
    page.fill("input[name=token]", TOKENS["cy"])
    page.click("button:has-text('Sign in')")
    page.wait_for_selector("header >> text=cy")
    assert page.locator("meta[name=viewport]").count() == 1
    page.get_by_label("Thread", exact=True).fill("n1")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**thread=n1**")
    assert page.title() == "(1) gatedloop inbox"
    form = card(page, "n1")
    width = form.evaluate("el => el.getBoundingClientRect().width")
    assert width <= 390  # fits a phone's width: no sideways scrolling
    shot(page, "inbox-phone")
    form.locator("input[value=approve]").check()
    form.locator("button.send").click()
    page.wait_for_selector(".flash.ok >> text=n1")
    assert "thread=n1" in page.url  # back to the same filtered list
    assert inbox.output("n1")["status"] == "completed"
    page.goto(f"{inbox.url}/inbox/thread/n1")
    assert "approved by cy" in page.inner_text("#audit")
    context.close()


def test_a_secret_argument_is_never_on_any_page_the_thread_view_included(browser, inbox):
    """`pay_invoice`'s `card` is a secret: its value is in the user's message, the model's call, the tool's result
    (which echoes it) and, after an edit, in what the reviewer typed. No page shows any of them."""
    card_number, new_number = "4111111111111111", "5500000000000004"
    request = inbox.pause("s1", f"Pay invoice INV-7 with card {card_number}", requester="rita")
    assert request["action_requests"][0]["args"]["card"] == "***"
    ana = sign_in(browser, inbox, "ana")
    form = card(ana, "s1")
    form.wait_for()
    assert card_number not in ana.content() and "***" in form.locator("table.args").inner_text()
    form.locator("details.edit summary").click()
    form.locator("input[name=arg-0-card]").fill(new_number)
    form.locator("input[value=approve]").check()
    form.locator("button.send").click()
    ana.wait_for_selector(".flash.ok >> text=s1")
    body = json.loads(inbox.tool_message("s1").content)
    assert body["result"]["receipt"] == f"charged card {new_number}"  # the tool did get (and echo) the secret
    pages = ["/inbox/thread/s1", f"/inbox/requests/{request['request_id']}?thread=s1", "/inbox"]
    for path in pages:
        ana.goto(f"{inbox.url}{path}")
        html = ana.content()
        assert card_number not in html and new_number not in html, path
    ana.goto(f"{inbox.url}/inbox/thread/s1")
    timeline = ana.inner_text("#audit")
    assert "Pay invoice INV-7 with card ***" in timeline and "charged card ***" in timeline
    assert "edited and approved by ana" in timeline
