"""Invariants 3 and 7 on Postgres: the durability, resume and concurrency tests, against a real server.

Real child processes (`tests/pg_server.py`, which is `crash_child.py` on `open_postgres`) start, approve,
resume and get SIGKILLed; this process checks what is left in Postgres and in the authoritative system
(`sample_app.Effects`, a SQLite file per test). Every test uses thread ids of its own, so tests (and earlier
runs on the same database) never meet. The server comes from `GATEDLOOP_TEST_PG_URL`; see `pg_server`.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pg_server
import pytest
from crash_child import EXIT_BUSY, EXIT_FINAL, EXIT_WAITING, Child, ChildRun, KillPlan, plan_trial, run_child
from invariants import assert_each_call_answered_once
from langchain_core.messages import ToolMessage
from pg_server import (
    PostgresUnavailable,
    claim_command,
    find_postgres,
    new_thread_id,
    pg_child_command,
    require_postgres,
)
from sample_app import Effects, build

from gatedloop.checkpoints.ledger import SqliteLedger, idempotency_key

pytestmark = pytest.mark.slow

TEXT = "book 2 seat, 1 lunch"
CALLS = ["c1_0", "c1_1"]
TRIALS = int(os.environ.get("GATEDLOOP_PG_CRASH_TRIALS", "8"))
SEED_BASE = int(os.environ.get("GATEDLOOP_CRASH_SEED", "20240"))


@pytest.fixture(scope="module")
def pg_url() -> str:
    return require_postgres()


@pytest.fixture
def saver(pg_url: str) -> Iterator[Any]:
    from gatedloop.checkpoints.postgres import open_postgres

    with open_postgres(pg_url) as opened:
        yield opened


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


# ------------------------------------------------------------------------------------------------ helpers


def effects_per_call(effects_path: str, thread_id: str, call_ids: list[str]) -> dict[str, int]:
    counts = Counter(key for _, _, key in Effects(effects_path).rows("book"))
    return {cid: counts[idempotency_key(thread_id, cid)] for cid in call_ids}


def effect_pids(effects_path: str) -> set[int]:
    with sqlite3.connect(effects_path) as conn:
        return {pid for (pid,) in conn.execute("SELECT pid FROM effects")}


@dataclass
class PgThread:
    status: str
    per_call: dict[str, int]
    ledger: dict[str, tuple[str, int]]
    messages: list[Any]


def inspect_pg_thread(pg_url: str, effects_path: str, thread_id: str, call_ids: list[str]) -> PgThread:
    """Where a thread no process is running any more stands, read in this process from Postgres."""
    from gatedloop.checkpoints.postgres import open_postgres
    from gatedloop.graph import runs

    with open_postgres(pg_url) as fresh:
        graph = build(fresh, Effects(effects_path))
        snapshot = graph.get_state(runs.config_for(thread_id))
        request = runs.pending_request(graph, thread_id)
        ledger = {e.call_id: (str(e.state), e.attempts) for e in fresh.ledger.entries(thread_id)}
    values = snapshot.values or {}
    if request is not None:
        status = "waiting_for_person" if request.get("kind") == "unknown_outcome" else "waiting_for_approval"
    elif snapshot.next or not values.get("status"):
        status = "stopped_mid_run"
    else:
        status = str(values["status"])
    return PgThread(status, effects_per_call(effects_path, thread_id, call_ids), ledger, values.get("messages", []))


def assert_completed_once(pg_url: str, files: dict[str, str], thread_id: str, call_ids: list[str]) -> PgThread:
    """The thread completed, each approved write happened exactly once, every call answered once."""
    thread = inspect_pg_thread(pg_url, files["effects"], thread_id, call_ids)
    assert thread.status == "completed", thread
    assert thread.per_call == dict.fromkeys(call_ids, 1), thread.per_call
    assert thread.ledger == {cid: ("done", thread.ledger[cid][1]) for cid in call_ids}, thread.ledger
    assert_each_call_answered_once(thread.messages)
    strangers = set(Counter(key for _, _, key in Effects(files["effects"]).rows())) - {
        idempotency_key(thread_id, cid) for cid in call_ids
    }
    assert not strangers
    return thread


def steps(run: ChildRun) -> list[str]:
    """The child's driving markers, without the checkpoint and write markers between them."""
    return [line for line in run.lines if line.split(" ", 1)[0] in ("step", "final", "once", "busy", "waiting")]


