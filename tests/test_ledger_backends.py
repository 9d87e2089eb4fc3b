"""The ledger on each backend (`backend`: SQLite and Postgres): one test body per behaviour, as both backends
run one set of queries (`SqlLedger`); what differs is only the mechanics under them.

Every ledger operation, including the repeats that must change nothing, and claims raced by real processes:
one winner per call, and of the processes reclaiming a call at the same attempt count, one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from backends import SUPPORT, Backend, claim_command
from crash_child import Child, ChildRun
from langgraph.checkpoint.base import empty_checkpoint
from pg_server import new_thread_id

from gatedloop.checkpoints.ledger import idempotency_key
from gatedloop.checkpoints.threads import unsettled_writes

pytestmark = pytest.mark.slow


def entry(e: Any) -> Any:
    """A ledger entry without its timestamps and claimant."""
    return None if e is None else (e.call_id, e.tool, e.state, e.result, e.attempts, e.idempotency_key)


def test_every_ledger_operation_including_repeats_that_change_nothing(backend: Backend):
    thread_id = new_thread_id("ledger")
    key_a, key_b = idempotency_key(thread_id, "a"), idempotency_key(thread_id, "b")
    ledger = backend.ledger()
    try:
        won, first = ledger.claim(thread_id, "a", "book", "d1")
        assert (won, entry(first)) == (True, ("a", "book", "claimed", None, 1, key_a))
        assert first.claimant == ledger.claimant and ledger.claimant_alive(first.claimant)
        won, again = ledger.claim(thread_id, "a", "other", "d2")  # the first claim stands, as it was
        assert (won, entry(again)) == (False, ("a", "book", "claimed", None, 1, key_a))
        assert again.args_digest == "d1"

        # a reclaim wins only at the attempt count the caller saw, once
        assert [ledger.reclaim(thread_id, "a", n) for n in (2, 1, 1)] == [False, True, False]
        ledger.finish(thread_id, "a", "done", {"booking": 7, "note": "é"})
        ledger.finish(thread_id, "a", "failed", {"booking": 8})  # a second finish is ignored
        assert ledger.reclaim(thread_id, "a", 2) is False  # a finished call is never started again
        done = ("a", "book", "done", json.dumps({"booking": 7, "note": "é"}, ensure_ascii=False), 2, key_a)
        assert entry(ledger.get(thread_id, "a")) == done
        assert ledger.get(thread_id, "zz") is None

        ledger.claim(thread_id, "b", "book", "d3")
        ledger.finish(thread_id, "b", "abandoned", {"why": None})
        abandoned = ("b", "book", "abandoned", '{"why": null}', 1, key_b)
        assert [entry(e) for e in ledger.entries(thread_id)] == [done, abandoned]
        assert ledger.entries(new_thread_id("ledger")) == []

        ledger.record(thread_id, "a", "executed", {"n": 1}, "alice")
        ledger.record(thread_id, "a", "executed", {"n": 2}, "bob")  # the same (call, event) is kept once
        ledger.record(thread_id, "b", "refused", {"x": [1, 2]})
        assert [{k: v for k, v in item.items() if k != "at"} for item in ledger.audit(thread_id)] == [
            {"call_id": "a", "event": "executed", "actor": "alice", "detail": {"n": 1}},
            {"call_id": "b", "event": "refused", "actor": None, "detail": {"x": [1, 2]}},
        ]

        assert ledger.cancel_requested(thread_id) is False
        ledger.request_cancel(thread_id)
        ledger.request_cancel(thread_id)
        assert ledger.cancel_requested(thread_id) is True
        ledger.clear_cancel(thread_id)
        assert ledger.cancel_requested(thread_id) is False
        assert ledger.recreated is False
    finally:
        ledger.close()


def test_thread_ids_lists_threads_with_a_checkpoint_oldest_activity_first(backend: Backend):
    from gatedloop.checkpoints.contract import GatedSaver

    older, newer = new_thread_id("listed"), new_thread_id("listed")
    with backend.open() as saver:
        assert isinstance(saver, GatedSaver)
        saver.ledger.claim(new_thread_id("ledger-only"), "c", "book", "d")  # a ledger row is not a thread
        for thread_id in (older, newer, older):
            config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            latest = saver.get_tuple(config)
            saver.put(latest.config if latest else config, empty_checkpoint(), {}, {})
        listed = [t for t in saver.thread_ids() if t.startswith("listed-")]
    assert listed[-2:] == [newer, older]


def test_claims_raced_by_many_processes_have_one_winner_each(backend: Backend, tmp_path: Path):
    """Six processes claim the same 40 calls at the same moment, then race to reclaim each at attempt 1."""
    thread_id, calls, racers = new_thread_id("claims"), 40, 6
    backend.ledger().close()  # tables made before the race

    def race(*extra: str) -> list[ChildRun]:
        barrier = tmp_path / ("-".join(extra) or "claim")
        barrier.mkdir()
        command = claim_command(backend.child_db, thread_id, calls, str(barrier), *extra)
        children = [Child(command, tmp_path / f"claim{i}{extra}.err") for i in range(racers)]
        for child in children:
            assert child.wait_for("ready") is not None, child.wait().stderr[-2000:]
        Path(barrier, "go").touch()
        results = [child.wait() for child in children]
        assert all(r.returncode == 0 and r.last() == "finished" for r in results), [r.stderr[-800:] for r in results]
        return results

    for extra in ((), ("--reclaim", "1")):
        won = Counter(line.split()[1] for run in race(*extra) for line in run.markers("won"))
        assert won == Counter({f"c{i}": 1 for i in range(calls)}), (extra, won)
    ledger = backend.ledger()
    try:
        entries = ledger.entries(thread_id)
    finally:
        ledger.close()
    assert len(entries) == calls
    assert {(e.state, e.attempts) for e in entries} == {("claimed", 2)}


CLAIM_AND_EXIT = (
    "import sys; from backends import open_ledger; ledger = open_ledger(sys.argv[1]); "
    "ledger.claim(sys.argv[2], 'gone', 'book', 'd'); ledger.close()"
)


def test_a_claim_whose_process_ended_is_told_apart_from_one_still_running(backend: Backend):
    """`gatedloop threads` explains a thread's unfinished writes with the backend's own liveness check."""
    thread_id = new_thread_id("unsettled")
    subprocess.run([sys.executable, "-c", CLAIM_AND_EXIT, backend.child_db, thread_id], cwd=SUPPORT, check=True)
    ledger = backend.ledger()
    try:
        ledger.claim(thread_id, "here", "book", "d")
        assert unsettled_writes(ledger, thread_id) == [
            "a write to book was running when the process stopped; resume settles it",
            f"a write to book is running now (process {ledger.claimant})",
        ]
    finally:
        ledger.close()
