"""Who may approve, under the real `langgraph dev` with gatedloop's auth, driven through `langgraph-sdk`.

support/auth_app.py's `pay` is always approved and `ToolPolicy(approvers={"finance"})`: only a finance reviewer may
decide it, and not her own call. Users (support/auth_server.py): ana and cy are staff, bo and dee finance (the
approver role). The reviewer is the token's user; the `context` a client sends and the `reviewer` string in an
answer are never authority. Side effects are counted in the file the tool writes.
"""

from __future__ import annotations

from typing import Any

import pytest
from auth_server import GRAPH, AuthServer, say

pytestmark = pytest.mark.slow

BO_CONTEXT = {"user_id": "bo", "roles": ["finance"]}


def pending(client: Any, thread: str) -> dict[str, Any]:
    interrupts = client.threads.get_state(thread)["interrupts"]
    assert len(interrupts) == 1
    return interrupts[0]["value"]


def approve(client: Any, thread: str, request: dict[str, Any], *call_ids: str, **kwargs: Any) -> dict[str, Any]:
    """Approve the calls named (by default the request's first), naming each."""
    named = call_ids or (request["action_requests"][0]["tool_call_id"],)
    answer = {
        "request_id": request["request_id"],
        "decisions": [{"type": "approve", "tool_call_id": call_id} for call_id in named],
        "reviewer": "the-CFO",
    }
    return client.runs.wait(thread, GRAPH, command={"resume": answer}, **kwargs)


def payments(server: AuthServer) -> list[float]:
    return [e["amount"] for e in server.effects() if e["tool"] == "pay"]


def test_a_reviewer_without_the_approver_role_is_refused_and_the_approver_succeeds(auth_server: AuthServer) -> None:
    ana, bo = auth_server.client("ana"), auth_server.client("bo")
    thread = ana.threads.create()["thread_id"]
    out = say(ana, thread, "pay 5", context={"user_id": "the-CFO", "roles": ["finance"]})
    request = pending(ana, thread)
    action = request["action_requests"][0]
    assert action["requested_by"] == "ana" and action["approvers"] == ["finance"]

    # ana (staff) approves, claiming to be bo in her context and the CFO in the answer: refused, and the SDK says so
    # (gatedloop.inbox.refusals: as for a failed run); the request still waits
    refused_for_role = r"^AnswerRefused: pay \(call_1_pay\): deciding this call needs one of the roles"
    with pytest.raises(Exception, match=refused_for_role):
        approve(ana, thread, request, context=BO_CONTEXT)
    refused = pending(ana, thread)
    assert "finance" in refused["error"]
    assert refused["request_id"] == request["request_id"]
    assert [(a["tool_call_id"], a["args"], a["approved_by"]) for a in refused["action_requests"]] == [
        ("call_1_pay", {"amount": 5.0}, [])
    ]
    assert payments(auth_server) == []

    out = approve(bo, thread, refused)
    assert out["status"] == "completed" and "__interrupt__" not in out
    assert payments(auth_server) == [5.0]
    assert bo.threads.get_state(thread)["interrupts"] == []


def test_an_approver_may_not_approve_her_own_call(auth_server: AuthServer) -> None:
    bo, dee = auth_server.client("bo"), auth_server.client("dee")
    thread = bo.threads.create()["thread_id"]
    say(bo, thread, "pay 7")
    request = pending(bo, thread)
    assert request["action_requests"][0]["requested_by"] == "bo"

    out = approve(bo, thread, request, raise_error=False)
    assert out["__error__"] == {"error": "AnswerRefused", "message": pending(bo, thread)["error"]}
    assert "her own call" in out["__error__"]["message"] and out["__interrupt__"]
    assert 7.0 not in payments(auth_server)

    out = approve(dee, thread, pending(dee, thread))
    assert out["status"] == "completed"
    assert payments(auth_server).count(7.0) == 1


def test_a_refused_answer_sent_over_a_stream_ends_it_with_an_error_event_and_the_request_still_waits(
    auth_server: AuthServer,
) -> None:
    """As Agent Chat UI resumes (`runs.stream`): the stream's last event is an `error` with the refusal, the one
    `useStream` shows; the thread stays interrupted on the same request, which the approver then answers over a
    stream that ends without one."""
    ana, bo = auth_server.client("ana"), auth_server.client("bo")
    thread = ana.threads.create()["thread_id"]
    say(ana, thread, "pay 9")
    request = pending(ana, thread)
    call_id = request["action_requests"][0]["tool_call_id"]
    answer = {"request_id": request["request_id"], "decisions": [{"type": "approve", "tool_call_id": call_id}]}

    events = list(ana.runs.stream(thread, GRAPH, command={"resume": answer}, stream_mode=["values", "messages-tuple"]))
    refusal = pending(ana, thread)["error"]
    assert "needs one of the roles ['finance']" in refusal
    assert events[-1].event == "error" and events[-1].data == {"error": "AnswerRefused", "message": refusal}
    assert [e.event for e in events].count("error") == 1
    assert ana.threads.get(thread)["status"] == "interrupted" and payments(auth_server).count(9.0) == 0

    events = list(bo.runs.stream(thread, GRAPH, command={"resume": answer}, stream_mode=["values"]))
    assert "error" not in [e.event for e in events]
    assert bo.threads.get(thread)["status"] == "idle" and payments(auth_server).count(9.0) == 1


def test_in_a_request_that_mixes_roles_each_reviewers_answer_decides_the_call_it_names(auth_server: AuthServer) -> None:
    """The newcomer's case (issue 51): ana's one turn asks for a refund (finance decides it) and an email (support).
    bo's answer naming both is refused whole; naming the refund, it decides the refund only and nothing runs; sue's
    naming the email decides it, and both writes run once, in the order proposed."""
    ana, bo, sue = (auth_server.client(user) for user in ("ana", "bo", "sue"))
    thread = ana.threads.create()["thread_id"]
    say(ana, thread, "refund 12 and email")
    request = pending(ana, thread)
    refund, email = (a["tool_call_id"] for a in request["action_requests"])
    with pytest.raises(Exception, match=r"^AnswerRefused: send_email \(.*needs one of the roles \['support'\]"):
        approve(bo, thread, request, refund, email)

    assert approve(bo, thread, request, refund)["__interrupt__"]
    held = pending(sue, thread)
    assert held["request_id"] == request["request_id"] and "error" not in held
    assert [a["tool_call_id"] for a in held["action_requests"]] == [email]
    assert held["decided"] == [{"tool_call_id": refund, "name": "refund", "decision": "approve", "decided_by": ["bo"]}]
    assert desk_effects(auth_server) == []

    assert approve(sue, thread, held, email)["status"] == "completed"
    assert desk_effects(auth_server) == [("refund", 12.0), ("send_email", "refunded 12")]


def desk_effects(server: AuthServer) -> list[tuple[str, Any]]:
    return [
        (e["tool"], e.get("amount", e.get("body"))) for e in server.effects() if e["tool"] in ("refund", "send_email")
    ]
