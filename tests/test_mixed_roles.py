"""A request that mixes roles is decided call by call (issue 51; invariant 15), on a real SQLite file.

The newcomer's case: one turn proposes `refund` (approvers `finance`) and `send_email` (approvers `support`). Each
reviewer decides her own call, by `tool_call_id`; the request keeps its id while its calls are decided; no write
runs before every call of the request is decided; an answer that names a call its sender may not decide is
refused whole and records nothing.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run_cli
from hypothesis import event, given, settings
from hypothesis import strategies as st
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.ledger_for import ledger_for
from gatedloop.graph import InvalidDecision, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import CallContext, ToolPolicy

CFG = {"configurable": {"thread_id": "t1"}}
RAM = "/dev/shm" if Path("/dev/shm").is_dir() else None
"""A real SQLite file, in memory where the machine has a tmpfs (the property's examples skip a disk sync each)."""
ANA = CallContext(user_id="ana", roles={"staff"})
BO = CallContext(user_id="bo", roles={"finance"})
SUE = CallContext(user_id="sue", roles={"support"})
CY = CallContext(user_id="cy", roles={"finance"})
REFUND = {"order": "A-1001", "amount": 40}
EMAIL = {"to": "ana@example.com", "body": "refunded"}


class Desk:
    """The two writes, each recording its real effect in order."""

    def __init__(self) -> None:
        self.effects: list[str] = []

        @tool
        def refund(order: str, amount: float) -> str:
            """Refund an order (write)."""
            self.effects.append(f"refund {order}")
            return "refunded"

        @tool
        def send_email(to: str, body: str) -> str:
            """Send an email (write)."""
            self.effects.append(f"email {to}")
            return "sent"

        self.tools = [refund, send_email]


def _graph(saver: Any, desk: Desk, refund_quorum: int = 1) -> Any:
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    policies = {
        "refund": ToolPolicy(
            effect="write", approval="always", approvers=frozenset({"finance"}), approvals_required=refund_quorum
        ),
        "send_email": ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"})),
    }
    return build_graph(model, desk.tools, policies=policies, checkpointer=saver)


def _approve(*call_ids: str) -> dict[str, Any]:
    return {"decisions": [{"type": "approve", "tool_call_id": c} for c in call_ids]}


def _pending(out: dict[str, Any]) -> dict[str, Any]:
    return out["__interrupt__"][0].value


def test_each_reviewer_decides_her_own_call_and_the_writes_run_once_after_the_last(tmp_path: Path):
    desk = Desk()
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = _graph(saver, desk)
        first = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))
        assert [a["approvers"] for a in first["action_requests"]] == [["finance"], ["support"]]

        after_bo = _pending(graph.invoke(Command(resume=_approve("r1")), CFG, context=BO))
        assert desk.effects == []  # the email is not decided yet: nothing of the request runs
        assert "error" not in after_bo and after_bo["request_id"] == first["request_id"]
        assert [a["tool_call_id"] for a in after_bo["action_requests"]] == ["e1"]
        assert after_bo["decided"] == [
            {"tool_call_id": "r1", "name": "refund", "decision": "approve", "decided_by": ["bo"]}
        ]

        out = graph.invoke(Command(resume=_approve("e1")), CFG, context=SUE)
    assert desk.effects == ["refund A-1001", "email ana@example.com"]  # proposal order, each once
    assert out["status"] == "completed"
    assert_each_call_answered_once(out["messages"])


def test_each_calls_description_says_who_may_decide_it_and_which_calls_are_already_decided(tmp_path: Path):
    """For a client that shows only `description` (Agent Chat UI): the roles of each call, and after bo's answer
    the refund, no longer among the actions, named as decided by him in the email's description."""
    desk = Desk()
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(
            ScriptedChatModel(script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")])]),
            desk.tools,
            policies={
                "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"})),
                "send_email": ToolPolicy(effect="write", approval="always"),
            },
            checkpointer=saver,
        )
        first = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))
        refund, email = (a["description"].splitlines() for a in first["action_requests"])
        assert "Approvers: one of the roles finance" in refund and "Approvers: any reviewer" in email
        after_bo = _pending(graph.invoke(Command(resume=_approve("r1")), CFG, context=BO))
    [described] = [a["description"] for a in after_bo["action_requests"]]
    assert (
        "Already decided in this request: refund (approve by bo); nothing of it runs before every call is decided"
        in described.splitlines()
    )


