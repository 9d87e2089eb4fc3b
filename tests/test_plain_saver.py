"""No saver loses an approval silently (invariant 12; issue 22, item 3): `build_graph` gives a plain `SqliteSaver`
gatedloop's ledger in the same file, an in-memory saver an in-memory ledger, and refuses any other saver with what
to pass instead. Pausing in one real process and approving in another runs the approved write exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from sample_app import Effects, build

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.ledger import LedgerError, SqliteLedger

SUPPORT = Path(__file__).resolve().parent / "support"

CHILD = textwrap.dedent(
    """
    import json, sqlite3, sys
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command
    from sample_app import Effects, build

    db, effects, step = sys.argv[1:4]
    graph = build(SqliteSaver(sqlite3.connect(db, check_same_thread=False)), Effects(effects))
    cfg = {"configurable": {"thread_id": "t1"}}
    if step == "start":
        out = graph.invoke({"messages": [("user", "book 2 seat, 1 lunch")]}, cfg)
    else:
        out = graph.invoke(Command(resume={"decisions": [{"type": "approve"}, {"type": "approve"}]}), cfg)
    answers = {m.tool_call_id: [m.status, json.loads(m.content)] for m in out["messages"] if m.type == "tool"}
    print(json.dumps({"paused": "__interrupt__" in out, "status": out.get("status"), "answers": answers}))
    """
)


def run_child(db: Path, effects: Path, step: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(db), str(effects), step],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(SUPPORT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_plain_sqlite_saver_paused_in_one_process_runs_the_approved_writes_once_in_another(tmp_path: Path):
    db, effects = tmp_path / "runs.sqlite", tmp_path / "effects.sqlite"
    paused = run_child(db, effects, "start")
    assert paused["paused"] and paused["answers"] == {}
    resumed = run_child(db, effects, "approve")
    assert resumed["status"] == "completed"
    assert [status for status, _ in resumed["answers"].values()] == ["success", "success"]
    assert sorted((args["item"], args["quantity"]) for _, args, _ in Effects(effects).rows()) == [
        ("lunch", 1),
        ("seat", 2),
    ]
    with sqlite3.connect(db) as conn:  # the ledger lives in the saver's own file
        assert conn.execute("SELECT call_id, state FROM gatedloop_ledger ORDER BY call_id").fetchall() == [
            ("c1_0", "done"),
            ("c1_1", "done"),
        ]


def test_an_in_memory_saver_gets_an_in_memory_ledger(tmp_path: Path):
    graph = build(InMemorySaver(), Effects(tmp_path / "effects.sqlite"))
    cfg = {"configurable": {"thread_id": "t1"}}
    assert graph.invoke({"messages": [("user", "book 1 seat")]}, cfg)["__interrupt__"]


def _kept_in_files(folder: Path) -> InMemorySaver:
    """An in-memory saver that keeps its checkpoints in files, as `langgraph dev`'s does (in `.langgraph_api/`):
    each store a `PersistentDict`, loaded when made, written out by `sync()`."""
    count = itertools.count()

    def store(*args: Any) -> PersistentDict:
        kept = PersistentDict(*args, filename=str(folder / f".langgraph_checkpoint.{next(count)}.pckl"))
        with contextlib.suppress(FileNotFoundError):
            kept.load()
        return kept

    return InMemorySaver(factory=store)


def test_an_in_memory_saver_that_keeps_its_checkpoints_in_files_keeps_its_ledger_beside_them(tmp_path: Path):
    """Its checkpoints outlive the process, so its ledger must too (invariant 12): an approval asked before a
    restart is answered after it, and runs once (an in-memory ledger answered it "never validated")."""
    effects = Effects(tmp_path / "effects.sqlite")
    cfg = {"configurable": {"thread_id": "t1"}}
    before = _kept_in_files(tmp_path)
    assert build(before, effects).invoke({"messages": [("user", "book 1 seat")]}, cfg)["__interrupt__"]
    for kept in (before.storage, before.writes, before.blobs):
        kept.sync()
    assert (tmp_path / "gatedloop-ledger.sqlite").is_file()
    after = build(_kept_in_files(tmp_path), effects)  # a new process would make the same
    out = after.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert out["status"] == "completed"
    assert [(args["item"], args["quantity"]) for _, args, _ in effects.rows()] == [("seat", 1)]
    after.invoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg)
    assert len(effects.rows()) == 1


def test_a_saver_gatedloop_cannot_give_a_durable_ledger_is_refused_with_what_to_use(tmp_path: Path):
    async def refused() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "runs.sqlite")) as saver:
            with pytest.raises(ValueError, match=r"AsyncSqliteSaver.*open_async_sqlite\(path\).*ledger="):
                build(saver, Effects(tmp_path / "effects.sqlite"))

    asyncio.run(refused())


def test_an_existing_sqlite_saver_file_without_a_ledger_says_how_to_adopt_it(tmp_path: Path):
    """A file a plain SqliteSaver wrote before gatedloop: its writes in flight are unknown, so nothing is guessed."""
    db = tmp_path / "runs.sqlite"
    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    saver.setup()
    saver.conn.execute("INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id) VALUES ('old', '', '1')")
    saver.conn.commit()
    with pytest.raises(LedgerError, match=r"recreate=True"):
        build(saver, Effects(tmp_path / "effects.sqlite"))
    ledger = SqliteLedger(db, recreate=True)
    graph = build(saver, Effects(tmp_path / "effects.sqlite"))
    assert graph.invoke({"messages": [("user", "book 1 seat")]}, {"configurable": {"thread_id": "t2"}})["__interrupt__"]
    ledger.close()


def test_a_graph_built_without_a_checkpointer_keeps_its_ledger_with_the_checkpointer_each_run_is_given(tmp_path):
    """As LangGraph Server serves a graph: compiled with no checkpointer, given one per run (gatedloop's, as the
    shipped langgraph.json does). The calls and approvals go to that checkpointer's database, so another process
    (a plain SqliteSaver on the same file) approves and runs the writes exactly once."""
    db, effects = tmp_path / "served.sqlite", tmp_path / "effects.sqlite"
    served = build(None, Effects(effects))
    with open_sqlite(db) as saver:
        graph = served.copy(update={"checkpointer": saver})  # what the server does with each run's checkpointer
        cfg = {"configurable": {"thread_id": "t1"}}
        assert "__interrupt__" in graph.invoke({"messages": [("user", "book 2 seat, 1 lunch")]}, cfg)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM gatedloop_calls WHERE thread_id='t1'").fetchone()[0] == 2
    assert run_child(db, effects, "approve")["status"] == "completed"
    assert len(Effects(effects).rows()) == 2
