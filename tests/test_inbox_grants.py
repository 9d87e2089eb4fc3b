"""The inbox's standing grants (issue 53) and reviewer telemetry (issue 54) in a real browser: Debian's chromium
driven by Playwright against the inbox over grants_app's payments agent (tests/support/inbox_grants_app.py), one
server and one browser for the module, as tests/test_inbox.py does.

A finance reviewer approves a payment and grants similar ones from its card; the next identical payment runs with
no request, the Grants page shows the grant with a use taken and the limit's counter, and once it is revoked the
next payment asks again. Who sees the grant form and the Revoke and Confirm buttons is the grant rules' (role,
grantable tool, quorum). The Stats page shows `gatedloop stats`'s numbers to a supervisor only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from grants_app import ANA, BO
from inbox_browser import CHROMIUM, served_inbox, shot, sign_in

from gatedloop.checkpoints.evidence import ApprovalRecord, NewCall
from gatedloop.checkpoints.review_stats import RUBBER_STAMP_MIN_DECISIONS
from gatedloop.graph import runs

sync_api = pytest.importorskip("playwright.sync_api")

if not Path(CHROMIUM).exists():
    if os.environ.get("CI") == "true":
        pytest.fail(f"no chromium at {CHROMIUM} (.ci/start_chromium.sh installs it)", pytrace=False)
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

USERS = {
    "bo": ("bo-token-0123456789ab", ["finance"]),
    "cy": ("cy-token-0123456789ab", ["finance"]),
    "sue": ("sue-token-0123456789a", ["support"]),
    "vic": ("vic-token-0123456789a", ["supervisor"]),
}
"""bo and cy grant payments (finance); sue decides mail only (support); vic reads the Stats page."""


@dataclass
class Inbox:
    url: str
    graph: Any
    saver: Any
    effects: Any

    def ask(self, thread_id: str, text: str) -> dict[str, Any]:
        return runs.start(self.graph, thread_id, text, context=ANA)

    def page(self, browser: Any, user: str) -> Any:
        return sign_in(browser, self.url, user, USERS[user][0])


@pytest.fixture(scope="module")
def inbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Inbox]:
    from inbox_grants_app import app_parts

    folder = tmp_path_factory.mktemp("inbox-grants")
    db = str(folder / "runs.sqlite")
    served = served_inbox("inbox_grants_app.py", db, folder, USERS, ["finance", "support"])
    with app_parts(db) as (graph, saver, effects), served as url:
        yield Inbox(url, graph, saver, effects)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def call_of(page: Any, thread_id: str, tool: str) -> Any:
    return page.locator(f'section[data-key="{thread_id}"] fieldset[data-tool="{tool}"]')


def grant_row(page: Any, grant_id: str) -> Any:
    return page.locator(f'tr[data-grant="{grant_id}"]')


def test_approve_and_grant_runs_the_next_identical_call_and_revoke_makes_it_ask_again(browser, inbox):
    assert inbox.ask("g1", "pay bo 50").get("__interrupt__")
    bo = inbox.page(browser, "bo")
    pay = call_of(bo, "g1", "pay")
    pay.locator("details.grant summary").click()
    assert pay.locator("input[name='grant-0-value-to']").input_value() == "bo"  # each argument, as the call has it
    assert pay.locator("input[name='grant-0-value-amount']").input_value() == "50.0"
    pay.locator("input[name='grant-0-value-amount']").fill("lots")
    pay.locator("input[name='grant-0-uses']").fill("3")
    pay.locator("button.grant-send").click()
    refused = bo.wait_for_selector(".flash.error >> text=g1").inner_text()
    assert "not sent" in refused and "'lots' is not a number" in refused, refused
    assert runs.output(inbox.graph, "g1").get("__interrupt__") and inbox.effects.rows("pay") == []  # nothing ran
    assert runs.grants(inbox.graph) == []
    pay = call_of(bo, "g1", "pay")
    pay.locator("details.grant summary").click()
    pay.locator("select[name='grant-0-op-amount']").select_option("max")  # widened: amount <= 100
    pay.locator("input[name='grant-0-value-amount']").fill("100")
    pay.locator("input[name='grant-0-uses']").fill("3")
    shot(bo, "inbox-approve-and-grant")
    pay.locator("button.grant-send").click()
    note = bo.wait_for_selector(".flash.ok >> text=g1").inner_text()
    assert "the thread ended: completed" in note and "where amount<=100, to=bo; 3 uses" in note and "live" in note
    [grant] = runs.grants(inbox.graph)
    assert (grant.requester, grant.granted_by) == ("ana", ["bo"])  # restricted to the requester by default
    out = inbox.ask("g2", "pay bo 80")  # inside the grant: runs with no request
    assert out["status"] == "completed" and "__interrupt__" not in out
    assert [args["amount"] for _, args, _ in inbox.effects.rows("pay")] == [50.0, 80.0]
    bo.click("nav >> text=Grants")
    row = grant_row(bo, grant.grant_id)
    assert row.locator(".uses").inner_text() == "2 / 3" and row.locator(".status").inner_text() == "live"
    assert "amount<=100, to=bo (requester ana)" in row.inner_text()
    assert "130 of 500" in bo.locator("table.limits").inner_text()  # pay's limit per tenant: this window's counter
    shot(bo, "inbox-grants")
    row.locator("button.revoke").click()
    assert "revoked" in bo.wait_for_selector(".flash.ok").inner_text()
    assert grant_row(bo, grant.grant_id).locator(".status").text_content() == "revoked"  # among the ended ones
    assert inbox.ask("g3", "pay bo 50").get("__interrupt__")  # revoked: the next payment asks a person again


def test_a_list_argument_is_granted_element_by_element(browser, inbox):
    """A call with a list of recipients offers "each one of" them (comma-separated, editable); the grant then covers
    a later call to any of them, and one to someone else still asks."""
    assert inbox.ask("l1", "announce bo cy").get("__interrupt__")
    bo = inbox.page(browser, "bo")
    announce = call_of(bo, "l1", "announce")
    announce.locator("details.grant summary").click()
    assert announce.locator("select[name='grant-0-op-to'] option").all_inner_texts() == ["each one of", "any value"]
    assert announce.locator("input[name='grant-0-value-to']").input_value() == "bo,cy"
    announce.locator("input[name='grant-0-value-to']").fill("bo,cy,dee")
    announce.locator("button.grant-send").click()
    assert "where to in bo,cy,dee" in bo.wait_for_selector(".flash.ok >> text=l1").inner_text()
    assert inbox.ask("l2", "announce dee bo")["status"] == "completed"  # inside: no request
    assert inbox.ask("l3", "announce eve").get("__interrupt__")  # outside: a person decides
    assert [args["to"] for _, args, _ in inbox.effects.rows("announce")] == [["bo", "cy"], ["dee", "bo"]]


def test_an_object_and_a_list_of_objects_are_granted_field_by_field(browser, inbox):
    """An order's lines (`items: list[Line]`) offer a row per field, each one of the values its lines have (the
    quantities may be widened to "at most"); its payment (`payment: Payment`) a row per field, equal to the call's.
    The grant then covers a later order inside every field's bound, and one of another product still asks."""
    assert inbox.ask("o1", "order A:2 B:5 EUR 40").get("__interrupt__")
    bo = inbox.page(browser, "bo")
    order = call_of(bo, "o1", "order")
    order.locator("details.grant summary").click()
    rows = order.locator("table.grant-bounds th").all_inner_texts()
    assert rows == ["items.qty", "items.sku", "payment.amount", "payment.currency"]
    assert order.locator("input[name='grant-0-value-items.sku']").input_value() == "A,B"
    assert order.locator("input[name='grant-0-value-payment.currency']").input_value() == "EUR"
    quantity = order.locator("select[name='grant-0-op-items.qty'] option").all_inner_texts()
    assert quantity == ["each one of", "at most", "any value"]
    order.locator("select[name='grant-0-op-items.qty']").select_option("max")
    order.locator("input[name='grant-0-value-items.qty']").fill("5")
    order.locator("input[name='grant-0-value-items.sku']").fill("A,B,C")
    order.locator("select[name='grant-0-op-payment.amount']").select_option("max")
    order.locator("input[name='grant-0-value-payment.amount']").fill("100")
    order.locator("button.grant-send").click()
    note = bo.wait_for_selector(".flash.ok >> text=o1").inner_text()
    assert "where items.qty<=5, items.sku in A,B,C, payment.amount<=100, payment.currency=EUR" in note, note
    assert inbox.ask("o2", "order C:5 A:1 EUR 90")["status"] == "completed"  # inside every bound: no request
    assert inbox.ask("o3", "order D:1 EUR 10").get("__interrupt__")  # another product: a person decides
    assert inbox.ask("o4", "order A:1 USD 10").get("__interrupt__")  # another currency too
    assert [len(args["items"]) for _, args, _ in inbox.effects.rows("order")] == [2, 2]


