"""Invariant 3 under concurrency: two real processes resume the same thread at the same moment.

Both children wait on a barrier file, then resume together. Every write waits on a gate file before its
effect, so whoever got in first is still inside its write while the other one tries: the overlap is made
by the gate, not by timing. With the lease (`gatedloop.graph.runs`) the second process gets `ThreadBusy`;
with the lease bypassed (`graph.invoke` directly) both run the graph and the ledger claim alone keeps each
write to one start. A process SIGKILLed while holding the lease leaves the thread resumable at once.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from crash_child import EXIT_BUSY, EXIT_FINAL, Child, KillPlan, child_command, drive_here, inspect_thread, run_child
from sample_app import Effects, build

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.lease import lease_path
from gatedloop.checkpoints.ledger import idempotency_key
from gatedloop.graph import runs

pytestmark = pytest.mark.slow

THREAD = "t1"
TEXT = "book 2 seat, 1 lunch"
CALLS = ["c1_0", "c1_1"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    return {
        "db": str(tmp_path / "runs.sqlite"),
        "effects": str(tmp_path / "effects.sqlite"),
        "gate": str(tmp_path / "gate"),
        "barrier": str(barrier),
        "tmp": str(tmp_path),
    }


def paused_for_approval(files: dict[str, str]) -> None:
    with open_sqlite(files["db"]) as saver:
        out = runs.start(build(saver, Effects(files["effects"])), THREAD, TEXT)
    assert out["__interrupt__"][0].value["kind"] == "approval"


def stopped_by_a_crash(files: dict[str, str]) -> None:
    """A real child approves the writes and is SIGKILLed inside the first one, before its effect."""
    cmd = child_command(
        files["db"], files["effects"], THREAD, "--text", TEXT, "--hold", "before", "--gate", files["gate"] + ".never"
    )
    assert run_child(cmd, Path(files["tmp"], "first.stderr"), KillPlan("hold_before")).killed
    assert Effects(files["effects"]).rows() == []


def start_together(files: dict[str, str], *extra: str) -> list[Child]:
    """Two children that resume the thread the moment both are ready; every write of theirs waits on the gate."""
    hold = ["--hold", "before", "--gate", files["gate"]]
    cmd = child_command(files["db"], files["effects"], THREAD, "--barrier", files["barrier"], *hold)
    children = [Child([*cmd, *extra], Path(files["tmp"], f"child{i}.stderr")) for i in range(2)]
    for child in children:
        assert child.wait_for("ready") is not None, child.lines
    Path(files["barrier"], "go").touch()
    return children


def effects_by_key(files: dict[str, str]) -> tuple[Counter[str], set[int]]:
    with sqlite3.connect(files["effects"]) as conn:
        rows = conn.execute("SELECT key, pid FROM effects").fetchall()
    return Counter(key for key, _ in rows), {pid for _, pid in rows}


def assert_each_write_once(files: dict[str, str]) -> None:
    keys, _ = effects_by_key(files)
    assert keys == Counter({idempotency_key(THREAD, cid): 1 for cid in CALLS})
    report = inspect_thread(files["db"], files["effects"], THREAD, CALLS)
    assert report.problems == []
    assert report.status == "completed"


@pytest.mark.parametrize("prepare", [paused_for_approval, stopped_by_a_crash], ids=["approval", "crash"])
def test_two_processes_resume_at_once_one_gets_thread_busy(files: dict[str, str], prepare):
    prepare(files)
    children = start_together(files)
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
    assert_each_write_once(files)


def test_with_the_lease_bypassed_the_ledger_still_starts_each_write_once(files: dict[str, str]):
    paused_for_approval(files)
    children = start_together(files, "--bypass-lease", "--once")
    try:
        # Both run the graph. One claims c1_0 and holds before its effect. The other finds c1_0 claimed by a
        # live process: it cannot know the outcome, so it asks a person and starts no write (not even c1_1,
        # which must come after c1_0 in the model's order).
        holder = next(c for c in children if c.wait_for("hold_before", timeout_s=30))
        other = next(c for c in children if c is not holder)
        assert other.wait().returncode == EXIT_FINAL, other.lines
        assert not any(line.startswith(("write_begin", "effect")) for line in other.lines), other.lines
        Path(files["gate"]).touch()
        results = [child.wait() for child in children]
    finally:
        for child in children:
            child.kill()
    assert [r.returncode for r in results] == [EXIT_FINAL, EXIT_FINAL], [r.stderr[-2000:] for r in results]
    keys, pids = effects_by_key(files)
    assert keys == Counter({idempotency_key(THREAD, cid): 1 for cid in CALLS})
    assert pids == {holder.proc.pid}
    with sqlite3.connect(files["db"]) as conn:
        assert conn.execute("SELECT call_id, attempts FROM gatedloop_ledger ORDER BY call_id").fetchall() == [
            ("c1_0", 1),
            ("c1_1", 1),
        ]
    # Whatever each process left in the checkpoints, one more resume settles the thread without a new write.
    settled = drive_here(child_command(files["db"], files["effects"], THREAD)[2:])
    assert settled.returncode == EXIT_FINAL, settled.lines
    assert_each_write_once(files)


def test_thread_of_a_killed_lease_holder_is_resumable_at_once(files: dict[str, str]):
    cmd = child_command(
        files["db"], files["effects"], THREAD, "--text", TEXT, "--hold", "before", "--gate", files["gate"]
    )
    child = Child(cmd, Path(files["tmp"], "holder.stderr"))
    try:
        assert child.wait_for("hold_before") is not None, child.lines
        fd = os.open(lease_path(files["db"], THREAD), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        child.kill()
    finally:
        child.kill()
        run = child.wait()
    assert run.killed
    with open_sqlite(files["db"]) as saver:
        out = runs.resume(build(saver, Effects(files["effects"])), THREAD)  # wait_s=0: no waiting
    assert out["status"] == "completed"
    assert_each_write_once(files)