def test_an_answer_naming_a_call_its_sender_may_not_decide_is_refused_whole_and_records_nothing(tmp_path: Path):
    desk = Desk()
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = _graph(saver, desk)
        graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA)
        refused = _pending(graph.invoke(Command(resume=_approve("r1", "e1")), CFG, context=BO))
        assert "send_email (e1): deciding this call needs one of the roles ['support']" in refused["error"]
        assert [a["tool_call_id"] for a in refused["action_requests"]] == ["r1", "e1"] and "decided" not in refused
        decisions = [r for r in ledger_for(saver).audit("t1") if r["event"].startswith("decision")]
        assert decisions == []  # bo's refund approval was part of the refused answer: not recorded
        positional = _pending(graph.invoke(Command(resume={"decisions": [{"type": "approve"}] * 2}), CFG, context=BO))
        assert "needs one of the roles ['support']" in positional["error"] and desk.effects == []


def test_a_reject_of_one_call_waits_for_the_other_call_and_the_model_sees_both_answers(tmp_path: Path):
    desk = Desk()
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = _graph(saver, desk)
        graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA)
        reject = {"decisions": [{"type": "reject", "tool_call_id": "r1", "message": "not eligible"}]}
        waiting = _pending(graph.invoke(Command(resume=reject), CFG, context=BO))
        assert waiting["decided"][0]["decision"] == "reject" and desk.effects == []
        out = graph.invoke(Command(resume=_approve("e1")), CFG, context=SUE)
    assert desk.effects == ["email ana@example.com"]
    answers = {m.tool_call_id: m.text for m in out["messages"] if isinstance(m, ToolMessage)}
    assert json.loads(answers["r1"])["error"] == {
        "type": "rejected_by_reviewer",
        "message": "not eligible",
        "retryable": False,
    }
    assert answers["e1"] == "sent"
    assert out["status"] == "completed"


@pytest.mark.parametrize("order", [("bo", "sue", "cy"), ("sue", "cy", "bo"), ("cy", "bo", "sue")])
def test_a_quorum_of_two_on_one_call_and_one_on_the_other_is_decided_in_any_order(tmp_path: Path, order):
    desk = Desk()
    reviewers = {"bo": (BO, "r1"), "cy": (CY, "r1"), "sue": (SUE, "e1")}
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = _graph(saver, desk, refund_quorum=2)
        graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA)
        self_approval = _pending(
            graph.invoke(Command(resume=_approve("r1")), CFG, context=CallContext(user_id="ana", roles={"finance"}))
        )
        assert "error" in self_approval  # the requester never counts toward her own call
        for index, name in enumerate(order):
            context, call_id = reviewers[name]
            out = graph.invoke(Command(resume=_approve(call_id)), CFG, context=context)
            if index < 2:
                assert desk.effects == [] and "error" not in _pending(out)
    assert sorted(desk.effects) == ["email ana@example.com", "refund A-1001"] and len(desk.effects) == 2
    assert out["status"] == "completed"


DESK_AGENT = textwrap.dedent(
    '''
    """A support desk: a refund for `finance` and an email for `support`, proposed in one turn."""
    import json
    import os

    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    from gatedloop.graph import InvalidDecision, build_graph, runs
    from gatedloop.graph.scripted import ScriptedChatModel, call, reply
    from gatedloop.tools import ToolPolicy


    def _effect(text):
        with open(os.environ["DESK_EFFECTS"], "a") as effects:
            effects.write(text + "\\n")


    @tool
    def refund(order: str, amount: float) -> str:
        """Refund an order."""
        _effect(f"refund {order}")
        return "refunded"


    @tool
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        _effect(f"email {to}")
        return "sent"


    def responder(messages):
        if isinstance(messages[-1], ToolMessage):
            return reply("refunded and emailed")
        return reply(calls=[call("refund", {"order": "A-1001", "amount": 40}, "r1"),
                            call("send_email", {"to": "ana@example.com", "body": "refunded"}, "e1")])


    POLICIES = {
        "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}), approval_ttl_s=3600),
        "send_email": ToolPolicy(
            effect="write", approval="always", approvers=frozenset({"support"}), approval_ttl_s=3600
        ),
    }
    graph = build_graph(ScriptedChatModel(responder=responder), [refund, send_email], policies=POLICIES, name="desk")
    '''
)


