"""Answers sent at once to one request (issue 54): each is told what became of it. One decides (`runs.resume`
returns), the others learn that another answer decided it and whose (`AlreadyDecided`), or why they were refused
(`InvalidDecision`); the payment runs once. Before, the late ones read "thread is not waiting for an answer".

The answers are made to wait for the thread together: the test holds the thread's lease until every answering
thread has read the request and is waiting for the lease, then lets them in.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run_cli
from gate_app import build, effects_for

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import CallContext, InvalidDecision, PendingRequest, runs
from gatedloop.graph import pending as decide
from gatedloop.graph.runs import AlreadyDecided

ANA = CallContext("ana", frozenset({"staff"}))
BO = CallContext("bo", frozenset({"finance"}))


def answer_at_once(saver: Any, graph: Any, answers: dict[str, tuple[CallContext, Any]]) -> dict[str, str]:
    """Each answer resumed from a thread of its own, let in together; what each was told."""
    waiting = threading.Semaphore(0)
    real_lease = saver.lease

    def counted_lease(thread_id: str, *, wait_s: float = 0.0) -> Any:
        waiting.release()
        return real_lease(thread_id, wait_s=wait_s)

    told: dict[str, str] = {}

    def send(name: str, who: CallContext, answer: Any) -> None:
        try:
            out = runs.resume(graph, "t", answer, context=who, wait_s=30)
            told[name] = f"decided: {out['status']}"
        except AlreadyDecided as exc:
            told[name] = f"already decided by {', '.join(exc.decided_by)}"
        except InvalidDecision as exc:
            told[name] = f"refused: {exc}"

    saver.lease = counted_lease
    threads = [threading.Thread(target=send, args=(name, *sent)) for name, sent in answers.items()]
    with real_lease("t"):
        for thread in threads:
            thread.start()
        for _ in threads:
            assert waiting.acquire(timeout=30), "an answer never reached the thread's lease"
    for thread in threads:
        thread.join(60)
    del saver.lease
    return told


def test_of_answers_sent_at_once_one_decides_and_the_others_are_told_who_did_or_why_not(tmp_path: Path):
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver), approvers=frozenset({"finance"}))
        runs.start(graph, "t", "pay 500 to bo as c1", context=ANA)
        asked = PendingRequest.parse(runs.pending_request(graph, "t") or {})
        named = asked.answer([decide.approve(call) for call in asked.calls], "bo")  # as the CLI, inbox, Slack send
        told = answer_at_once(
            saver,
            graph,
            {
                "bo": (BO, named),
                "cy": (CallContext("cy", frozenset({"finance"})), {"decisions": [{"type": "approve"}]}),
                "dee": (CallContext("dee", frozenset({"staff"})), named),
            },
        )
        payments = effects_for(saver).rows("pay")
    decided = [name for name, outcome in told.items() if outcome.startswith("decided")]
    assert len(decided) == 1 and told[decided[0]] == "decided: completed", told
    for name, outcome in told.items():
        if name in decided:
            continue
        if outcome.startswith("refused"):
            assert name == "dee" and "finance" in outcome, told  # refused only for her role, before or after
        else:
            assert outcome == f"already decided by {decided[0]} (approve)", told
    assert told["dee"] != "decided: completed"
    assert len(payments) == 1


def test_a_late_answer_naming_a_decided_call_is_told_who_decided_it_and_what_waits_now(tmp_path: Path):
    """The first answer's run asked a new request; the late one names the old request's call: it is told that
    call was decided, by whom, and which request is pending now, and nothing of it applies to the new one."""
    with open_sqlite(tmp_path / "runs.sqlite") as saver:
        graph = build(saver, effects_for(saver))
        runs.start(graph, "t", "pay 500 to bo as c1", context=ANA)
        first = PendingRequest.parse(runs.pending_request(graph, "t") or {})
        late = {"decisions": [decide.approve(first.calls[0]) | {"tool_call_id": first.calls[0].tool_call_id}]}
        runs.resume(graph, "t", first.answer([decide.approve(c) for c in first.calls]), context=BO)
        runs.start(graph, "t", "pay 600 to cy as c2", context=ANA)
        now = (runs.pending_request(graph, "t") or {})["request_id"]
        with pytest.raises(AlreadyDecided) as caught:
            runs.resume(graph, "t", late, context=BO)
        assert "call 'c1' was already decided by another answer: bo (approve)" in str(caught.value)
        assert f"pending now is request {now!r}" in str(caught.value)
        assert runs.pending_request(graph, "t") is not None and len(effects_for(saver).rows("pay")) == 1


def test_the_cli_tells_a_second_approval_of_a_decided_request_who_decided_it(tmp_path: Path):
    env = {**os.environ, "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": "", "GATEDLOOP_GRAPH": "demo"}
    base = ["--db", str(tmp_path / "runs.sqlite"), "--json"]
    asked = run_cli([*base, "run", "reserve a workshop seat for Alice", "--thread", "t1"], env)
    [request] = [r["request"] for r in map(json.loads, asked.stdout.splitlines()) if r["type"] == "request"]
    approve = [*base, "--user", "bo", "resume", "t1", "--request", request["request_id"], "--approve"]
    assert run_cli(approve, env).returncode == 0
    again = run_cli([*approve[:4], "cy", *approve[5:]], env)
    error = json.loads(again.stderr.splitlines()[-1])
    assert again.returncode == 6 and error["error"].startswith("answer not applied: request "), again.stderr
    assert "was already decided by another answer: bo (approve)" in error["error"]
