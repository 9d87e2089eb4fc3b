"""Limits across threads (issue 53; invariant 17): what a tool's writes may do together in a window, across every
thread and process on one database, charged with the write's claim.

Concurrent workers never take a limit past its bound; a write over one is asked of a person (the request says which
limit and by how much, and her approval lets it past) or refused (`limit_exceeded`), as the limit says, also when a
standing grant covers it; `gatedloop limits` shows the window's counters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import Backend, isolated
from cli_in_process import run_cli
from grants_app import ANA, BO, DEE, build, run_race
from limited_email_app import build as limited_email
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.receipts import build_receipts
from gatedloop.graph import runs
from gatedloop.tools import ToolPolicy
from gatedloop.tools.usage import UsageLimit


@pytest.fixture
def graph(tmp_path: Path) -> Iterator[Any]:
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        yield build(saver, Effects(tmp_path / "effects.sqlite"))


def effects(tmp_path: Path, tool: str) -> list[dict[str, Any]]:
    return [args for _, args, _ in Effects(tmp_path / "effects.sqlite").rows(tool)]


@pytest.mark.slow
def test_a_limit_holds_under_concurrent_workers(backend: Backend, tmp_path: Path, monkeypatch):
    """Five processes each send one email as ana at the same moment, under at most 3 per requester per hour: three
    run, two go back to a person, and the counter stands at 3."""
    with isolated(backend) as store:
        if store.name == "postgres":
            monkeypatch.setenv("GATEDLOOP_TEST_PG_URL", store.db)
        store.ledger().close()  # tables made before the race
        said = run_race(store.child_db, tmp_path, 5, say="email ana@example.com")
        assert sorted(line.split()[0] for line in said) == ["asked"] * 2 + ["ran"] * 3, said
        assert all("limit at most 3 calls per requester per 1 h (ana)" in line for line in said if "asked" in line)
        assert len(effects(tmp_path, "email")) == 3
        ledger = store.ledger()
        try:
            [usage] = ledger.limit_usage()
            assert (usage.tool, usage.group, usage.total, usage.calls, usage.at_most) == ("email", "ana", 3, 3, 3)
            assert ledger.verify_chain().ok
        finally:
            ledger.close()


def test_over_a_limit_that_asks_a_person_is_told_which_and_by_how_much_and_may_let_it_past(graph: Any, tmp_path: Path):
    for n in range(3):
        assert runs.start(graph, f"t{n}", "email x", context=ANA)["status"] == "completed"
    out = runs.start(graph, "fourth", "email x", context=ANA)
    [action] = out["__interrupt__"][0].value["action_requests"]
    over = "limit at most 3 calls per requester per 1 h (ana): 3 used in this 1 h window and this call adds 1, 1 over"
    assert action["sent_back"] == over and f"Sent back to a person: {over}" in action["description"]
    assert runs.start(graph, "dee", "email x", context=DEE)["status"] == "completed"  # her own counter

    out = runs.resume(graph, "fourth", {"decisions": [{"type": "approve"}]}, context=BO)
    assert out["status"] == "completed" and len(effects(tmp_path, "email")) == 5
    totals = {u.group: (u.total, u.at_most) for u in runs.limit_usage(graph)}
    assert totals == {"ana": (4, 3), "dee": (1, 3)}  # past the bound once, by a person's decision


def test_a_limit_that_refuses_is_never_gone_past_also_for_granted_calls(graph: Any, tmp_path: Path):
    grant_id = runs.grant(graph, "pay", context=BO, where=["amount<=400"], uses=5, expires_in_s=600)
    assert runs.start(graph, "a", "pay bo 300", context=ANA)["status"] == "completed"  # the grant approved it
    out = runs.start(graph, "b", "pay cy 250", context=DEE)  # the same tenant: 550 > 500
    [answer] = [m for m in out["messages"] if m.type == "tool"]
    error = json.loads(answer.content)["error"]
    assert error["type"] == "limit_exceeded" and "(acme): 300 used" in error["message"]
    assert "this call adds 250, 50 over" in error["message"]
    assert [g.uses_left for g in runs.grants(graph)] == [4]  # the refused claim took no use of the grant

    out = runs.start(graph, "c", "pay cy 450", context=ANA)  # outside the grant: a person approves, still refused
    out = runs.resume(graph, "c", {"decisions": [{"type": "approve"}]}, context=BO)
    assert "limit_exceeded" in [m for m in out["messages"] if m.type == "tool"][-1].content
    assert effects(tmp_path, "pay") == [{"to": "bo", "amount": 300}]
    assert runs.grants(graph)[0].grant_id == grant_id
    assert [(u.group, u.total) for u in runs.limit_usage(graph)] == [("acme", 300)]


def test_a_limit_must_be_well_formed_and_on_a_write():
    for bad, problem in (
        ({"at_most": 0}, "at_most must be a positive number"),
        ({"at_most": 5, "window_s": -1}, "window_s must be a positive number"),
        ({"at_most": 5, "per": "tenant"}, "per must be None or one of"),
        ({"at_most": 5, "over": "warn"}, "over must be 'ask' or 'refuse'"),
    ):
        with pytest.raises(ValueError, match=problem):
            UsageLimit(**bad)
    with pytest.raises(ValueError, match="grantable and limits apply to writes"):
        ToolPolicy(effect="read", limits=[UsageLimit(at_most=5)])
    with pytest.raises(ValueError, match="share a counter"):
        ToolPolicy(limits=[UsageLimit(at_most=5), UsageLimit(at_most=9)])


def test_gatedloop_limits_shows_the_windows_counters(graph: Any, tmp_path: Path):
    runs.start(graph, "t", "email x", context=ANA)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    argv = ["--db", str(tmp_path / "runs.sqlite"), "--graph", "grants_app:graph", "limits"]
    shown = run_cli(argv, env)
    assert shown.returncode == 0, shown.stderr
    assert "at most 3 calls per requester per 1 h" in shown.stdout and "1 of 3" in shown.stdout
    [line] = [json.loads(text) for text in run_cli([*argv, "--json"], env).stdout.splitlines()]
    shown_json = (line["type"], line["tool"], line["group"], line["total"], line["at_most"])
    assert shown_json == ("limit", "email", "ana", 1, 3)


def test_a_request_a_limit_sent_back_after_its_approval_is_still_told_to_reviewers(tmp_path: Path):
    """bo approved ana's second email, but the limit (1 per hour, ask past it) sent it back at the claim: the new
    request is open for the deliverer (the approval before it no longer counts, as the gate counts it), while the
    notices of the request bo decided, its reminder included, stay closed; cy's approval of the new one closes it."""
    from grants_app import CY, FINANCE, POLICIES, make_tools, responder

    from gatedloop.checkpoints.outbox import notification_id
    from gatedloop.graph import build_graph
    from gatedloop.graph.scripted import ScriptedChatModel
    from gatedloop.inbox.notify import closed_reason
    from gatedloop.tools.usage import HOUR

    email = ToolPolicy(
        effect="write",
        approvers=FINANCE,
        remind_after_s=600,
        limits=[UsageLimit(at_most=1, window_s=HOUR, per="requester")],
    )
    approve = {"decisions": [{"type": "approve"}]}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        tools = make_tools(Effects(tmp_path / "effects.sqlite"))
        graph = build_graph(
            ScriptedChatModel(responder=responder), tools, policies={**POLICIES, "email": email}, checkpointer=saver
        )
        runs.start(graph, "first", "email x", context=ANA)
        assert runs.resume(graph, "first", approve, context=BO)["status"] == "completed"
        decided = runs.start(graph, "second", "email x", context=ANA)["__interrupt__"][0].value["request_id"]
        out = runs.resume(graph, "second", approve, context=BO)
        again = out["__interrupt__"][0].value
        assert again["request_id"] != decided and again["action_requests"][0]["sent_back"].startswith("limit at most 1")

        def reason(request_id: str, kind: Any = "request") -> str | None:
            notice = saver.ledger.notification(notification_id("second", request_id, kind))
            assert notice is not None
            return closed_reason(saver.ledger, notice, notice.created_at)

        assert reason(again["request_id"]) is None and reason(again["request_id"], "reminder") is None
        assert reason(decided) == reason(decided, "reminder") == "decided before delivery"
        assert runs.resume(graph, "second", approve, context=CY)["status"] == "completed"
        assert reason(again["request_id"]) == "decided before delivery"
    assert len(effects(tmp_path, "email")) == 2