def run_pg_child(files: dict[str, str], thread_id: str, *extra: str, kill: KillPlan | None = None) -> ChildRun:
    name = f"child-{len(list(Path(files['tmp']).glob('child-*.stderr')))}.stderr"
    return run_child(pg_child_command(files["effects"], thread_id, *extra), Path(files["tmp"], name), kill)


def start_together(files: dict[str, str], thread_id: str, *extra: str) -> list[Child]:
    """Two children that resume the thread the moment both are ready; every write of theirs waits on the gate."""
    hold = ["--hold", "before", "--gate", files["gate"]]
    cmd = pg_child_command(files["effects"], thread_id, "--barrier", files["barrier"], *hold, *extra)
    children = [Child(cmd, Path(files["tmp"], f"racer{i}.stderr")) for i in range(2)]
    for child in children:
        assert child.wait_for("ready") is not None, (child.lines, child.wait().stderr[-2000:])
    Path(files["barrier"], "go").touch()
    return children


# ------------------------------------------------------------------------------- the CI guard on the server


def test_missing_server_skips_on_a_developer_machine_and_fails_in_ci():
    with pytest.raises(PostgresUnavailable):
        find_postgres({})
    with pytest.raises(pytest.skip.Exception):
        require_postgres({})
    with pytest.raises(pytest.fail.Exception, match="CI=true but no Postgres"):
        require_postgres({"CI": "true"})


# ------------------------------------------------------------------------ ledger: same semantics as SQLite


def ledger_script(ledger: Any, thread_id: str) -> list[Any]:
    """Every Ledger operation, including the repeats that must change nothing; timestamps left out."""
    seen: list[Any] = []

    def entry(e: Any) -> Any:
        return None if e is None else (e.call_id, e.tool, e.state, e.result, e.attempts, e.idempotency_key)

    won, first = ledger.claim(thread_id, "a", "book", "d1")
    seen += [won, entry(first)]
    won, again = ledger.claim(thread_id, "a", "other", "d2")
    seen += [won, entry(again)]
    seen += [ledger.reclaim(thread_id, "a", 2), ledger.reclaim(thread_id, "a", 1), ledger.reclaim(thread_id, "a", 1)]
    ledger.finish(thread_id, "a", "done", {"booking": 7, "note": "é"})
    ledger.finish(thread_id, "a", "failed", {"booking": 8})
    seen += [ledger.reclaim(thread_id, "a", 2), entry(ledger.get(thread_id, "a")), entry(ledger.get(thread_id, "zz"))]
    ledger.claim(thread_id, "b", "book", "d3")
    ledger.finish(thread_id, "b", "abandoned", {"why": None})
    seen.append([entry(e) for e in ledger.entries(thread_id)])
    ledger.record(thread_id, "a", "executed", {"n": 1}, "alice")
    ledger.record(thread_id, "a", "executed", {"n": 2}, "bob")
    ledger.record(thread_id, "b", "refused", {"x": [1, 2]})
    seen.append([{k: v for k, v in item.items() if k != "at"} for item in ledger.audit(thread_id)])
    seen.append(ledger.cancel_requested(thread_id))
    ledger.request_cancel(thread_id)
    ledger.request_cancel(thread_id)
    seen.append(ledger.cancel_requested(thread_id))
    ledger.clear_cancel(thread_id)
    seen.append(ledger.cancel_requested(thread_id))
    return seen


def test_postgres_ledger_behaves_like_the_sqlite_ledger(saver, tmp_path: Path):
    thread_id = new_thread_id("parity")
    sqlite_ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    try:
        expected = ledger_script(sqlite_ledger, thread_id)
    finally:
        sqlite_ledger.close()
    assert ledger_script(saver.ledger, thread_id) == expected


def test_claims_raced_by_many_processes_have_one_winner_each(pg_url: str, files: dict[str, str]):
    """Six processes claim the same 40 calls at the same moment, then race to reclaim each at attempt 1."""
    thread_id, calls, racers = new_thread_id("claims"), 40, 6

    def race(*extra: str) -> list[ChildRun]:
        barrier = Path(files["barrier"], "-".join(extra) or "claim")
        barrier.mkdir()
        children = [
            Child(claim_command(thread_id, calls, str(barrier), *extra), Path(files["tmp"], f"claim{i}{extra}.err"))
            for i in range(racers)
        ]
        for child in children:
            assert child.wait_for("ready") is not None, child.wait().stderr[-2000:]
        Path(barrier, "go").touch()
        results = [child.wait() for child in children]
        assert all(r.returncode == 0 and r.last() == "finished" for r in results), [r.stderr[-800:] for r in results]
        return results

    for extra in ((), ("--reclaim", "1")):
        won = Counter(line.split()[1] for run in race(*extra) for line in run.markers("won"))
        assert won == Counter({f"c{i}": 1 for i in range(calls)}), (extra, won)
    from gatedloop.checkpoints.postgres import PostgresLedger

    ledger = PostgresLedger(pg_url, setup=False)
    try:
        entries = ledger.entries(thread_id)
    finally:
        ledger.close()
    assert len(entries) == calls
    assert {(e.state, e.attempts) for e in entries} == {("claimed", 2)}


