"""gatedloop.graph.auth under the real `langgraph dev`, driven through `langgraph-sdk` with bearer tokens.

One server with tokens configured (users ana and cy: staff; bo and dee: finance, the approver role), one with
auth unconfigured (the local fallback), and one whose configuration is broken. What the graph believed about the
caller is read from the files tests/support/auth_app.py writes, not from anything the server reports.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from auth_server import GRAPH, AuthServer, say, serve_auth_app
from devserver import DevServerError

pytestmark = pytest.mark.slow

FORGED = {"user_id": "the-CFO", "roles": ["finance"]}


def refused_status(call) -> int:
    with pytest.raises(httpx.HTTPStatusError) as caught:
        call()
    return caught.value.response.status_code


def test_requests_without_a_valid_token_are_refused(auth_server: AuthServer) -> None:
    no_token = auth_server.client()
    assert refused_status(no_token.threads.create) == 401
    assert refused_status(no_token.assistants.search) == 401
    assert (
        refused_status(auth_server.client(headers={"Authorization": "Bearer not-a-configured-token"}).threads.create)
        == 401
    )
    assert refused_status(auth_server.client(headers={"Authorization": "Basic YW5hOmFuYQ=="}).threads.search) == 401
    # langgraph dev lets Studio in as its own user with this header unless the config says disable_studio_auth
    studio = auth_server.client(headers={"x-auth-scheme": "langsmith"})
    assert refused_status(studio.threads.create) == 401
    assert refused_status(lambda: studio.runs.wait(None, GRAPH, input={"messages": [("user", "whoami")]})) == 401
    assert auth_server.client("ana").assistants.search()  # the same request with a token goes through


def test_the_token_not_the_client_context_says_who_is_calling(auth_server: AuthServer) -> None:
    ana, bo = auth_server.client("ana"), auth_server.client("bo")
    thread = ana.threads.create()["thread_id"]
    seen_before = auth_server.callers_recorded()
    out = say(ana, thread, "whoami", context=FORGED)
    assert out["status"] == "completed"
    assert auth_server.callers(since=seen_before) == [{"user_id": "ana", "roles": ["staff"]}]

    # close_books needs the finance role: a forged context does not give it to ana, bo's token does
    out = say(ana, thread, "close", context=FORGED)
    assert "permission_denied" in out["answer"]
    assert auth_server.effects() == []
    bo_thread = bo.threads.create()["thread_id"]
    out = say(bo, bo_thread, "close")
    assert out["status"] == "completed" and "closed" in out["answer"]
    assert auth_server.effects() == [{"tool": "close_books", "period": "2026-11"}]


def test_a_user_cannot_read_update_or_resume_another_users_thread(auth_server: AuthServer) -> None:
    ana, cy, bo = auth_server.client("ana"), auth_server.client("cy"), auth_server.client("bo")
    thread = ana.threads.create(metadata={"owner": "cy"})["thread_id"]
    assert ana.threads.get(thread)["metadata"]["owner"] == "ana"  # the client cannot choose the owner
    out = say(ana, thread, "pay 5")
    assert out["__interrupt__"] and out["status"] != "completed"
    pending = ana.threads.get_state(thread)
    approve = {"decisions": [{"type": "approve"}]}

    attempts = {
        "get": lambda: cy.threads.get(thread),
        "get_state": lambda: cy.threads.get_state(thread),
        "get_history": lambda: cy.threads.get_history(thread),
        "update_state": lambda: cy.threads.update_state(thread, {"messages": []}, as_node="approve"),
        "update metadata": lambda: cy.threads.update(thread, metadata={"note": "mine now"}),
        "resume": lambda: cy.runs.wait(thread, GRAPH, command={"resume": approve}, context=FORGED),
        "create a run on it": lambda: cy.runs.create(thread, GRAPH, input={"messages": [("user", "whoami")]}),
        "list its runs": lambda: cy.runs.list(thread),
        "copy": lambda: cy.threads.copy(thread),
        "delete": lambda: cy.threads.delete(thread),
    }
    for name, attempt in attempts.items():
        assert refused_status(attempt) in (403, 404, 409), name  # 404 (the server's "not yours"), 409 for copy
    assert thread not in {t["thread_id"] for t in cy.threads.search(limit=100)}
    assert refused_status(lambda: ana.threads.update(thread, metadata={"owner": "cy"})) == 403

    after = ana.threads.get_state(thread)
    assert after["checkpoint"] == pending["checkpoint"] and after["interrupts"] == pending["interrupts"]
    assert [e for e in auth_server.effects() if e["tool"] == "pay"] == []

    # an approver (finance) may see it, to review it; its owner still lists it
    assert bo.threads.get_state(thread)["interrupts"] == pending["interrupts"]
    assert thread in {t["thread_id"] for t in bo.threads.search(limit=100)}
    assert thread in {t["thread_id"] for t in ana.threads.search(limit=100)}

    # nobody routes it, not its owner, not an approver: a routed node would run beside the paused approve
    for who in (ana, bo):
        assert refused_status(lambda who=who: who.runs.wait(thread, GRAPH, command={"goto": "finalize"})) == 422
    assert ana.threads.get_state(thread)["interrupts"] == pending["interrupts"]


def test_only_approvers_reach_the_rest_of_the_api(auth_server: AuthServer) -> None:
    cy, dee = auth_server.client("cy"), auth_server.client("dee")
    assert refused_status(lambda: cy.store.put_item(["cy"], "k", {"v": 1})) == 403
    assert refused_status(lambda: cy.assistants.create(GRAPH, name="mine")) == 403
    assert cy.assistants.search(graph_id=GRAPH)
    dee.store.put_item(["dee"], "k", {"v": 1})
    assert dee.store.get_item(["dee"], "k")["value"] == {"v": 1}


def test_unconfigured_auth_is_one_local_user_and_the_context_is_the_caller(tmp_path: Path) -> None:
    with serve_auth_app(tmp_path, tokens=None) as server:
        for client, user in ((server.client(), "ana"), (server.client(headers={"x-auth-scheme": "langsmith"}), "bo")):
            thread = client.threads.create()["thread_id"]
            seen_before = server.callers_recorded()
            out = say(client, thread, "whoami", context={"user_id": user, "roles": ["finance"]})
            assert out["status"] == "completed"
            assert client.threads.get_state(thread)["values"]["status"] == "completed"
            assert server.callers(since=seen_before) == [{"user_id": user, "roles": ["finance"]}]


def test_a_bad_auth_config_stops_the_server_with_one_clear_error(tmp_path: Path) -> None:
    config = {"tokens": {"ana-token-7f3c9e1d2b": {"user_id": "ana", "roles": "finance"}}}
    with pytest.raises(DevServerError) as caught, serve_auth_app(tmp_path, tokens=config):
        pass
    log = str(caught.value)
    assert "gatedloop auth config (GATEDLOOP_AUTH_TOKENS): tokens.entry #1.roles:" in log
    assert "ana-token-7f3c9e1d2b" not in log
