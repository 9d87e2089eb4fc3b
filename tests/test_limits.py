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
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
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