APPROVE = {"decisions": [{"type": "approve"}]}


def test_the_reviewer_whose_approval_a_limit_sent_back_may_approve_it_again(tmp_path: Path):
    """bo approved ana's second email, the limit sent it back to a person at the claim: bo is that person too. His
    second approval is counted (a decision counts once per round, and the send-back began a new one), the write
    runs once, past the bound by his decision; a third email is sent back again and waits for a person."""
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = limited_email(saver, Effects(tmp_path / "effects.sqlite"))
        runs.start(graph, "first", "email x", context=ANA)
        assert runs.resume(graph, "first", APPROVE, context=BO)["status"] == "completed"
        runs.start(graph, "second", "email x", context=ANA)
        sent_back = runs.resume(graph, "second", APPROVE, context=BO)["__interrupt__"][0].value
        assert sent_back["action_requests"][0]["approved_by"] == []  # his approval before it no longer counts
        out = runs.resume(graph, "second", APPROVE, context=BO)
        assert out["status"] == "completed", out.get("__interrupt__")
        assert len(effects(tmp_path, "email")) == 2
        assert [(u.total, u.at_most) for u in runs.limit_usage(graph)] == [(2, 1)]
        rows = saver.ledger.approvals("second", ["c1_0"])
        assert [(a.reviewer, a.decision, a.sent_back_round) for a in rows] == [
            ("bo", "approve", 0),
            ("limit:" + rows[1].reviewer.removeprefix("limit:"), "sent_back", 0),
            ("bo", "approve", 1),
        ]
        audit = [e["event"] for e in saver.ledger.audit("second") if e["event"].startswith("decision")]
        assert len(audit) == 2  # each counted decision has its audit row, and its receipt shows its own record
        receipts = [r for r in build_receipts(saver.ledger, thread="second") if r["kind"] == "decision"]
        shown = [[row["values"] for row in r["rows"] if row["table"] == "gatedloop_approvals"] for r in receipts]
        assert [[(v["reviewer"], v["sent_back_round"]) for v in rows] for rows in shown] == [[("bo", 0)], [("bo", 1)]]
        # past the bound for that call only: the next one goes back to a person again
        runs.start(graph, "third", "email x", context=ANA)
        assert "__interrupt__" in runs.resume(graph, "third", APPROVE, context=BO)
        assert len(effects(tmp_path, "email")) == 2
        assert saver.ledger.verify_chain().ok