Gatedloop = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def desk_cli(tmp_path: Path) -> Gatedloop:
    """`gatedloop --db runs.sqlite --graph desk_agent:graph ARGS` in process, asserting its exit `code`; each write's
    effect lands in `effects.txt` beside the database."""
    (tmp_path / "desk_agent.py").write_text(DESK_AGENT)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GATEDLOOP_")}
    env.update(GATEDLOOP_MODEL="demo", OPENAI_API_KEY="", DESK_EFFECTS=str(tmp_path / "effects.txt"))

    def gatedloop(*args: str, code: int) -> subprocess.CompletedProcess[str]:
        sys.modules.pop("desk_agent", None)
        ran = run_cli(["--db", "runs.sqlite", "--graph", "desk_agent:graph", *args], env, cwd=tmp_path)
        assert ran.returncode == code, ran.stdout + ran.stderr
        return ran

    return gatedloop


def test_the_cli_decides_the_calls_the_reviewer_may_decide_and_says_who_else_is_needed(tmp_path: Path, desk_cli):
    effects = tmp_path / "effects.txt"
    asked = desk_cli("--user", "ana", "run", "refund A-1001 and email", "--thread", "t1", code=3)
    assert "waiting for finance: refund; support: send_email" in asked.stdout
    request = re.search(r"--request (\S+)", asked.stdout).group(1)  # type: ignore[union-attr]
    answer = ("resume", "t1", "--request", request, "--approve")

    bo = desk_cli("--user", "bo", "--roles", "finance", *answer, code=3)
    assert not effects.exists()  # the refund waits for the email's decision
    assert "refund   decided: approve by bo" in bo.stdout and "waiting for support: send_email" in bo.stdout
    desk_cli("--user", "cy", "--roles", "staff", *answer, code=6)  # decides none of them: refused as before
    desk_cli("--user", "sue", "--roles", "support", *answer, code=0)
    assert effects.read_text().splitlines() == ["refund A-1001", "email ana@example.com"]


def test_the_cli_extends_the_calls_the_reviewer_may_decide_and_says_which_keep_their_deadline(desk_cli):
    asked = desk_cli("--user", "ana", "run", "refund A-1001 and email", "--thread", "t1", code=3)
    request = re.search(r"--request (\S+)", asked.stdout).group(1)  # type: ignore[union-attr]
    extend = ("extend", "t1", "--request", request)
    told = desk_cli("--user", "bo", "--roles", "finance", *extend, code=0).stdout.splitlines()
    assert told[0].startswith("refund (r1) of thread t1 may be decided until ")
    assert told[1:] == ["  send_email (e1) keeps its deadline: deciding this call needs one of the roles ['support']"]
    record = json.loads(desk_cli("--json", "--user", "sue", "--roles", "support", *extend, code=0).stdout)
    assert record["type"] == "extend" and record["kept"] == {
        "refund (r1)": "deciding this call needs one of the roles ['finance']"
    }
    refused = desk_cli("--user", "cy", "--roles", "staff", *extend, code=6)
    assert "refund (r1): deciding this call needs one of the roles ['finance']" in refused.stdout + refused.stderr


def test_threads_and_show_say_what_a_request_waits_for_per_role(desk_cli):
    """`gatedloop threads` and `show` name who each undecided call waits for, not only "waiting for approval"."""
    asked = desk_cli("--user", "ana", "run", "refund A-1001 and email", "--thread", "t1", code=3)
    listed = desk_cli("threads", code=0).stdout
    assert "waiting for finance: refund; support: send_email" in listed
    request = re.search(r"--request (\S+)", asked.stdout).group(1)  # type: ignore[union-attr]
    desk_cli("--user", "bo", "--roles", "finance", "resume", "t1", "--request", request, "--approve", code=3)
    assert "waiting for support: send_email" in desk_cli("threads", code=0).stdout
    shown = desk_cli("show", "t1", code=0).stdout.splitlines()
    assert shown[-1] == "status: waiting (waiting for support: send_email)"
    assert any("approved by bo" in line for line in shown)


