"""Reviewer telemetry (issue 54): `gatedloop stats` counts, per tool and per reviewer, the requests asked, what was
decided and how fast, the expired ones, and flags the reviewer who approves everything in seconds; on SQLite and
Postgres (a schema of its own per test: stats read the whole ledger).

The history is scripted through the ledger's own API (each decision timed from its request's registration, as the
gate records it) plus one approval driven through the real graph, so the rows read are the ones gatedloop writes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grants_app
import pytest
from backends import Backend, isolated
from cli_in_process import run_cli
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.evidence import ApprovalRecord, NewCall
from gatedloop.checkpoints.review_stats import (
    RUBBER_STAMP_MAX_MEDIAN_S,
    RUBBER_STAMP_MIN_APPROVAL_RATE,
    RUBBER_STAMP_MIN_DECISIONS,
    p90,
)
from gatedloop.graph import CallContext, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy
from gatedloop.tools.usage import UsageLimit

ANA = CallContext("ana", frozenset())


class History:
    """Requests and decisions written as the gate writes them, each decision `waited_s` after its request."""

    def __init__(self, ledger: Any):
        self.ledger = ledger
        self.count = 0

    def ask(self, tool_name: str) -> tuple[str, str, float]:
        self.count += 1
        thread_id, call_id = f"t{self.count}", f"c{self.count}"
        new = NewCall(call_id, tool_name, "digest", "ask", ANA, "pin")
        record = self.ledger.register_calls(thread_id, [new])[call_id]
        return thread_id, call_id, record.requested_at

    def decide(self, tool_name: str, reviewer: str, decision: str, waited_s: float) -> tuple[str, str, float]:
        asked = self.ask(tool_name)
        self.again(asked, tool_name, reviewer, decision, waited_s)
        return asked

    def again(
        self, asked: tuple[str, str, float], tool_name: str, reviewer: str, decision: str, waited_s: float
    ) -> None:
        """Another record on a request already asked."""
        thread_id, call_id, asked_at = asked
        record = ApprovalRecord(call_id, tool_name, "digest", reviewer, frozenset(), decision, asked_at + waited_s)
        self.ledger.record_approvals(thread_id, [record])

    def expire(self, tool_name: str) -> None:
        thread_id, call_id, _ = self.ask(tool_name)
        self.ledger.record(thread_id, call_id, "approval_expired", {"tool": tool_name})


@tool
def refund(order_id: str) -> str:
    """Refund an order (a gated write)."""
    return f"refunded {order_id}"


def one_refund(messages: list[BaseMessage]) -> AIMessage:
    if isinstance(messages[-1], ToolMessage):
        return reply("done")
    return reply(calls=[call("refund", {"order_id": "A-1"}, "refund-1")])


def approved_through_the_graph(saver: Any) -> None:
    policies = {"refund": ToolPolicy(effect="write", approval="always")}
    graph = build_graph(ScriptedChatModel(responder=one_refund), [refund], policies=policies, checkpointer=saver)
    runs.start(graph, "real", "refund A-1", context=ANA)
    out = runs.resume(graph, "real", {"decisions": [{"type": "approve"}]}, context=CallContext("cy", frozenset()))
    assert out["status"] == "completed"


def stats(db: str, *extra: str) -> dict[str, Any]:
    done = run_cli(["--db", db, "stats", "--json", *extra], {})
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    return json.loads(line)


def test_stats_count_requests_decisions_and_expiries_and_flag_the_rubber_stamper(backend: Backend):
    with isolated(backend) as store:
        with store.open() as saver:
            history = History(saver.ledger)
            history.decide("refund", "old", "reject", 100.0)
            time.sleep(0.01)
            window = time.time()
            for _ in range(RUBBER_STAMP_MIN_DECISIONS + 1):
                stamped = history.decide("refund", "rubber", "approve", 1.5)
            for kind, waited in [("approve", 40.0), ("approve", 60.0), ("reject", 20.0), ("edit", 90.0)]:
                history.decide("delete_user", "careful", kind, waited)
            history.decide("refund", "careful", "respond", 30.0)
            for _ in range(5):
                history.decide("refund", "quick", "approve", 1.0)  # fast, but too few to mean anything
            history.again(stamped, "refund", "careful", "extend", 1.0)  # an extension is no decision
            history.expire("delete_user")
            history.ask("delete_user")  # still waiting
            approved_through_the_graph(saver)
        everything = stats(store.db)
        recent = stats(store.db, "--since", str(window))
        human = run_cli(["--db", store.db, "stats", "--since", str(window)], {})
    assert recent["since"] == window and everything["since"] is None
    assert recent["thresholds"] == {
        "min_decisions": RUBBER_STAMP_MIN_DECISIONS,
        "min_approval_rate": RUBBER_STAMP_MIN_APPROVAL_RATE,
        "max_median_s": RUBBER_STAMP_MAX_MEDIAN_S,
    }
    tools = {row["tool"]: row for row in recent["tools"]}
    assert {k: tools["delete_user"][k] for k in ("asked", "decided", "approved", "edited", "rejected", "expired")} == {
        "asked": 6,
        "decided": 4,
        "approved": 2,
        "edited": 1,
        "rejected": 1,
        "expired": 1,
    }
    assert tools["delete_user"]["approval_rate"] == 0.5
    assert tools["delete_user"]["median_s"] == pytest.approx(50.0, abs=0.01)
    assert tools["delete_user"]["p90_s"] == pytest.approx(90.0, abs=0.01)
    refunds = tools["refund"]
    assert (refunds["asked"], refunds["decided"], refunds["decisions"]) == (28, 28, 28)  # 21 + 1 + 5 + the real one
    assert (refunds["approved"], refunds["responded"], refunds["expired"]) == (27, 1, 0)
    reviewers = {row["reviewer"]: row for row in recent["reviewers"]}
    assert set(reviewers) == {"rubber", "careful", "quick", "cy"}
    assert [name for name, row in reviewers.items() if row["rubber_stamp"]] == ["rubber"]
    rubber = reviewers["rubber"]
    assert (rubber["decisions"], rubber["approval_rate"], rubber["tools"]) == (21, 1.0, ["refund"])
    assert rubber["median_s"] == pytest.approx(1.5, abs=0.01)
    careful = reviewers["careful"]
    assert (careful["decisions"], careful["approved"], careful["tools"]) == (5, 2, ["delete_user", "refund"])
    assert reviewers["cy"]["decisions"] == 1  # the approval the graph recorded
    assert {row["reviewer"] for row in everything["reviewers"]} == {"old", *reviewers}
    assert {row["tool"]: row["asked"] for row in everything["tools"]}["refund"] == 29
    flagged = [line for line in human.stdout.splitlines() if "rubber stamp?" in line]
    assert [line.split()[0] for line in flagged] == ["rubber"], human.stdout


def test_stats_of_an_empty_database_say_so_and_a_bad_since_is_a_usage_error(tmp_path: Path):
    db = str(tmp_path / "runs.sqlite")
    with open_sqlite(db):
        pass
    done = run_cli(["--db", db, "stats"], {})
    assert done.returncode == 0 and "none in" in done.stdout, done
    assert stats(db, "--since", "7d")["tools"] == []
    bad = run_cli(["--db", db, "stats", "--since", "last week"], {})
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_p90_is_a_time_some_decision_took():
    assert p90([1.0]) == 1.0
    assert p90([float(n) for n in range(1, 11)]) == 9.0
    assert p90([float(n) for n in range(1, 12)]) == 10.0


# pay: a grantable gated write, at most 2 calls per requester (a person past it) and 500 paid in all (refused past it);
# email: not gated, at most 1 per requester (a person past it).
LIMITED = {
    **grants_app.POLICIES,
    "pay": ToolPolicy(
        effect="write",
        approvers=grants_app.FINANCE,
        grantable=True,
        limits=[
            UsageLimit(at_most=2, per="requester"),
            UsageLimit(at_most=500, sums="amount", over="refuse"),
        ],
    ),
    "email": ToolPolicy(effect="write", approval="never", limits=[UsageLimit(at_most=1, per="requester")]),
}


def test_stats_count_granted_calls_apart_and_a_call_sent_back_once_as_asked(tmp_path: Path):
    """A call a grant approved is `granted`, not asked nor anyone's decision; a call a limit or a lapsed grant sent
    back to a person is asked once (also when it was not gated) and counted in `sent_back`, and the decision after
    it is timed from the send-back; an approval a limit refused is still its reviewer's decision (`limit_refused`
    says nothing ran)."""
    db = str(tmp_path / "runs.sqlite")
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(responder=grants_app.responder),
            grants_app.make_tools(Effects(tmp_path / "effects.sqlite")),
            policies=LIMITED,
            checkpointer=saver,
        )
        bo, cy, dee = grants_app.BO, grants_app.CY, grants_app.DEE
        approve = {"decisions": [{"type": "approve"}]}

        runs.grant(graph, "pay", context=bo, where=["to=bo"], uses=1, expires_in_s=600)
        assert runs.start(graph, "granted", "pay bo 50", context=ANA)["status"] == "completed"
        runs.start(graph, "asked", "pay cy 10", context=ANA)
        assert runs.resume(graph, "asked", approve, context=bo)["status"] == "completed"
        runs.start(graph, "over", "pay cy 20", context=ANA)  # ana's third payment: her limit sends it back
        time.sleep(0.3)
        assert "__interrupt__" in runs.resume(graph, "over", approve, context=cy)
        assert runs.resume(graph, "over", approve, context=bo)["status"] == "completed"  # past the limit, by bo
        runs.start(graph, "refused", "pay cy 450", context=dee)  # 530 paid in all: refused, whoever approved it
        assert "limit_exceeded" in str(runs.resume(graph, "refused", approve, context=bo)["messages"][-2].content)
        runs.grant(graph, "pay", context=bo, where=["to=bo"], uses=1, expires_in_s=600)
        runs.start(graph, "lapsed", "pay bo 5; pay bo 6", context=dee)  # one use for two: the second goes back
        assert runs.resume(graph, "lapsed", approve, context=cy)["status"] == "completed"
        assert runs.start(graph, "mail", "email x", context=ANA)["status"] == "completed"
        runs.start(graph, "mail-over", "email y", context=ANA)  # not gated, but past ana's limit: a person decides
        assert runs.resume(graph, "mail-over", approve, context=cy)["status"] == "completed"
        [over] = [d for d in saver.ledger.review_history().decided if d.thread_id == "over" and d.reviewer == "bo"]
        [first] = [d for d in saver.ledger.review_history().decided if d.thread_id == "over" and d.reviewer == "cy"]

    assert first.waited_s >= 0.3 and over.waited_s < 0.3  # bo was asked when the limit sent it back
    tools = {row["tool"]: row for row in stats(db)["tools"]}
    counted = ("asked", "decided", "decisions", "approved", "sent_back", "granted", "limit_refused", "expired")
    assert {k: tools["pay"][k] for k in counted} == {
        "asked": 4,  # asked, over, refused and lapsed's second call: each once
        "decided": 4,
        "decisions": 5,  # over was approved twice: by cy, then (sent back) by bo
        "approved": 5,
        "sent_back": 2,  # over (a limit) and lapsed's second call (its grant was used up)
        "granted": 2,  # granted and lapsed's first call
        "limit_refused": 1,
        "expired": 0,
    }
    assert {k: tools["email"][k] for k in counted} == {
        "asked": 1,
        "decided": 1,
        "decisions": 1,
        "approved": 1,
        "sent_back": 1,
        "granted": 0,
        "limit_refused": 0,
        "expired": 0,
    }
    shown = run_cli(["--db", db, "stats"], {}).stdout.splitlines()
    header, pay = shown[2], next(line for line in shown if line.startswith("pay "))
    assert header.endswith("expired  sent back  granted  limit refused"), header
    assert pay.split()[-4:] == ["0", "2", "2", "1"], pay
