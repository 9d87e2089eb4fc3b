"""Storage faults, each created for real: another process holding the write lock, a read-only file or mount,
a full disk, a corrupted checkpoint row, a dropped ledger table.

For each: the error names the fault, the last good checkpoint is still there, the ledger holds no partial
entry (no claim for a write that never started, no lost claim for one that did), and once the fault is gone
the same thread resumes by its id and completes, each approved write having happened exactly once (one
`Effects` row per idempotency key).

The busy timeout is a module constant (`BUSY_TIMEOUT_MS`, 10 s) that `open_sqlite` does not expose; the
lock tests lower it with monkeypatch so a lock held "longer than the timeout" costs 0.2 s, not 10 s. The
mount tests (read-only bind mount, small tmpfs) need root and `mount`; the permission test drops the
DAC-override capabilities in a child (support/no_dac_resume.py), since root ignores file modes.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from invariants import assert_each_call_answered_once
from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool
from langgraph.types import Command
from sample_app import Effects, booking_responder, build, policies

import gatedloop.checkpoints.ledger as ledger_module
import gatedloop.checkpoints.sqlite as sqlite_module
from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.ledger import LedgerError, idempotency_key
from gatedloop.graph import build_graph, runs
from gatedloop.graph.scripted import ScriptedChatModel

THREAD = "t1"
APPROVE = {"decisions": [{"type": "approve"}]}
KEY = idempotency_key(THREAD, "c1_0")
SUPPORT = str(Path(__file__).parent / "support")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root and mount(8) to create the fault"
)


# ------------------------------------------------------------------------------------------------ helpers


def effects_per_key(effects: Effects) -> Counter[str | None]:
    return Counter(key for _, _, key in effects.rows("book"))


def checkpoint_ids(graph: Any, thread_id: str = THREAD) -> list[str]:
    return [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(runs.config_for(thread_id))]


def pending_actions(graph: Any) -> list[dict[str, Any]]:
    request = runs.pending_request(graph, THREAD)
    assert request is not None and request["kind"] == "approval", request
    actions = request["action_requests"]
    return [{"name": a["name"], "args": a["args"], "tool_call_id": a["tool_call_id"]} for a in actions]


def paused_thread(saver: Any, effects: Effects, **kwargs: Any) -> Any:
    graph = build(saver, effects, **kwargs)
    out = runs.start(graph, THREAD, "book 2 seats")
    assert "__interrupt__" in out
    return graph


def finish_and_check(graph: Any, effects: Effects, answer: Any = APPROVE) -> dict[str, Any]:
    """Resume the thread once the fault is gone: it completes and the write happened exactly once."""
    out = runs.resume(graph, THREAD, answer)
    assert out["status"] == "completed", out.get("stop_detail")
    assert out["answer"] == "done: success"
    assert_each_call_answered_once(out["messages"])
    assert effects_per_key(effects) == {KEY: 1}
    entries = graph.checkpointer.ledger.entries(THREAD)
    assert [(e.call_id, e.state, e.attempts) for e in entries] == [("c1_0", "done", 1)]
    return out


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> int:
    """`open_sqlite` has no busy-timeout parameter: lower the module constant both modules read at open."""
    ms = 200
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_MS", ms)
    monkeypatch.setattr(sqlite_module, "BUSY_TIMEOUT_MS", ms)
    return ms


LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
for line in sys.stdin:
    if line.strip() == "lock":
        conn.execute("BEGIN EXCLUSIVE")
    elif line.strip() == "release":
        conn.execute("COMMIT")
    print("ok", flush=True)
"""


