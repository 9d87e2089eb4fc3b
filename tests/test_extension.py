"""Extending an approval request (issue 32's expiry ladder): an approver gives a waiting request its time to live
again. The extension is a ledger record the gate derives the deadline from, so the gate, the deliverer and the
inbox all honour it; who may extend is who may decide. On a real SQLite file, with the real clock (short
deadlines: the gate reads the time itself)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any

import pytest
from gate_app import build, effects_for
from starlette.testclient import TestClient

from gatedloop.checkpoints import open_sqlite
from gatedloop.cli.main import main
from gatedloop.graph import InvalidDecision, runs
from gatedloop.tools import CallContext

ANA = CallContext(user_id="ana", roles={"staff"})
BO = CallContext(user_id="bo", roles={"finance"})
CY = CallContext(user_id="cy", roles={"finance"})
TTL = 1.0


def graph_of(saver: Any, ttl: float = TTL) -> Any:
    return build(saver, effects_for(saver), approval="always", approvers=frozenset({"finance"}), approval_ttl_s=ttl)


def pause(graph: Any, thread_id: str) -> dict[str, Any]:
    return runs.start(graph, thread_id, "pay 250 to bo as c1", context=ANA)["__interrupt__"][0].value


def wait_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def test_an_approvers_extension_lets_an_approval_past_the_first_deadline_run_once(db):
    ttl = 3.0  # the approval lands 0.1 s past the first deadline and must be admitted within ttl / 2 - 0.1 s after:
    # with a 1 s ttl, 0.4 s, which a loaded CI machine once took (the call expired, nothing was paid)
    with open_sqlite(db) as saver:
        graph = graph_of(saver, ttl)
        request = pause(graph, "t1")
        [action] = request["action_requests"]
        first = action["expires_at"]
        with pytest.raises(InvalidDecision, match=r"needs one of the roles \['finance'\]"):
            runs.extend(graph, "t1", context=ANA, request_id=request["request_id"])
        with pytest.raises(InvalidDecision, match="is not the pending one"):
            runs.extend(graph, "t1", context=BO, request_id="req-other")
        wait_until(first - ttl / 2)
        until = runs.extend(graph, "t1", context=BO, request_id=request["request_id"]).until
        assert until > first
        with pytest.raises(InvalidDecision, match="bo extended this request already"):
            runs.extend(graph, "t1", context=BO, request_id=request["request_id"])
        wait_until(first + 0.1)  # past the first deadline, within the extended one
        assert runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=CY)["status"] == "completed"
        assert len(effects_for(saver).rows("pay")) == 1
        [extended] = [e for e in saver.ledger.audit("t1") if e["event"].startswith("approval_extended:")]
        assert (extended["actor"], extended["detail"]["until"]) == ("bo", until)


def test_without_an_extension_the_same_approval_is_too_late(db):
    with open_sqlite(db) as saver:
        graph = graph_of(saver)
        [action] = pause(graph, "t1")["action_requests"]
        wait_until(action["expires_at"] + 0.1)
        out = runs.resume(graph, "t1", {"decisions": [{"type": "approve"}]}, context=CY)
        assert out["status"] == "completed" and effects_for(saver).rows("pay") == []  # answered approval_expired


def test_an_expired_request_cannot_be_extended(db):
    with open_sqlite(db) as saver:
        graph = graph_of(saver)
        request = pause(graph, "t1")
        wait_until(request["action_requests"][0]["expires_at"] + 0.1)
        with pytest.raises(InvalidDecision, match="an expired request cannot be extended"):
            runs.extend(graph, "t1", context=BO, request_id=request["request_id"])


def test_the_cli_and_the_inbox_extend_and_the_deliverer_and_the_card_see_the_new_deadline(db, capsys, tmp_path):
    from gatedloop.checkpoints.outbox import notification_id
    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox.identity import Reviewer, Sessions
    from gatedloop.inbox.notify import closed_reason

    with open_sqlite(db) as saver:
        graph = build(saver, effects_for(saver), approval="always", approvers=frozenset({"finance"}), approval_ttl_s=60)
        request = pause(graph, "t1")
        request_id, first = request["request_id"], request["action_requests"][0]["expires_at"]

        @contextmanager
        def backend() -> Any:
            yield InboxBackend.over(graph, saver)

        cy = Reviewer("cy", frozenset({"finance"}), "fixed")
        with TestClient(create_app(backend, Sessions(None, cy))) as client:
            page = client.get("/inbox").text
            csrf = page.split('name="csrf" value="')[1].split('"')[0]
            form = {"csrf": csrf, "thread_id": "t1", "request_id": request_id}
            shown = client.post("/inbox/extend", data=form).text
            assert "Thread t1: extended; it may be decided until " in shown and "(extended)" in shown
        [row] = [e for e in saver.ledger.audit("t1") if e["event"].startswith("approval_extended:cy:")]
        until = row["detail"]["until"]
        notice = saver.ledger.notification(notification_id("t1", request_id, "request"))
        assert notice is not None and until > first
        assert notice.expires_at == until  # the outbox row moved with it: the deliverer warns again before it
        assert closed_reason(saver.ledger, notice, (first + until) / 2) is None  # open past the first deadline
        assert closed_reason(saver.ledger, notice, until + 1) == "expired before delivery"
    graph_file = tmp_path / "payments.py"
    graph_file.write_text(
        "from pathlib import Path\n"
        "from gate_app import build\n"
        "from sample_app import Effects\n"
        f"graph = build(None, Effects(Path({str(tmp_path / 'effects.sqlite')!r})), approval='always',\n"
        "              approvers=frozenset({'finance'}), approval_ttl_s=60)\n"
    )
    argv = ["--db", db, "--graph", f"{graph_file}:graph", "--user", "bo", "--roles", "finance", "--json"]
    assert main([*argv, "extend", "t1", "--request", request_id]) == 0
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if '"extend"' in x]
    assert line["until"] > first and line["request_id"] == request_id


def test_an_extension_and_its_notice_move_are_one_commit(db):
    """Issue 52: the extension's record, its audit row and the request notice's new deadline in one transaction."""
    with open_sqlite(db) as saver:
        graph = graph_of(saver)
        request = pause(graph, "t-commit")
        statements: list[str] = []
        saver.ledger._writer.set_trace_callback(statements.append)
        try:
            until = runs.extend(graph, "t-commit", context=BO, request_id=request["request_id"]).until
        finally:
            saver.ledger._writer.set_trace_callback(None)
        begun = [s.split()[0].upper() for s in statements].count("BEGIN")
        assert begun == 1, statements
        assert any(s.upper().startswith("UPDATE GATEDLOOP_OUTBOX") for s in statements)
        [notice] = [n for n in saver.ledger.unwarned(time.time()) if n.thread_id == "t-commit"]
        assert notice.expires_at == until