def test_no_grant_form_without_the_role_nor_for_a_tool_that_is_not_grantable(browser, inbox):
    """One request with a payment (finance, grantable) and a letter (support, not grantable): each reviewer decides
    her own call; only bo, on the payment, is offered a grant. On the Grants page sue, who may not decide payments,
    has no Revoke button, and a revoke she forges is refused."""
    assert inbox.ask("m1", "pay bo 20; mail cy hi").get("__interrupt__")
    bo, sue = inbox.page(browser, "bo"), inbox.page(browser, "sue")
    call_of(bo, "m1", "pay").wait_for()
    assert call_of(bo, "m1", "pay").locator("details.grant").count() == 1
    assert call_of(bo, "m1", "mail").locator("details.grant").count() == 0  # not his call
    call_of(sue, "m1", "mail").wait_for()
    assert call_of(sue, "m1", "mail").locator("input[type=radio]").count() > 0  # hers to decide...
    assert call_of(sue, "m1", "mail").locator("details.grant").count() == 0  # ...but mail is not grantable
    assert call_of(sue, "m1", "pay").locator("details.grant").count() == 0  # and payments are not hers
    grant_id = runs.grant(inbox.graph, "pay", context=BO, where=["to=cy"], uses=1, expires_in_s=600)
    sue.goto(f"{inbox.url}/inbox/grants")
    assert grant_row(sue, grant_id).locator("button").count() == 0
    sue.goto(f"{inbox.url}/inbox")
    csrf = sue.locator("input[name=csrf]").first.input_value()
    forged = sue.request.post(f"{inbox.url}/inbox/grants/revoke", form={"csrf": csrf, "grant_id": grant_id})
    assert "not revoked" in forged.text() and "revoking a grant of pay" in forged.text()
    assert next(v for v in runs.grants(inbox.graph) if v.grant_id == grant_id).status == "live"
    bo.goto(f"{inbox.url}/inbox/grants")
    assert grant_row(bo, grant_id).locator("button.revoke").count() == 1