class Locker:
    """Another process that takes SQLite's write lock (`BEGIN EXCLUSIVE`) on demand and holds it."""

    def __init__(self, db: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def _say(self, word: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok", f"locker failed to {word}"

    def lock(self) -> None:
        self._say("lock")

    def release(self) -> None:
        self._say("release")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def locker(db: str) -> Iterator[Locker]:
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    holder = Locker(db)
    yield holder
    holder.close()


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@pytest.fixture
def mounts() -> Iterator[list[Path]]:
    """Mount points made by a test, unmounted (lazily, so a leaked fd cannot wedge the run) afterwards."""
    made: list[Path] = []
    yield made
    for point in reversed(made):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def fill_disk(directory: Path) -> Path:
    """Fill the filesystem holding `directory` until ENOSPC; delete the returned file to free it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 512, 1):
            try:
                while True:
                    os.write(fd, b"x" * chunk)
            except OSError as exc:
                assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler


def graph_with_book(saver: Any, effects: Effects, after_write: Callable[[], None], **book_overrides: Any) -> Any:
    """The sample app, with a `book` tool that calls `after_write` once its side effect has happened."""

    @tool
    def book(item: str, quantity: int, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Book an item (write)."""
        booking = effects.add("book", {"item": item, "quantity": quantity}, idempotency_key)
        after_write()
        return {"booking": booking, "item": item, "quantity": quantity}

    @tool
    def lookup(query: str) -> dict[str, Any]:
        """Look a thing up (read)."""
        return {"query": query}

    return build_graph(
        ScriptedChatModel(responder=booking_responder),
        [lookup, book],
        policies=policies(effects, **book_overrides),
        checkpointer=saver,
    )


def once(action: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            action()

    return run


# ------------------------------------------------------------------- 1. locked by another process


@pytest.mark.usefixtures("short_busy_timeout")
def test_a_lock_held_by_another_process_fails_the_resume_cleanly_and_the_thread_resumes_after(
    db: str, tmp_path: Path, locker: Locker
):
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = paused_thread(saver, effects)
        before, actions = checkpoint_ids(graph), pending_actions(graph)
        locker.lock()
        with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Adatabase is locked$"):
            runs.resume(graph, THREAD, APPROVE)
        # Readers are not blocked (WAL): the state is readable while the other process holds the lock.
        assert checkpoint_ids(graph) == before
        assert pending_actions(graph) == actions
        assert saver.ledger.entries(THREAD) == []
        assert effects.rows() == []
        locker.release()
        finish_and_check(graph, effects)


def test_a_lock_shorter_than_the_busy_timeout_is_waited_out(db: str, tmp_path: Path, locker: Locker):
    """With the real busy timeout (10 s), a lock released 0.5 s into the resume only delays it."""
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = paused_thread(saver, effects)
        locker.lock()
        seen_at_release: list[int] = []

        def release_later() -> None:
            seen_at_release.append(len(effects.rows()))
            locker.release()

        timer = threading.Timer(0.5, release_later)
        timer.start()
        try:
            finish_and_check(graph, effects)
        finally:
            timer.join()
        assert seen_at_release == [0]  # the write waited for the lock


@pytest.mark.usefixtures("short_busy_timeout")
@pytest.mark.parametrize("with_reconcile", [True, False], ids=["reconcile", "no-reconcile"])
def test_a_lock_taken_while_a_write_runs_loses_no_claim_and_never_repeats_the_write(
    db: str, tmp_path: Path, locker: Locker, with_reconcile: bool
):
    """The lock lands after the side effect, so recording its outcome (`ledger.finish`) times out.

    The claim stays (state `claimed`): on resume the write is not run again; reconcile finds it, or, without
    reconcile, a person is asked.
    """
    effects = Effects(tmp_path / "effects.sqlite")
    overrides = {} if with_reconcile else {"reconcile": None}
    with open_sqlite(db) as saver:
        graph = graph_with_book(saver, effects, once(locker.lock), **overrides)
        assert "__interrupt__" in runs.start(graph, THREAD, "book 2 seats")
        with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Adatabase is locked$"):
            runs.resume(graph, THREAD, APPROVE)
        assert effects_per_key(effects) == {KEY: 1}
        assert [(e.state, e.attempts) for e in saver.ledger.entries(THREAD)] == [("claimed", 1)]
        assert graph.get_state(runs.config_for(THREAD)).next == ("execute",)
        locker.release()
        if with_reconcile:
            finish_and_check(graph, effects, answer=None)
            return
        out = runs.resume(graph, THREAD)
        request = out["__interrupt__"][0].value
        assert request["kind"] == "unknown_outcome"
        assert [(c["tool_call_id"], c["idempotency_key"]) for c in request["calls"]] == [("c1_0", KEY)]
        assert effects_per_key(effects) == {KEY: 1}
        finish_and_check(graph, effects, {"decisions": [{"type": "done", "result": {"booking": 1}}]})


# ------------------------------------------------------------------------------------- 2. read-only


@needs_root
def test_a_read_only_mount_refuses_to_open_and_the_thread_resumes_once_writable(tmp_path: Path, mounts: list[Path]):
    """A read-only bind mount (EROFS: even root cannot write), toggled on and off over the same path."""
    store, point = tmp_path / "store", tmp_path / "mnt"
    store.mkdir()
    point.mkdir()
    mount("--bind", str(store), str(point))
    mounts.append(point)
    db = str(point / "runs.sqlite")
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        paused_thread(saver, effects)
    stored = (store / "runs.sqlite").read_bytes()

    mount("-o", "remount,bind,ro", str(point))
    with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Aunable to open database file$"), open_sqlite(db):
        pass
    assert (store / "runs.sqlite").read_bytes() == stored
    assert effects.rows() == []

    mount("-o", "remount,bind,rw", str(point))
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        assert saver.ledger.entries(THREAD) == []
        assert pending_actions(graph)[0]["tool_call_id"] == "c1_0"
        finish_and_check(graph, effects)


def resume_without_dac_override(db: str, effects: Effects) -> dict[str, Any]:
    """Resume in a child process that is root but subject to file modes (it drops DAC override itself:
    support/no_dac_resume.py), forked from the preloaded server like the crash tests' children."""
    from preloaded import run

    done = run([sys.executable, str(Path(SUPPORT) / "no_dac_resume.py"), db, effects.path], dict(os.environ), 120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_root
def test_a_read_only_file_fails_the_first_write_and_the_thread_resumes_once_writable(db: str, tmp_path: Path):
    """chmod 0444 on the file; the resumer is a process without CAP_DAC_OVERRIDE, so the mode applies.

    SQLite opens the file read-only without complaint; the first write (the approval's audit record) fails.
    It also creates the -wal/-shm files with the database's mode (0444), so the fault is gone only when all
    three files are writable again (making only the database writable is not enough).
    """
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        before = checkpoint_ids(paused_thread(saver, effects))
    os.chmod(db, 0o444)

    readonly = {"ok": False, "type": "sqlite3.OperationalError", "message": "attempt to write a readonly database"}
    assert resume_without_dac_override(db, effects) == readonly
    assert effects.rows() == []
    modes = {suffix: Path(db + suffix).stat().st_mode & 0o777 for suffix in ("", "-wal", "-shm")}
    assert modes == {"": 0o444, "-wal": 0o444, "-shm": 0o444}

    os.chmod(db, 0o644)  # half a fix: the read-only -shm left by the failed attempt still refuses writes
    assert resume_without_dac_override(db, effects) == readonly
    assert effects.rows() == []

    for suffix in ("-wal", "-shm"):
        os.chmod(db + suffix, 0o644)
    assert resume_without_dac_override(db, effects) == {"ok": True, "status": "completed"}
    with open_sqlite(db) as saver:
        graph = build(saver, effects)
        assert set(before) <= set(checkpoint_ids(graph))
        assert effects_per_key(effects) == {KEY: 1}
        assert [(e.state, e.attempts) for e in saver.ledger.entries(THREAD)] == [("done", 1)]
        assert runs.output(graph, THREAD)["status"] == "completed"


# ------------------------------------------------------------------------------------- 3. disk full


@pytest.fixture
def small_disk(tmp_path: Path, mounts: list[Path]) -> Path:
    point = tmp_path / "disk"
    point.mkdir()
    mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(point))
    mounts.append(point)
    return point


@needs_root
def test_a_full_disk_fails_the_approval_cleanly_and_the_thread_resumes_once_space_is_freed(
    small_disk: Path, tmp_path: Path
):
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(small_disk / "runs.sqlite") as saver:
        graph = paused_thread(saver, effects)
        before, actions = checkpoint_ids(graph), pending_actions(graph)
        filler = fill_disk(small_disk)
        with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Adatabase or disk is full$"):
            runs.resume(graph, THREAD, APPROVE)
        assert checkpoint_ids(graph) == before
        assert pending_actions(graph) == actions
        assert saver.ledger.entries(THREAD) == []
        assert effects.rows() == []
        filler.unlink()
        finish_and_check(graph, effects)


@needs_root
def test_a_disk_that_fills_after_a_write_keeps_its_outcome_and_the_write_is_not_repeated(
    small_disk: Path, tmp_path: Path
):
    """The disk fills during the model call that follows the write, so that step's checkpoint write fails."""
    effects = Effects(tmp_path / "effects.sqlite")
    fillers: list[Path] = []
    fill = once(lambda: fillers.append(fill_disk(small_disk)))

    def responder(messages: list[BaseMessage]) -> Any:
        if isinstance(messages[-1], ToolMessage):
            fill()
        return booking_responder(messages)

    with open_sqlite(small_disk / "runs.sqlite") as saver:
        graph = paused_thread(saver, effects, responder=responder)
        with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Adatabase or disk is full$"):
            runs.resume(graph, THREAD, APPROVE)
        snapshot = graph.get_state(runs.config_for(THREAD))
        assert snapshot.next == ("model",)
        assert [m.type for m in snapshot.values["messages"]] == ["human", "ai", "tool"]
        assert effects_per_key(effects) == {KEY: 1}
        assert [(e.state, e.attempts) for e in saver.ledger.entries(THREAD)] == [("done", 1)]
        fillers[0].unlink()
        finish_and_check(graph, effects, answer=None)


# --------------------------------------------------------------------------- 4. corrupted checkpoint


# Observed (langgraph-checkpoint-sqlite 3.1.2, ormsgpack): ValueError("unexpected end of file"),
# ValueError("invalid type Reserved"), TypeError("'int' object is not subscriptable"): a load error that names
# neither the thread nor the checkpoint. Only "it fails to load" is pinned here.
CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda blob: blob[: len(blob) // 2],
    "garbage": lambda blob: b"\xc1" * 16,
    "zeroed": lambda blob: bytes(len(blob)),
}
LOAD_ERRORS = (ValueError, TypeError)


def corrupt_latest(db: str, graph: Any, damage: Callable[[bytes], bytes]) -> str:
    latest = checkpoint_ids(graph)[0]
    with sqlite3.connect(db) as conn:
        (blob,) = conn.execute(
            "SELECT checkpoint FROM checkpoints WHERE thread_id=? AND checkpoint_id=?", (THREAD, latest)
        ).fetchone()
        conn.execute(
            "UPDATE checkpoints SET checkpoint=? WHERE thread_id=? AND checkpoint_id=?", (damage(blob), THREAD, latest)
        )
    return latest


def drop_checkpoint(db: str, checkpoint_id: str) -> None:
    """The recovery that works: remove the damaged checkpoint (and its writes); its parent becomes the latest."""
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM writes WHERE thread_id=? AND checkpoint_id=?", (THREAD, checkpoint_id))
        conn.execute("DELETE FROM checkpoints WHERE thread_id=? AND checkpoint_id=?", (THREAD, checkpoint_id))


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupted_latest_checkpoint_fails_to_load_and_the_thread_resumes_from_its_parent(
    db: str, tmp_path: Path, kind: str
):
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = paused_thread(saver, effects)
        actions = pending_actions(graph)
        history = checkpoint_ids(graph)
        bad = corrupt_latest(db, graph, CORRUPTIONS[kind])
        with pytest.raises(LOAD_ERRORS):
            graph.get_state(runs.config_for(THREAD))
        with pytest.raises(LOAD_ERRORS):
            runs.resume(graph, THREAD, APPROVE)
        assert saver.ledger.entries(THREAD) == []
        assert effects.rows() == []

        drop_checkpoint(db, bad)
        assert checkpoint_ids(graph) == history[1:]
        out = runs.resume(graph, THREAD)  # re-runs validate -> approve: the same request is asked again
        assert "__interrupt__" in out
        assert pending_actions(graph) == actions
        finish_and_check(graph, effects)


def test_a_corrupted_checkpoint_after_a_write_recovers_without_running_the_write_again(db: str, tmp_path: Path):
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = paused_thread(saver, effects)
        cfg = runs.config_for(THREAD)
        graph.invoke(Command(resume=APPROVE), cfg, interrupt_after=["execute"], durability="sync")
        assert graph.get_state(cfg).next == ("model",)
        assert effects_per_key(effects) == {KEY: 1}
        bad = corrupt_latest(db, graph, CORRUPTIONS["truncated"])
        with pytest.raises(LOAD_ERRORS):
            runs.resume(graph, THREAD)
        drop_checkpoint(db, bad)
        finish_and_check(graph, effects, answer=None)


# ------------------------------------------------------------------------------ 5. missing ledger table


def drop_ledger(db: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE gatedloop_ledger")


def test_a_dropped_ledger_table_stops_the_write_and_is_only_recreated_when_asked(db: str, tmp_path: Path):
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = paused_thread(saver, effects)
        drop_ledger(db)
        with pytest.raises(sqlite3.OperationalError, match=r"(?m)\Ano such table: gatedloop_ledger$"):
            runs.resume(graph, THREAD, APPROVE)
        assert effects.rows() == []  # the claim failed, so the write never started
        assert graph.get_state(runs.config_for(THREAD)).next == ("execute",)  # the approval is kept
    with pytest.raises(LedgerError, match="gatedloop_ledger\\) is missing"):
        open_sqlite(db).__enter__()
    with open_sqlite(db, recreate_ledger=True) as saver:
        assert saver.ledger.recreated and saver.ledger.entries(THREAD) == []
        graph = build(saver, effects)
        finish_and_check(graph, effects, answer=None)


@pytest.mark.usefixtures("short_busy_timeout")
def test_a_write_claimed_in_a_ledger_that_was_then_lost_is_not_run_again(db: str, tmp_path: Path, locker: Locker):
    """The claim of a write that really happened is lost with the table; after an explicit recreate, the write
    is reconciled with its system before it runs, and found done."""
    effects = Effects(tmp_path / "effects.sqlite")
    with open_sqlite(db) as saver:
        graph = graph_with_book(saver, effects, once(locker.lock))
        runs.start(graph, THREAD, "book 2 seats")
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            runs.resume(graph, THREAD, APPROVE)
        locker.release()
        assert [e.state for e in saver.ledger.entries(THREAD)] == ["claimed"]
    drop_ledger(db)
    with open_sqlite(db, recreate_ledger=True) as saver:
        graph = graph_with_book(saver, effects, lambda: None)
        runs.resume(graph, THREAD)
    assert effects_per_key(effects) == {KEY: 1}