def test_a_repeated_approval_in_one_round_counts_once(tmp_path: Path):
    """Two approvals needed: after the limit sends the call back, bo approves, and his identical answer again (a
    replay) still counts once: the call waits for a second reviewer, and one row records bo's approval of the
    round."""
    from grants_app import CY

    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = limited_email(saver, Effects(tmp_path / "effects.sqlite"), required=2)
        runs.start(graph, "first", "email x", context=ANA)
        runs.resume(graph, "first", APPROVE, context=BO)
        assert runs.resume(graph, "first", APPROVE, context=CY)["status"] == "completed"
        runs.start(graph, "second", "email x", context=ANA)
        runs.resume(graph, "second", APPROVE, context=BO)
        assert "__interrupt__" in runs.resume(graph, "second", APPROVE, context=CY)  # sent back by the limit
        for _ in range(2):
            waiting = runs.resume(graph, "second", APPROVE, context=BO)["__interrupt__"][0].value
            assert waiting["action_requests"][0]["approved_by"] == ["bo"]
        rounds = [(a.reviewer, a.sent_back_round) for a in saver.ledger.approvals("second", ["c1_0"])]
        assert rounds.count(("bo", 1)) == 1
        assert runs.resume(graph, "second", APPROVE, context=CY)["status"] == "completed"
        assert len(effects(tmp_path, "email")) == 2