def test_processes_opening_a_fresh_database_at_once_all_succeed(pg_url: str, files: dict[str, str]):
    """LangGraph's own `setup()` fails when two processes run it on a fresh database at once (duplicate
    pg_type / checkpoint_migrations rows); `open_postgres` takes turns, without a deadlock against the
    migrations' `CREATE INDEX CONCURRENTLY`."""
    import psycopg
    from psycopg import sql

    name = f"gl_fresh_{new_thread_id('db').split('-', 1)[1]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        try:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test role may not create databases")
    try:
        cmd = [sys.executable, str(Path(pg_server.__file__)), "open", "--database", name, "--barrier", files["barrier"]]
        children = [Child(cmd, Path(files["tmp"], f"open{i}.stderr")) for i in range(4)]
        for child in children:
            assert child.wait_for("ready") is not None, child.wait().stderr[-2000:]
        Path(files["barrier"], "go").touch()
        results = [child.wait() for child in children]
        assert [r.last() for r in results] == ["opened"] * 4, [r.stderr[-1500:] for r in results]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# --------------------------------------------------------------------- approval, then resume in a new process


def test_approval_then_resume_by_thread_id_in_a_new_process(pg_url: str, files: dict[str, str]):
    thread_id = new_thread_id("approve")
    first = run_pg_child(files, thread_id, "--text", TEXT, "--once")
    assert first.returncode == EXIT_FINAL and steps(first) == ["step start", "once"], first
    paused = inspect_pg_thread(pg_url, files["effects"], thread_id, CALLS)
    assert paused.status == "waiting_for_approval"
    assert paused.per_call == {"c1_0": 0, "c1_1": 0} and paused.ledger == {}

    second = run_pg_child(files, thread_id)  # thread id alone: no text, nothing carried over but the database
    assert second.returncode == EXIT_FINAL, (second.lines, second.stderr[-2000:])
    assert steps(second) == ["step approve 2", "final completed"], second.lines
    assert_completed_once(pg_url, files, thread_id, CALLS)
    assert effect_pids(files["effects"]) != {os.getpid()}


def test_paused_here_resumed_by_a_new_process_then_finished_here_again(saver, pg_url: str, files: dict[str, str]):
    from gatedloop.graph import runs

    thread_id = new_thread_id("handoff")
    graph = build(saver, Effects(files["effects"]))
    out = runs.start(graph, thread_id, "book 1 seat")
    assert out["__interrupt__"][0].value["action_requests"][0]["name"] == "book"
    child = run_pg_child(files, thread_id, "--once")
    assert child.returncode == EXIT_FINAL and steps(child) == ["step approve 1", "once"], child.lines
    out = runs.output(graph, thread_id)  # this process sees what the other one did, through Postgres
    assert out["status"] == "completed" and "__interrupt__" not in out
    assert_completed_once(pg_url, files, thread_id, ["c1_0"])


# ------------------------------------------------------------- a process SIGKILLed inside a write, reconciled


