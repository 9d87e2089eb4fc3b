"""copy_thread, delete_for_runs and prune keep gatedloop's guarantees, on SQLite and Postgres (sync savers;
the async ones share their statements and are covered by tests/test_conformance.py and tests/test_server_ops.py).

- A copied thread has its own ledger rows: a write done in the source is reported in the copy, never run
  again; a write begun before the copy is reconciled with the key it was started with; calls the copy starts
  get keys of its own thread id.
- Deleting a run (LangGraph Server's rollback) or pruning never removes ledger or audit rows, and refuses to
  cut the history a kept checkpoint rebuilds its messages from.
- `keep_latest` on a thread whose messages are a DeltaChannel: a fresh process loads the same conversation
  and goes on from it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langgraph.types import Command
from pg_server import new_thread_id, require_postgres
from sample_app import Effects, build
from thread_child import LAST_QUESTION, asking_responder, open_saver, summary

from gatedloop.checkpoints.ledger import idempotency_key
from gatedloop.checkpoints.pruning import DeltaHistoryCut

SUPPORT = Path(__file__).parent / "support"
APPROVE = Command(resume={"decisions": [{"type": "approve"}], "reviewer": "ana"})
CALL = "c1_0"
TURNS = 30  # about 4 messages updates a turn: past the DeltaChannel's first snapshot (100 updates)


@dataclass
class Backend:
    name: str
    db: str
    saver: Any
    effects: Effects

    def graph(self, responder: Any = None) -> Any:
        return build(self.saver, self.effects) if responder is None else build(self.saver, self.effects, responder)

    def checkpoints(self, thread_id: str) -> list[Any]:
        return list(self.saver.list(cfg(thread_id)))

    def effect_keys(self) -> list[str | None]:
        return [key for _, _, key in self.effects.rows("book")]


def cfg(thread_id: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, **extra}


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    db = require_postgres() if request.param == "postgres" else str(tmp_path / "runs.sqlite")
    with open_saver(request.param, db) as saver:
        yield Backend(request.param, db, saver, Effects(tmp_path / "effects.sqlite"))


def paused_for_approval(backend: Backend, thread_id: str, text: str = "book 1 seat", **config: Any) -> None:
    out = backend.graph().invoke({"messages": [("user", text)]}, cfg(thread_id, **config), durability="sync")
    assert out["__interrupt__"][0].value["kind"] == "approval"


def tool_result(out: dict[str, Any], call_id: str = CALL) -> str:
    [message] = [m for m in out["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    return str(message.content)


# --- copy_thread ------------------------------------------------------------------------------------------------


def test_a_write_done_in_the_source_is_reported_in_the_copy_never_run_again(backend: Backend) -> None:
    source, copy = new_thread_id("src"), new_thread_id("copy")
    graph = backend.graph()
    paused_for_approval(backend, source)
    done = graph.invoke(APPROVE, cfg(source), durability="sync")
    assert done["status"] == "completed"
    assert backend.effect_keys() == [idempotency_key(source, CALL)]

    backend.saver.copy_thread(source, copy)

    assert [c.checkpoint["id"] for c in backend.checkpoints(copy)] == [
        c.checkpoint["id"] for c in backend.checkpoints(source)
    ]
    [row] = backend.saver.ledger.entries(copy)
    assert (row.call_id, row.state, row.idempotency_key) == (CALL, "done", idempotency_key(source, CALL))
    assert [a["event"] for a in backend.saver.ledger.audit(copy)] == [
        a["event"] for a in backend.saver.ledger.audit(source)
    ]
    # Replay the copy from just before `execute`: the write's claim in the copy finds the copied row.
    [before_execute] = [s for s in graph.get_state_history(cfg(copy)) if s.next == ("execute",)]
    replayed = graph.invoke(None, before_execute.config, durability="sync")
    assert replayed["status"] == "completed"
    assert tool_result(replayed) == tool_result(done)
    assert backend.effect_keys() == [idempotency_key(source, CALL)], "the copy must not book again"


def test_calls_the_copy_runs_get_keys_of_its_own_thread(backend: Backend) -> None:
    source, copy = new_thread_id("src"), new_thread_id("copy")
    graph = backend.graph()
    paused_for_approval(backend, source)
    backend.saver.copy_thread(source, copy)
    assert backend.saver.ledger.entries(copy) == []

    for thread_id in (source, copy):
        assert graph.invoke(APPROVE, cfg(thread_id), durability="sync")["status"] == "completed"

    assert sorted(k or "" for k in backend.effect_keys()) == sorted(
        [idempotency_key(source, CALL), idempotency_key(copy, CALL)]
    )
    assert idempotency_key(source, CALL) != idempotency_key(copy, CALL)


def test_a_write_begun_before_the_copy_is_reconciled_with_the_key_it_was_started_with(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's process claimed the write, booked it and died before recording the outcome."""
    source, copy = new_thread_id("src"), new_thread_id("copy")
    paused_for_approval(backend, source)
    dead = f"{socket.gethostname()}:999999999:0"
    monkeypatch.setattr(type(backend.saver.ledger), "claimant", property(lambda self: dead))
    won, _ = backend.saver.ledger.claim(source, CALL, "book", "digest")
    monkeypatch.undo()
    assert won and not backend.saver.ledger.claimant_alive(dead)
    backend.effects.add("book", {"item": "seat", "quantity": 1}, idempotency_key(source, CALL))

    backend.saver.copy_thread(source, copy)
    out = backend.graph().invoke(APPROVE, cfg(copy), durability="sync")

    assert out["status"] == "completed"
    assert json.loads(tool_result(out))["booking"] == 1
    assert backend.effect_keys() == [idempotency_key(source, CALL)], "reconciled, not booked again"
    [row] = backend.saver.ledger.entries(copy)
    assert (row.state, row.idempotency_key) == ("done", idempotency_key(source, CALL))