def test_the_cli_and_the_inbox_take_the_same_reviewers_approval_after_a_send_back(tmp_path: Path):
    """bo approves ana's second and third emails twice each, the second time after the limit sent them back: with
    `gatedloop resume --approve`, then in the inbox (each time the request he is shown, the second a new one); each
    write runs once."""
    from contextlib import contextmanager

    from starlette.testclient import TestClient

    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox.identity import Reviewer, Sessions

    db, effects_file = tmp_path / "runs.sqlite", tmp_path / "effects.sqlite"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GRANTS_EFFECTS": str(effects_file)}
    argv = ["--db", str(db), "--graph", "limited_email_app:graph", "--user", "bo", "--roles", "finance"]
    with open_sqlite(db) as saver:
        graph = limited_email(saver, Effects(effects_file))
        runs.start(graph, "first", "email x", context=ANA)
        assert runs.resume(graph, "first", APPROVE, context=BO)["status"] == "completed"
        runs.start(graph, "cli", "email x", context=ANA)
        runs.start(graph, "inbox", "email x", context=ANA)
        requests = []
        for exit_code in (3, 0):  # 3: still waiting (sent back), then done
            request = runs.pending_request(graph, "cli")
            assert request is not None
            requests.append(request["request_id"])
            said = run_cli([*argv, "resume", "cli", "--request", request["request_id"], "--approve"], env)
            assert said.returncode == exit_code, said.stdout + said.stderr
        assert requests[0] != requests[1] and runs.output(graph, "cli")["status"] == "completed"
    assert len(effects(tmp_path, "email")) == 2

    with open_sqlite(db) as saver:
        graph = limited_email(saver, Effects(effects_file))

        @contextmanager
        def backend() -> Any:
            yield InboxBackend.over(graph, saver)

        shown = []
        with TestClient(create_app(backend, Sessions(None, Reviewer("bo", frozenset({"finance"}), "fixed")))) as client:
            for _ in range(2):
                request = runs.pending_request(graph, "inbox")
                assert request is not None
                shown.append(request["request_id"])
                csrf = client.get("/inbox").text.split('name="csrf" value="')[1].split('"')[0]
                form = {"csrf": csrf, "thread_id": "inbox", "request_id": request["request_id"]}
                client.post("/inbox/answer", data={**form, "decision-0": "approve", "call-0": "c1_0"})
        assert shown[0] != shown[1]  # the request the limit sent back is a new one
        assert runs.pending_request(graph, "inbox") is None and runs.output(graph, "inbox")["status"] == "completed"
    assert len(effects(tmp_path, "email")) == 3


OLD_APPROVALS_TABLE = """CREATE TABLE IF NOT EXISTS gatedloop_approvals (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    args_digest TEXT NOT NULL,
    reviewer TEXT NOT NULL,
    roles TEXT NOT NULL,
    decision TEXT NOT NULL,
    at REAL NOT NULL,
    UNIQUE (thread_id, call_id, args_digest, reviewer, decision)
);
"""
OLD_COLUMNS = ("seq", "thread_id", "call_id", "tool", "args_digest", "reviewer", "roles", "decision", "at")