@pytest.mark.parametrize("where", ["before", "after"])
def test_write_of_a_killed_process_is_reconciled_and_never_happens_twice(
    pg_url: str, files: dict[str, str], where: str
):
    """Killed inside c1_0, before or after its effect: the claim stays `claimed`. A fresh process asks the
    booking system (reconcile): after -> the recorded booking is reused; before -> the write runs once more."""
    thread_id = new_thread_id(f"killed-{where}")
    never = files["gate"] + ".never"
    held = ["--hold", where, "--hold-call", "c1_0", "--gate", never]
    killed = run_pg_child(files, thread_id, "--text", TEXT, *held, kill=KillPlan(f"hold_{where}"))
    assert killed.killed, (killed.lines, killed.stderr[-2000:])
    assert effects_per_call(files["effects"], thread_id, CALLS) == {"c1_0": int(where == "after"), "c1_1": 0}
    assert inspect_pg_thread(pg_url, files["effects"], thread_id, CALLS).ledger == {"c1_0": ("claimed", 1)}

    resumed = run_pg_child(files, thread_id)
    assert resumed.returncode == EXIT_FINAL, (resumed.lines, resumed.stderr[-2000:])
    thread = assert_completed_once(pg_url, files, thread_id, CALLS)
    assert thread.ledger["c1_0"] == ("done", 1 if where == "after" else 2)
    writes_in_resume = [line for line in resumed.lines if line.startswith("write_begin")]
    assert len(writes_in_resume) == (1 if where == "after" else 2), resumed.lines

    from gatedloop.checkpoints.postgres import PostgresLedger

    ledger = PostgresLedger(pg_url, setup=False)
    try:
        events = [e["event"] for e in ledger.audit(thread_id) if e["call_id"] == "c1_0"]
    finally:
        ledger.close()
    assert ("reconciled" in events) == (where == "after"), events
    assert ("rerun_2" in events) == (where == "before"), events
    answers = {m.tool_call_id: m for m in thread.messages if isinstance(m, ToolMessage)}
    assert answers["c1_0"].status == "success"


def test_seeded_kills_at_random_moments_keep_each_write_at_most_once(pg_url: str, tmp_path: Path):
    """crash_child's seeded trials on Postgres: kills land before, inside and between writes and while
    checkpoints are written; a fresh process resumes (killed again in about half the trials), then one more
    without a kill. No write ever happens twice; an answered thread completes with each write once."""

    def trial(seed: int) -> tuple[int, list[str]]:
        plan = plan_trial(seed)
        workdir = tmp_path / f"trial-{seed}"
        workdir.mkdir()
        effects = str(workdir / "effects.sqlite")
        thread_id = new_thread_id(f"trial-{seed}")
        options = ["--reconcile", plan.reconcile, "--unknown", plan.unknown]
        options += ["--delay-before", f"{plan.delay_before:.4f}", "--delay-after", f"{plan.delay_after:.4f}"]
        cmd = pg_child_command(effects, thread_id, "--text", plan.text, *options)
        children = [run_child(cmd, workdir / f"child{i}.stderr", kill) for i, kill in enumerate(plan.kills)]
        children.append(run_child(cmd, workdir / "last.stderr"))
        call_ids = [f"c1_{i}" for i in range(plan.writes)]
        thread = inspect_pg_thread(pg_url, effects, thread_id, call_ids)
        last = children[-1]
        problems = []
        if any(n > 1 for n in thread.per_call.values()):
            problems.append(f"a write happened twice: {thread.per_call}")
        if last.killed or last.returncode not in (EXIT_FINAL, EXIT_WAITING):
            problems.append(f"last resume rc={last.returncode}: {last.stderr[-1500:]}")
        if plan.unknown == "truthful":
            if thread.status != "completed" or set(thread.per_call.values()) != {1}:
                problems.append(f"status={thread.status} effects={thread.per_call} ledger={thread.ledger}")
        elif thread.status not in ("completed", "needs_attention", "waiting_for_person"):
            problems.append(f"ended at {thread.status}")
        if thread.status in ("completed", "needs_attention"):
            try:
                assert_each_call_answered_once(thread.messages)
            except AssertionError as exc:
                problems.append(str(exc))
            if any(state == "claimed" for state, _ in thread.ledger.values()):
                problems.append(f"claims left open: {thread.ledger}")
        lines = [c.lines[-6:] for c in children]
        return sum(c.killed for c in children), [f"{plan.describe()}: {problems} lines={lines}"] if problems else []

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(trial, range(SEED_BASE, SEED_BASE + TRIALS)))
    kills = sum(k for k, _ in results)
    failures = [f for _, found in results for f in found]
    assert not failures, "\n".join(failures)
    assert kills >= TRIALS // 2, f"only {kills} kills landed in {TRIALS} trials"


# ------------------------------------------------------------------- concurrent resumes and the lease