def test_a_grant_of_a_tool_that_needs_two_approvers_is_pending_until_another_granter_confirms_it(browser, inbox):
    assert inbox.ask("w1", "wire bo 300").get("__interrupt__")
    bo = inbox.page(browser, "bo")
    wire = call_of(bo, "w1", "wire")
    wire.locator("details.grant summary").click()
    wire.locator("button.grant-send").click()
    note = bo.wait_for_selector(".flash.ok >> text=w1").inner_text()
    assert "pending (1 of 2 granters)" in note and "Another granter confirms it on the Grants page" in note
    bo.goto(f"{inbox.url}/inbox/grants")
    [pending] = [v for v in runs.grants(inbox.graph) if v.tool == "wire"]
    assert grant_row(bo, pending.grant_id).locator("button.confirm").count() == 0  # not twice by the same person
    cy = inbox.page(browser, "cy")
    cy.click("nav >> text=Grants")
    grant_row(cy, pending.grant_id).locator("button.confirm").click()
    assert "live (granted by bo, cy)" in cy.wait_for_selector(".flash.ok").inner_text()
    assert grant_row(cy, pending.grant_id).locator(".status").inner_text() == "live"


def _scripted_history(ledger: Any) -> float:
    """Requests of a tool of their own ("archive") and decisions of reviewers of their own, written as the gate
    writes them, each decision some seconds after its request; the moment after the first, older one."""
    count = 0

    def ask() -> tuple[str, str, float]:
        nonlocal count
        count += 1
        thread_id, call_id = f"stats-{count}", f"archive-{count}"
        record = ledger.register_calls(thread_id, [NewCall(call_id, "archive", "digest", "ask", ANA, "pin")])
        return thread_id, call_id, record[call_id].requested_at

    def decide(reviewer: str, decision: str, waited_s: float) -> None:
        thread_id, call_id, asked_at = ask()
        record = ApprovalRecord(call_id, "archive", "digest", reviewer, frozenset(), decision, asked_at + waited_s)
        ledger.record_approvals(thread_id, [record])

    decide("old", "reject", 100.0)
    time.sleep(0.01)
    window = time.time()
    for _ in range(RUBBER_STAMP_MIN_DECISIONS):
        decide("rubber", "approve", 1.5)
    decide("careful", "reject", 40.0)
    decide("careful", "approve", 60.0)
    thread_id, call_id, _ = ask()
    ledger.record(thread_id, call_id, "approval_expired", {"tool": "archive"})
    ask()  # still waiting
    return window


def test_the_stats_page_shows_a_supervisor_the_counts_and_flags_the_rubber_stamper(browser, inbox):
    window = _scripted_history(inbox.saver.ledger)
    vic = inbox.page(browser, "vic")
    vic.click("nav >> text=Stats")
    archive = vic.locator('table.stats-tools tr[data-tool="archive"]').inner_text().split("\t")  # waits for the page
    assert archive[:4] == ["archive", "25", "23", "21"]  # asked, decided, approved
    assert archive[-4:] == ["1", "0", "0", "0"]  # expired; granted, sent back, refused by a limit
    assert vic.locator('tr[data-reviewer="old"]').count() == 1
    vic.goto(f"{inbox.url}/inbox/stats?since={window}")
    rubber = vic.locator('tr[data-reviewer="rubber"]')
    assert rubber.get_attribute("class") == "flagged" and rubber.locator(".flag").inner_text() == "rubber stamp?"
    assert "20\t20\t0\t0\t0\t100%\t1.5 s\t1.5 s" in rubber.inner_text()
    careful = vic.locator('tr[data-reviewer="careful"]')
    assert "50%" in careful.inner_text() and "rubber stamp?" not in careful.inner_text()
    assert vic.locator('tr[data-reviewer="old"]').count() == 0  # decided on a request asked before the window
    shot(vic, "inbox-stats")
    assert "expected a duration back from now" in vic.goto(f"{inbox.url}/inbox/stats?since=soon").text()
    bo = inbox.page(browser, "bo")  # finance: a reviewer, not a supervisor
    assert bo.locator("nav >> text=Stats").count() == 0
    assert bo.goto(f"{inbox.url}/inbox/stats").status == 403