def test_an_approval_of_a_write_not_started_stays_with_the_source_and_the_copy_asks_again(backend: Backend) -> None:
    """One approval authorizes one write: in the copy the same call would run again under a new key."""
    source, copy = new_thread_id("src"), new_thread_id("copy")
    graph = backend.graph()
    paused_for_approval(backend, source)
    graph.invoke(APPROVE, cfg(source), durability="sync", interrupt_before=["execute"])
    assert graph.get_state(cfg(source)).next == ("execute",)

    backend.saver.copy_thread(source, copy)
    asked = graph.invoke(None, cfg(copy), durability="sync")
    done = graph.invoke(None, cfg(source), durability="sync")

    assert asked["__interrupt__"][0].value["kind"] == "approval"
    assert done["status"] == "completed"
    assert backend.effect_keys() == [idempotency_key(source, CALL)]


def test_copy_into_a_thread_that_has_checkpoints_is_refused_and_changes_nothing(backend: Backend) -> None:
    source, other = new_thread_id("src"), new_thread_id("other")
    paused_for_approval(backend, source)
    paused_for_approval(backend, other)
    before = len(backend.checkpoints(other))
    with pytest.raises(ValueError, match="already has checkpoints"):
        backend.saver.copy_thread(source, other)
    assert len(backend.checkpoints(other)) == before


# --- delete_for_runs --------------------------------------------------------------------------------------------


def test_deleting_a_run_keeps_the_ledger_so_its_write_is_reported_not_rerun(backend: Backend) -> None:
    thread_id = new_thread_id("rollback")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    graph = backend.graph()
    paused_for_approval(backend, thread_id, metadata={"run_id": first})
    done = graph.invoke(APPROVE, cfg(thread_id, metadata={"run_id": second}), durability="sync")
    assert done["status"] == "completed"
    audit = backend.saver.ledger.audit(thread_id)

    with pytest.raises(DeltaHistoryCut):
        backend.saver.delete_for_runs([first])  # the second run's checkpoints rebuild messages from the first's
    backend.saver.delete_for_runs([second])

    runs = {c.metadata.get("run_id") for c in backend.checkpoints(thread_id)}
    assert runs == {first}
    assert backend.saver.ledger.audit(thread_id) == audit
    assert [e.state for e in backend.saver.ledger.entries(thread_id)] == ["done"]
    again = graph.invoke(None, cfg(thread_id), durability="sync")
    assert again["status"] == "completed"
    assert tool_result(again) == tool_result(done)
    assert backend.effect_keys() == [idempotency_key(thread_id, CALL)]


# --- prune ------------------------------------------------------------------------------------------------------