@pytest.mark.parametrize("prepare", ["approval", "crash"])
def test_two_processes_resume_at_once_one_gets_thread_busy(pg_url: str, files: dict[str, str], prepare: str):
    thread_id = new_thread_id(f"race-{prepare}")
    if prepare == "approval":
        first = run_pg_child(files, thread_id, "--text", TEXT, "--once")
        assert first.lines[-1] == "once", first
    else:
        hold = ["--hold", "before", "--gate", files["gate"] + ".never"]
        assert run_pg_child(files, thread_id, "--text", TEXT, *hold, kill=KillPlan("hold_before")).killed
    assert effects_per_call(files["effects"], thread_id, CALLS) == {"c1_0": 0, "c1_1": 0}

    children = start_together(files, thread_id)
    try:
        first_lines = [child.wait_for(("busy", "hold_before", "final")) for child in children]
        assert sorted(line.split(" ", 1)[0] for line in first_lines if line) == ["busy", "hold_before"], first_lines
        Path(files["gate"]).touch()
        results = [child.wait() for child in children]
    finally:
        for child in children:
            child.kill()
    assert sorted(r.returncode for r in results) == [EXIT_FINAL, EXIT_BUSY], [r.lines for r in results]
    loser = next(r for r in results if r.returncode == EXIT_BUSY)
    assert not any(line.startswith(("write_begin", "effect")) for line in loser.lines)
    assert next(r for r in results if r.returncode == EXIT_FINAL).last() == "final completed"
    assert_completed_once(pg_url, files, thread_id, CALLS)


def test_with_the_lease_bypassed_the_ledger_still_starts_each_write_once(pg_url: str, files: dict[str, str]):
    thread_id = new_thread_id("bypass")
    assert run_pg_child(files, thread_id, "--text", TEXT, "--once").lines[-1] == "once"
    children = start_together(files, thread_id, "--bypass-lease", "--once")
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
    assert effect_pids(files["effects"]) == {holder.proc.pid}
    assert effects_per_call(files["effects"], thread_id, CALLS) == {"c1_0": 1, "c1_1": 1}
    # Whatever each process left in the checkpoints, one more resume settles the thread without a new write.
    settled = run_pg_child(files, thread_id)
    assert settled.returncode == EXIT_FINAL, settled.lines
    assert not any(line.startswith("write_begin") for line in settled.lines), settled.lines
    thread = assert_completed_once(pg_url, files, thread_id, CALLS)
    assert thread.ledger == {"c1_0": ("done", 1), "c1_1": ("done", 1)}


def test_thread_of_a_killed_lease_holder_is_resumable_at_once(saver, pg_url: str, files: dict[str, str]):
    from gatedloop.checkpoints.lease import ThreadBusy
    from gatedloop.graph import runs

    thread_id = new_thread_id("holder")
    cmd = pg_child_command(files["effects"], thread_id, "--text", TEXT, "--hold", "before", "--gate", files["gate"])
    child = Child(cmd, Path(files["tmp"], "holder.stderr"))
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
    assert freed_after < 1.0, f"the server kept the dead holder's lease for {freed_after:.2f}s"
    out = runs.resume(build(saver, Effects(files["effects"])), thread_id)  # wait_s=0: no waiting
    assert out["status"] == "completed"
    assert_completed_once(pg_url, files, thread_id, CALLS)


def test_lease_excludes_a_second_holder_in_the_same_process_and_waits_when_asked(saver):
    from gatedloop.checkpoints.lease import ThreadBusy

    thread_id, other = new_thread_id("lease"), new_thread_id("lease")
    with saver.lease(thread_id):
        with pytest.raises(ThreadBusy) as caught, saver.lease(thread_id):
            pass
        assert caught.value.thread_id == thread_id
        with saver.lease(other):  # another thread is not blocked
            pass
        started = time.monotonic()
        with pytest.raises(ThreadBusy), saver.lease(thread_id, wait_s=0.3):
            pass
        assert time.monotonic() - started >= 0.3
    with saver.lease(thread_id):  # released on exit
        pass


# ---------------------------------------------------------------------------------------- the async twin


def test_async_twin_pauses_and_resumes(pg_url: str, files: dict[str, str]):
    from langgraph.types import Command

    from gatedloop.checkpoints.postgres import open_async_postgres, open_postgres

    thread_id = new_thread_id("async")
    config = {"configurable": {"thread_id": thread_id}}

    async def scenario() -> dict[str, Any]:
        async with open_async_postgres(pg_url) as async_saver:
            graph = build(async_saver, Effects(files["effects"]))
            out = await graph.ainvoke({"messages": [("user", "book 1 seat")]}, config, durability="sync")
            assert out["__interrupt__"][0].value["action_requests"][0]["args"] == {"item": "seat", "quantity": 1}
            return await graph.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), config)

    out = asyncio.run(scenario())
    assert out["status"] == "completed"
    with open_postgres(pg_url) as sync_saver:  # the sync saver reads what the async one wrote
        assert build(sync_saver, Effects(files["effects"])).get_state(config).values["status"] == "completed"
    assert_completed_once(pg_url, files, thread_id, ["c1_0"])