ROLES = {
    "bo": BO,
    "cy": CY,
    "sue": SUE,
    "dan": CallContext(user_id="dan", roles={"ops"}),
    "ana": CallContext(user_id="ana", roles={"finance", "support"}),
}
RULE = {"r1": "finance", "e1": "support"}
steps = st.lists(
    st.tuples(
        st.sampled_from(sorted(ROLES)),
        st.sampled_from([("r1",), ("e1",), ("r1", "e1"), ("e1", "r1"), None]),
        st.sampled_from(["approve", "approve", "reject", "edit"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=40, deadline=None)
@given(answers=steps)
def test_partial_answers_never_run_a_write_early_nor_count_a_decision_its_rule_excludes(answers):
    """Random reviewers answer random subsets of the mixed request (the requester ana holds both roles): after each
    answer, a write ran only once every call of the request had a decision from someone its rule admits (never
    ana), each write ran at most once, and an answer naming a call its sender may not decide recorded nothing."""
    desk = Desk()
    with tempfile.TemporaryDirectory(dir=RAM) as folder, open_sqlite(Path(folder) / "runs.sqlite") as saver:
        graph = _graph(saver, desk)
        out = graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA)
        ledger = ledger_for(saver)
        for actor, named, kind in answers:
            if "__interrupt__" not in out:
                break
            pending = [a["tool_call_id"] for a in _pending(out)["action_requests"]]
            ids = pending if named is None else [c for c in named if c in pending]
            if not ids:
                continue
            before = _decisions(ledger)
            out = graph.invoke(Command(resume=_answer(kind, ids, named is None)), CFG, context=ROLES[actor])
            allowed = actor != "ana" and all(RULE[c] in ROLES[actor].roles for c in ids)
            after = _decisions(ledger)
            if not allowed:
                assert after == before, (actor, ids)
            assert all(who != "ana" and RULE[call] in ROLES[who].roles for call, who in after)
            decided = {call for call, _ in after}
            assert not desk.effects or decided == {"r1", "e1"}, (desk.effects, after)
            assert len(desk.effects) == len(set(desk.effects))
        event(f"{len(desk.effects)} write(s) ran")


def _answer(kind: str, ids: list[str], positional: bool) -> dict[str, Any]:
    def one(call_id: str) -> dict[str, Any]:
        decision: dict[str, Any] = {"type": kind}
        if kind == "edit":
            args = {**REFUND, "amount": 10} if call_id == "r1" else {**EMAIL, "body": "edited"}
            decision["edited_action"] = {"name": "refund" if call_id == "r1" else "send_email", "args": args}
        return decision if positional else {**decision, "tool_call_id": call_id}

    return {"decisions": [one(c) for c in ids]}


def _decisions(ledger: Any) -> list[tuple[str, str]]:
    return sorted((r["call_id"], r["actor"]) for r in ledger.audit("t1") if r["event"].startswith("decision"))


def test_a_call_that_expires_while_another_is_decided_is_answered_expired_and_the_decided_one_runs(tmp_path: Path):
    desk = Desk()
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    policies = {
        "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"})),
        "send_email": ToolPolicy(
            effect="write", approval="always", approvers=frozenset({"support"}), approval_ttl_s=2.0
        ),
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, desk.tools, policies=policies, checkpointer=saver)
        graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA)
        waiting = _pending(graph.invoke(Command(resume=_approve("r1")), CFG, context=BO))
        assert [a["expires_at"] is not None for a in waiting["action_requests"]] == [True] and desk.effects == []
        time.sleep(2.2)  # past the email's time to live, which a loaded machine needs to be roomy
        out = graph.invoke(Command(resume=_approve("e1")), CFG, context=SUE)
    assert desk.effects == ["refund A-1001"]
    answers = {m.tool_call_id: m.text for m in out["messages"] if isinstance(m, ToolMessage)}
    assert json.loads(answers["e1"])["error"]["type"] == "approval_expired" and answers["r1"] == "refunded"
    assert out["status"] == "completed"