def test_keep_latest_keeps_what_the_delta_messages_need_and_a_fresh_process_goes_on(backend: Backend) -> None:
    thread_id = new_thread_id("long")
    graph = backend.graph(asking_responder)
    for turn in range(TURNS):
        out = graph.invoke({"messages": [("user", f"ask q{turn}")]}, cfg(thread_id), durability="sync")
        assert out["status"] == "completed"
    conversation = summary(out["messages"])
    before = backend.checkpoints(thread_id)
    audit = backend.saver.ledger.audit(thread_id)

    backend.saver.prune([thread_id], strategy="keep_latest")

    kept = backend.checkpoints(thread_id)
    assert kept[0].checkpoint["id"] == before[0].checkpoint["id"]
    assert 1 < len(kept) < len(before) // 2, (len(kept), len(before))
    oldest = kept[-1]
    assert oldest.parent_config is None
    assert "messages" in oldest.checkpoint["channel_values"], "the chain ends at the messages snapshot"
    assert all("messages" not in c.checkpoint["channel_values"] for c in kept[:-1])
    assert backend.saver.ledger.audit(thread_id) == audit

    child_db = "env" if backend.name == "postgres" else backend.db
    command = [
        sys.executable,
        str(SUPPORT / "thread_child.py"),
        backend.name,
        child_db,
        backend.effects.path,
        thread_id,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=SUPPORT)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, after = (json.loads(line) for line in done.stdout.splitlines())
    assert loaded["loaded"] == conversation
    assert after["status"] == "completed"
    assert after["after"][: len(conversation)] == conversation
    assert after["after"][len(conversation)][2] == LAST_QUESTION
    assert after["after"][-1][2] == f"answer: {LAST_QUESTION.removeprefix('ask ')}"


def test_prune_delete_removes_the_checkpoints_but_not_the_ledger(backend: Backend) -> None:
    thread_id, other = new_thread_id("gone"), new_thread_id("stays")
    graph = backend.graph()
    paused_for_approval(backend, thread_id)
    graph.invoke(APPROVE, cfg(thread_id), durability="sync")
    paused_for_approval(backend, other)
    before_other = [c.checkpoint["id"] for c in backend.checkpoints(other)]

    backend.saver.prune([thread_id], strategy="delete")

    assert backend.checkpoints(thread_id) == []
    assert [c.checkpoint["id"] for c in backend.checkpoints(other)] == before_other
    assert [e.state for e in backend.saver.ledger.entries(thread_id)] == ["done"]
    with pytest.raises(ValueError, match="Unknown prune strategy"):
        backend.saver.prune([other], strategy="keep_some")
    with pytest.raises(TypeError):
        backend.saver.prune(other)


# --- the async savers' sync bridges -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_async_savers_sync_methods_run_on_their_loop_from_another_thread(kind: str, tmp_path: Path) -> None:
    async def main() -> tuple[list[str], list[str]]:
        if kind == "postgres":
            from gatedloop.checkpoints.postgres import open_async_postgres

            opened: Any = open_async_postgres(require_postgres())
        else:
            from gatedloop.checkpoints import open_async_sqlite

            opened = open_async_sqlite(tmp_path / "async.sqlite", on_loop=False)  # the aiosqlite saver
        async with opened as saver:
            graph = build(saver, Effects(tmp_path / "effects.sqlite"), asking_responder)
            source, copy = new_thread_id("src"), new_thread_id("copy")
            await graph.ainvoke({"messages": [("user", "ask q")]}, cfg(source), durability="sync")
            with pytest.raises(asyncio.InvalidStateError):
                saver.copy_thread(source, copy)  # from the loop's own thread it would deadlock
            await asyncio.to_thread(saver.copy_thread, source, copy)
            await asyncio.to_thread(saver.prune, [copy])
            await asyncio.to_thread(saver.delete_for_runs, [str(uuid.uuid4())])
            values = [(await graph.aget_state(cfg(t))).values for t in (source, copy)]
            return [summary(v["messages"]) for v in values]

    original, copied = asyncio.run(main())
    assert copied == original and len(original) == 4


def test_the_on_loop_savers_async_thread_ops_copy_prune_and_roll_back_in_place(tmp_path: Path) -> None:
    """`open_async_sqlite`'s default saver runs LangGraph Server's thread operations in place on the loop."""
    from gatedloop.checkpoints import open_async_sqlite

    async def main() -> tuple[list[str], list[str], int]:
        async with open_async_sqlite(tmp_path / "async.sqlite") as saver:
            graph = build(saver, Effects(tmp_path / "effects.sqlite"), asking_responder)
            source, copy = new_thread_id("src"), new_thread_id("copy")
            await graph.ainvoke({"messages": [("user", "ask q")]}, cfg(source))
            await saver.acopy_thread(source, copy)
            await saver.aprune([copy])
            await saver.adelete_for_runs([str(uuid.uuid4())])
            values = [(await graph.aget_state(cfg(t))).values for t in (source, copy)]
            await saver.aprune([copy], strategy="delete")
            left = len([c async for c in saver.alist(cfg(copy))])
            return *[summary(v["messages"]) for v in values], left  # type: ignore[return-value]

    original, copy, left = asyncio.run(main())
    assert copy == original and len(original) == 4
    assert left == 0
