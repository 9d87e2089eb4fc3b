"""Invariant 3 under concurrency, on each backend: real processes resume the same thread at the same moment,
hand it to each other, and die holding its lease.

Both children wait on a barrier file, then resume together. Every write waits on a gate file before its
effect, so whoever got in first is still inside its write while the other one tries: the overlap is made
by the gate, not by timing. With the lease (`gatedloop.graph.runs`; a file lock beside a SQLite file, an
advisory lock in Postgres) the second process gets `ThreadBusy`; with the lease bypassed (`graph.invoke`
directly) both run the graph and the ledger claim alone keeps each write to one start. A process SIGKILLed
while holding the lease leaves the thread resumable at once. Every test uses thread ids of its own, so tests
(and earlier runs on the same Postgres database) never meet.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import pytest
from backends import Backend
from crash_child import (
    EXIT_BUSY,
    EXIT_FINAL,
    Child,
    ChildRun,
    KillPlan,
    assert_completed_once,
    effects_per_call,
    inspect_thread,
    run_child,
)
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool
from langgraph.types import Command
from pg_server import new_thread_id
from sample_app import Effects, build

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.graph import CallContext, build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

pytestmark = pytest.mark.slow

TEXT = "book 2 seat, 1 lunch"
CALLS = ["c1_0", "c1_1"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    return {
        "effects": str(tmp_path / "effects.sqlite"),
        "gate": str(tmp_path / "gate"),
        "barrier": str(barrier),
        "tmp": str(tmp_path),
    }


def effect_pids(files: dict[str, str]) -> set[int]:
    with sqlite3.connect(files["effects"]) as conn:
        return {pid for (pid,) in conn.execute("SELECT pid FROM effects")}


def run_in_child(backend: Backend, files: dict[str, str], thread_id: str, *extra: str, kill: KillPlan | None = None):
    name = f"child-{len(list(Path(files['tmp']).glob('child-*.stderr')))}.stderr"
    return run_child(backend.child_command(files["effects"], thread_id, *extra), Path(files["tmp"], name), kill)


def steps(run: ChildRun) -> list[str]:
    """The child's driving markers, without the checkpoint and write markers between them."""
    return [line for line in run.lines if line.split(" ", 1)[0] in ("step", "final", "once", "busy", "waiting")]


def paused_for_approval(backend: Backend, files: dict[str, str], thread_id: str) -> None:
    with backend.open() as saver:
        out = runs.start(build(saver, Effects(files["effects"])), thread_id, TEXT)
    assert out["__interrupt__"][0].value["kind"] == "approval"


def stopped_by_a_crash(backend: Backend, files: dict[str, str], thread_id: str) -> None:
    """A real child approves the writes and is SIGKILLed inside the first one, before its effect."""
    hold = ["--hold", "before", "--gate", files["gate"] + ".never"]
    assert run_in_child(backend, files, thread_id, "--text", TEXT, *hold, kill=KillPlan("hold_before")).killed
    assert effects_per_call(files["effects"], thread_id, CALLS) == {"c1_0": 0, "c1_1": 0}


def start_together(backend: Backend, files: dict[str, str], thread_id: str, *extra: str) -> list[Child]:
    """Two children that resume the thread the moment both are ready; every write of theirs waits on the gate."""
    hold = ["--hold", "before", "--gate", files["gate"]]
    cmd = backend.child_command(files["effects"], thread_id, "--barrier", files["barrier"], *hold, *extra)
    children = [Child(cmd, Path(files["tmp"], f"racer{i}.stderr")) for i in range(2)]
    for child in children:
        assert child.wait_for("ready") is not None, (child.lines, child.wait().stderr[-2000:])
    Path(files["barrier"], "go").touch()
    return children