def test_each_reviewer_extends_the_calls_she_may_decide_and_the_others_keep_their_deadlines(tmp_path: Path, desk_cli):
    """In a request of a refund (finance) and a letter (support), both expiring, bo extends the refund alone and is
    told the letter keeps its deadline and why; the request's notice stays open until the refund's new deadline. Past
    the letter's deadline, bo's approval of the refund still counts and the letter is answered expired. ana, who may
    decide neither, extends nothing and is told why for each; a second extension by bo is refused."""
    desk = Desk()
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    ttl = 3.0  # the refund's approval comes 0.2 s past the letter's deadline and has ttl / 2 - 0.2 s left on its own
    policies = {
        "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}), approval_ttl_s=ttl),
        "send_email": ToolPolicy(
            effect="write", approval="always", approvers=frozenset({"support"}), approval_ttl_s=ttl
        ),
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, desk.tools, policies=policies, checkpointer=saver)
        request = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))
        first = min(a["expires_at"] for a in request["action_requests"])
        with pytest.raises(InvalidDecision) as refused:
            runs.extend(graph, "t1", context=ANA, request_id=request["request_id"])
        assert "refund (r1): deciding this call needs one of the roles ['finance']" in str(refused.value)
        assert "send_email (e1): deciding this call needs one of the roles ['support']" in str(refused.value)
        time.sleep(ttl / 2)
        extended = runs.extend(graph, "t1", context=BO, request_id=request["request_id"])
        assert extended.extended == ["refund (r1)"] and extended.until > first + ttl / 3
        assert extended.kept == {"send_email (e1)": "deciding this call needs one of the roles ['support']"}
        with sqlite3.connect(tmp_path / "runs.sqlite") as conn:
            query = "SELECT expires_at FROM gatedloop_outbox WHERE kind = 'request' AND thread_id = 't1'"
            [(notice_expires,)] = conn.execute(query).fetchall()
        assert notice_expires == extended.until > first  # open until its last deadline: the refund's, now extended
        with pytest.raises(InvalidDecision, match="bo extended this request already"):
            runs.extend(graph, "t1", context=BO, request_id=request["request_id"])
        time.sleep(max(0.0, first + 0.2 - time.time()))  # past the letter's deadline, within the refund's new one
        out = graph.invoke(Command(resume=_approve("r1")), CFG, context=BO)
    assert desk.effects == ["refund A-1001"]
    answers = {m.tool_call_id: m.text for m in out["messages"] if isinstance(m, ToolMessage)}
    assert json.loads(answers["e1"])["error"]["type"] == "approval_expired" and answers["r1"] == "refunded"


def test_the_inbox_tells_a_reviewer_which_calls_her_extension_moved_and_which_keep_their_deadline(tmp_path: Path):
    from contextlib import contextmanager

    from starlette.testclient import TestClient

    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox.identity import Reviewer, Sessions

    desk = Desk()
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    policies = {
        name: ToolPolicy(effect="write", approval="always", approvers=frozenset({role}), approval_ttl_s=600)
        for name, role in (("refund", "finance"), ("send_email", "support"))
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, desk.tools, policies=policies, checkpointer=saver)
        request = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))

        @contextmanager
        def backend() -> Any:
            yield InboxBackend.over(graph, saver)

        bo = Reviewer("bo", frozenset({"finance"}), "fixed")
        with TestClient(create_app(backend, Sessions(None, bo))) as client:
            csrf = client.get("/inbox").text.split('name="csrf" value="')[1].split('"')[0]
            form = {"csrf": csrf, "thread_id": "t1", "request_id": request["request_id"]}
            shown = client.post("/inbox/extend", data=form).text
    assert "Thread t1: extended refund (r1) until " in shown
    assert "send_email (e1) keeps its deadline: deciding this call needs one of the roles [&#39;support&#39;]" in shown