def _old_content_hash(row: dict[str, Any]) -> str:
    """An approval row's content hash as gatedloop hashed it before rounds (its nine columns), written out here."""
    import hashlib

    def text(value: Any) -> str:
        return "s" + value if isinstance(value, str) else f"f{value!r}" if isinstance(value, float) else f"i{value}"

    parts = ["gatedloop_approvals", *(f"{c}={len(text(row[c]))}:{text(row[c])}" for c in sorted(row))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _make_old_ledger(store: Backend) -> tuple[list[dict[str, Any]], list[str]]:
    """The ledger tables as gatedloop made them before rounds, with bo's approval of call c1 and the limit's
    send-back of it, chained as that code chained them; the rows, and their chain entries' content hashes."""
    from gatedloop.checkpoints.approval_rounds import APPROVALS_TABLE
    from gatedloop.checkpoints.chain import append, begin_chain, drive
    from gatedloop.checkpoints.ledger import SCHEMA, postgres_statements

    schema = SCHEMA.replace(APPROVALS_TABLE, OLD_APPROVALS_TABLE)
    postgres = store.name == "postgres"
    if postgres:
        import psycopg

        conn: Any = psycopg.connect(store.db, autocommit=True)
        for statement in postgres_statements(schema):
            conn.execute(statement)
    else:
        import sqlite3

        conn = sqlite3.connect(store.db, isolation_level=None)
        conn.executescript(schema)
    p = "%s" if postgres else "?"

    def execute(query: str, params: Any, fetch: bool) -> list[Any]:
        cursor = conn.execute(query, tuple(params))
        return list(cursor.fetchall()) if fetch else []

    try:
        drive(execute, begin_chain(p, postgres))
        rows = []
        for reviewer, decision in (("bo", "approve"), ("limit:email", "sent_back")):
            [row] = execute(
                "INSERT INTO gatedloop_approvals (thread_id, call_id, tool, args_digest, reviewer, roles, decision, at)"
                f" VALUES ({', '.join([p] * 8)}) RETURNING {', '.join(OLD_COLUMNS)}",
                ("t", "c1", "email", "d1", reviewer, "[]", decision, 1.5),
                True,
            )
            rows.append({**dict(zip(OLD_COLUMNS, row, strict=True)), "at": 1.5})
        # the only writer, so no chain lock (which today's code takes through a function this schema predates)
        drive(execute, append(p, False, [("gatedloop_approvals", row) for row in rows], None))
        chained = execute("SELECT content_hash FROM gatedloop_chain WHERE seq > 1 ORDER BY seq", (), True)
    finally:
        conn.close()
    return rows, [row[0] for row in chained]


def test_an_approvals_table_from_before_rounds_is_upgraded_and_its_chain_still_verifies(
    backend: Backend, tmp_path: Path
):
    """A database whose approvals table has the old UNIQUE key (no round) and whose chain hashed its rows without
    one: opened for writing, the table gains `sent_back_round` (0 for the old rows, which keep their seq) and the
    key with it; the chain verifies, so bo may approve again after the send-back (a replay of it counts once), and
    the new row's round is covered by the chain (an edit of it is found)."""
    from gatedloop.checkpoints.chain import Report
    from gatedloop.checkpoints.evidence import ApprovalRecord

    with isolated(backend) as store:
        old, chained = _make_old_ledger(store)
        assert chained == [_old_content_hash(row) for row in old]
        if store.name == "sqlite":  # read-only, before any upgrade: read with the column, as 0; nothing changed
            from gatedloop.checkpoints.sqlite import open_sqlite_readonly

            with open_sqlite_readonly(store.db) as saver:
                assert [a.sent_back_round for a in saver.ledger.approvals("t", ["c1"])] == [0, 0]
                assert saver.ledger.verify_chain().ok
        ledger = store.ledger()
        try:
            assert [(a.reviewer, a.sent_back_round) for a in ledger.approvals("t", ["c1"])] == [
                ("bo", 0),
                ("limit:email", 0),
            ]
            report: Report = ledger.verify_chain()
            assert report.ok, report.problems
            again = ApprovalRecord("c1", "email", "d1", "bo", frozenset(), "approve", 2.5)
            ledger.record_approvals("t", [again])
            ledger.record_approvals("t", [again])  # a replay in the same round
            rows = [(a.reviewer, a.decision, a.sent_back_round) for a in ledger.approvals("t", ["c1"])]
            assert rows == [("bo", "approve", 0), ("limit:email", "sent_back", 0), ("bo", "approve", 1)]
            assert ledger.verify_chain().ok
            top = max(int(r["seq"]) for r in ledger.chained_rows("gatedloop_approvals"))
            assert top == 3  # the old rows kept their seq, and the next one follows them
            ledger._write_plain("UPDATE gatedloop_approvals SET sent_back_round=7 WHERE seq=3", ())
            [problem] = ledger.verify_chain().problems
            assert "gatedloop_approvals [3]" in problem and "edited" in problem
        finally:
            ledger.close()
        if store.name == "sqlite":
            verified = run_cli(["--db", store.db, "audit", "verify"], {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
            assert verified.returncode == 1 and "gatedloop_approvals [3]" in verified.stdout + verified.stderr