@pytest.mark.parametrize("prepare", [paused_for_approval, stopped_by_a_crash], ids=["approval", "crash"])
def test_two_processes_resume_at_once_one_gets_thread_busy(backend: Backend, files: dict[str, str], prepare):
    thread_id = new_thread_id("race")
    prepare(backend, files, thread_id)
    children = start_together(backend, files, thread_id)
    try:
        # Whoever took the lease is held inside its first write; the other has been refused by then.
        first = [child.wait_for(("busy", "hold_before", "final")) for child in children]
        assert sorted(line.split(" ", 1)[0] for line in first if line) == ["busy", "hold_before"], first
        Path(files["gate"]).touch()
        results = [child.wait() for child in children]
    finally:
        for child in children:
            child.kill()
    assert sorted(r.returncode for r in results) == [EXIT_FINAL, EXIT_BUSY], [r.lines for r in results]
    winner = next(r for r in results if r.returncode == EXIT_FINAL)
    loser = next(r for r in results if r.returncode == EXIT_BUSY)
    assert winner.last() == "final completed"
    assert not any(line.startswith(("write_begin", "effect")) for line in loser.lines)
    assert_completed_once(backend.db, files["effects"], thread_id, CALLS)


def test_with_the_lease_bypassed_the_ledger_still_starts_each_write_once(backend: Backend, files: dict[str, str]):
    thread_id = new_thread_id("bypass")
    paused_for_approval(backend, files, thread_id)
    children = start_together(backend, files, thread_id, "--bypass-lease", "--once")
    try:
        # Both run the graph. One claims c1_0 and holds before its effect. The other finds c1_0 claimed by a
        # live process: it cannot know the outcome, so it asks a person and starts no write (not even c1_1,
        # which must come after c1_0 in the model's order).
        holder = next(c for c in children if c.wait_for("hold_before", timeout_s=60))
        other = next(c for c in children if c is not holder)
        assert other.wait().returncode == EXIT_FINAL, other.lines
        assert not any(line.startswith(("write_begin", "effect")) for line in other.lines), other.lines
        Path(files["gate"]).touch()
        results = [child.wait() for child in children]
    finally:
        for child in children:
            child.kill()
    assert [r.returncode for r in results] == [EXIT_FINAL, EXIT_FINAL], [r.stderr[-2000:] for r in results]
    assert effects_per_call(files["effects"], thread_id, CALLS) == {"c1_0": 1, "c1_1": 1}
    assert effect_pids(files) == {holder.proc.pid}
    with backend.open() as saver:
        assert [(e.call_id, e.attempts) for e in saver.ledger.entries(thread_id)] == [("c1_0", 1), ("c1_1", 1)]
    # Whatever each process left in the checkpoints, one more resume settles the thread without a new write.
    settled = run_in_child(backend, files, thread_id)
    assert settled.returncode == EXIT_FINAL, settled.lines
    assert not any(line.startswith("write_begin") for line in settled.lines), settled.lines
    assert_completed_once(backend.db, files["effects"], thread_id, CALLS)
    assert inspect_thread(backend.db, files["effects"], thread_id, CALLS).ledger == {
        "c1_0": ("done", 1),
        "c1_1": ("done", 1),
    }


def test_thread_of_a_killed_lease_holder_is_resumable_at_once(backend: Backend, files: dict[str, str]):
    thread_id = new_thread_id("holder")
    hold = ["--hold", "before", "--gate", files["gate"]]
    cmd = backend.child_command(files["effects"], thread_id, "--text", TEXT, *hold)
    child = Child(cmd, Path(files["tmp"], "holder.stderr"))
    with backend.open() as saver:
        try:
            assert child.wait_for("hold_before") is not None, child.lines
            with pytest.raises(ThreadBusy), saver.lease(thread_id):
                pass
            child.kill()
        finally:
            child.kill()
            run = child.wait()
        assert run.killed
        started = time.monotonic()
        with saver.lease(thread_id, wait_s=5.0):
            freed_after = time.monotonic() - started
        assert freed_after < 1.0, f"the dead holder's lease was kept for {freed_after:.2f}s"
        out = runs.resume(build(saver, Effects(files["effects"])), thread_id)  # wait_s=0: no waiting
    assert out["status"] == "completed"
    assert_completed_once(backend.db, files["effects"], thread_id, CALLS)


def test_lease_excludes_a_second_holder_in_the_same_process_and_waits_when_asked(backend: Backend):
    thread_id, other = new_thread_id("lease"), new_thread_id("lease")
    with backend.open() as saver, saver.lease(thread_id):
        with pytest.raises(ThreadBusy) as caught, saver.lease(thread_id):
            pass
        assert caught.value.thread_id == thread_id
        with saver.lease(other):  # another thread is not blocked
            pass
        started = time.monotonic()
        with pytest.raises(ThreadBusy), saver.lease(thread_id, wait_s=0.3):
            pass
        assert time.monotonic() - started >= 0.3
    with backend.open() as saver, saver.lease(thread_id):  # released on exit
        pass