def test_escalation_is_per_call_a_backup_role_decides_only_the_call_whose_policy_names_it(tmp_path: Path):
    """The refund escalates to `ops` after 2 s (0.5 s passed before the first answer on a loaded machine); the
    letter has no backup. Before the escalation olga (ops) may decide neither call; after it she may decide the
    refund, alone, and an answer of hers naming the letter is refused whole, recording nothing; sue then decides
    the letter and both writes run once."""
    desk = Desk()
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    olga = CallContext(user_id="olga", roles={"ops"})
    policies = {
        "refund": ToolPolicy(
            effect="write",
            approval="always",
            approvers=frozenset({"finance"}),
            escalate_after_s=2,
            backup_approvers=frozenset({"ops"}),
        ),
        "send_email": ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"})),
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, desk.tools, policies=policies, checkpointer=saver)
        request = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))
        refund = next(a for a in request["action_requests"] if a["tool_call_id"] == "r1")
        assert refund["backup_approvers"] == ["ops"]
        refused = _pending(graph.invoke(Command(resume=_approve("r1")), CFG, context=olga))
        assert "(after 2 s waiting, or one of ['ops'])" in refused["error"]
        time.sleep(max(0.0, refund["escalates_at"] - time.time()) + 0.1)
        refused = _pending(graph.invoke(Command(resume=_approve("r1", "e1")), CFG, context=olga))
        assert "send_email (e1): deciding this call needs one of the roles ['support']" in refused["error"]
        assert refused.get("decided") in (None, [])  # refused whole: the refund is not decided either
        waiting = _pending(graph.invoke(Command(resume=_approve("r1")), CFG, context=olga))
        assert [a["tool_call_id"] for a in waiting["action_requests"]] == ["e1"] and desk.effects == []
        out = graph.invoke(Command(resume=_approve("e1")), CFG, context=SUE)
        decisions = [(e["actor"], e["call_id"]) for e in saver.ledger.audit("t1") if e["event"] == "decision"]
    assert desk.effects == ["refund A-1001", "email ana@example.com"] and out["status"] == "completed"
    assert sorted(decisions) == [("olga", "r1"), ("sue", "e1")]


def test_a_request_stays_open_for_its_other_calls_after_one_of_them_expires(tmp_path: Path):
    """The letter expires after 1 s, the refund after 600. Past the letter's deadline the request is not closed:
    the deliverer still counts it open (its reminder goes out), the card shows the refund's deadline and no
    "(extended)", and the outbox row stays open until the refund's deadline. Once the refund is decided (and the
    letter answered expired in the same run) it is closed."""
    from gatedloop.checkpoints.outbox import notification_id
    from gatedloop.inbox.notify import closed_reason
    from gatedloop.inbox.pending import PendingRequests

    desk = Desk()
    model = ScriptedChatModel(
        script=[reply(calls=[call("refund", REFUND, "r1"), call("send_email", EMAIL, "e1")]), reply("done")]
    )
    policies = {
        "refund": ToolPolicy(effect="write", approval="always", approvers=frozenset({"finance"}), approval_ttl_s=600),
        "send_email": ToolPolicy(effect="write", approval="always", approvers=frozenset({"support"}), approval_ttl_s=1),
    }
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build_graph(model, desk.tools, policies=policies, checkpointer=saver)
        request = _pending(graph.invoke({"messages": [("user", "refund A-1001 and email")]}, CFG, context=ANA))
        deadline = {a["tool_call_id"]: a["expires_at"] for a in request["action_requests"]}
        notice = saver.ledger.notification(notification_id("t1", request["request_id"], "request"))
        assert notice is not None and notice.expires_at == deadline["r1"]  # open until the last call's deadline
        assert notice.payload["expires_at"] == deadline["e1"]  # the first deadline a reviewer faces
        time.sleep(max(0.0, deadline["e1"] - time.time()) + 0.2)
        assert closed_reason(saver.ledger, notice, time.time()) is None  # the refund still waits for finance
        view = PendingRequests(graph, saver.ledger, lambda: ["t1"], desk.tools, policies).get("t1")
        assert view is not None and view.expires_at == deadline["r1"] and not view.extended
        graph.invoke(Command(resume=_approve("r1")), CFG, context=BO)
        assert closed_reason(saver.ledger, notice, time.time()) == "decided before delivery"
    assert desk.effects == ["refund A-1001"]