# ------------------------------------------------------------------- a thread handed between processes


def test_approval_then_resume_by_thread_id_in_a_new_process(backend: Backend, files: dict[str, str]):
    thread_id = new_thread_id("approve")
    first = run_in_child(backend, files, thread_id, "--text", TEXT, "--once")
    assert first.returncode == EXIT_FINAL and steps(first) == ["step start", "once"], first
    paused = inspect_thread(backend.db, files["effects"], thread_id, CALLS)
    assert paused.status == "waiting_for_approval"
    assert paused.effects_per_call == {"c1_0": 0, "c1_1": 0} and paused.ledger == {}

    second = run_in_child(backend, files, thread_id)  # thread id alone: nothing carried over but the database
    assert second.returncode == EXIT_FINAL, (second.lines, second.stderr[-2000:])
    assert steps(second) == ["step approve 2", "final completed"], second.lines
    assert_completed_once(backend.db, files["effects"], thread_id, CALLS)
    assert os.getpid() not in effect_pids(files)


def test_paused_here_resumed_by_a_new_process_then_finished_here_again(backend: Backend, files: dict[str, str]):
    thread_id = new_thread_id("handoff")
    with backend.open() as saver:
        graph = build(saver, Effects(files["effects"]))
        out = runs.start(graph, thread_id, "book 1 seat")
        assert out["__interrupt__"][0].value["action_requests"][0]["name"] == "book"
        child = run_in_child(backend, files, thread_id, "--once")
        assert child.returncode == EXIT_FINAL and steps(child) == ["step approve 1", "once"], child.lines
        out = runs.output(graph, thread_id)  # this process sees what the other one did, through the database
    assert out["status"] == "completed" and "__interrupt__" not in out
    assert_completed_once(backend.db, files["effects"], thread_id, ["c1_0"])


BO = CallContext(user_id="bo", roles={"finance"})


def test_two_resumes_at_once_in_one_process_start_the_write_once(db: str, tmp_path: Path) -> None:
    """A server runs two answers to one request at once in one process (LangGraph Server, Aegra: no lease). The
    second finds the write claimed by this very process while the first is paying: that claim is live, not dead,
    so the second asks a person instead of reconciling it as not done and paying again (it did, before
    `running.attempt_here`: two payments, audit `rerun_2`)."""
    effects = Effects(str(tmp_path / "effects.sqlite"))
    first_started, release = threading.Event(), threading.Event()

    @tool
    def pay(amount: float, to: str, idempotency_key: Annotated[str | None, InjectedToolArg] = None) -> str:
        """Pay someone (write)."""
        if not first_started.is_set():
            first_started.set()
            release.wait(30)
        effects.add("pay", {"amount": amount, "to": to}, idempotency_key)
        return "paid"

    def responder(messages: list[BaseMessage]) -> AIMessage:
        if isinstance(messages[-1], ToolMessage):
            return reply("done")
        return reply(calls=[call("pay", {"amount": 500.0, "to": "bo"}, "c1")])

    with open_sqlite(db) as saver:
        policy = ToolPolicy(effect="write", approval="always", reconcile=lambda args, key: effects.find(key))
        graph = build_graph(ScriptedChatModel(responder=responder), [pay], policies={"pay": policy}, checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}
        graph.invoke({"messages": [("user", "pay 500 to bo")]}, config, context=CallContext(user_id="ana"))
        approve = Command(resume={"decisions": [{"type": "approve"}]})
        results: list[Any] = []
        first = threading.Thread(target=lambda: results.append(graph.invoke(approve, config, context=BO)))
        first.start()
        assert first_started.wait(30)
        second = graph.invoke(approve, config, context=BO)  # while the first run's payment is under way
        release.set()
        first.join(30)
        assert len(effects.rows("pay")) == 1, [e["event"] for e in saver.ledger.audit("t")]
        [asked] = second["__interrupt__"]  # it cannot know the outcome of a write under way: a person decides
        assert [c["reason"] for c in asked.value["calls"]] == ["claimant_running"]
        assert results[0]["status"] == "completed"
        assert [(e.state, e.attempts) for e in saver.ledger.entries("t")] == [("done", 1)]
