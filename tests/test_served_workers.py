"""A served graph with several workers keeps its approvals (issue 31's silent loss, invariant 12): built the way
docs/server.md says (no `ledger=`), served over LangGraph's own `AsyncPostgresSaver` as Aegra serves it, an
approval given in one worker process runs the approved write in another, once. Before, each worker kept
approvals in its own memory: the approving worker answered the call "never validated" and the thread ended
`completed` with the payment never made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pg_server import new_thread_id, require_postgres
from sample_app import Effects

from gatedloop.checkpoints.ledger_for import ledger_for

WORKER = Path(__file__).parent / "support" / "served_worker.py"
pytestmark = pytest.mark.slow


def worker(url: str, thread_id: str, action: str, effects: Path) -> dict:
    done = subprocess.run(
        [sys.executable, str(WORKER), url, thread_id, action, str(effects)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(WORKER.parent), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_approval_given_in_one_worker_runs_the_write_in_another_once(tmp_path: Path) -> None:
    url = require_postgres()
    thread_id = new_thread_id("served-workers")
    effects = tmp_path / "effects.sqlite"
    asked = worker(url, thread_id, "ask", effects)
    assert asked == {"status": None, "waits_on": "approval"}
    approved = worker(url, thread_id, "approve", effects)
    assert approved == {"status": "completed", "waits_on": None}
    assert [(args["amount"], args["to"]) for _, args, _ in Effects(effects).rows("pay")] == [(500.0, "bo")]


def test_langgraphs_postgres_saver_gets_the_ledger_in_its_own_database() -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    url = require_postgres()
    thread_id = new_thread_id("pg-saver-ledger")
    with PostgresSaver.from_conn_string(url) as saver:
        ledger = ledger_for(saver)
        ledger.record(thread_id, "c1", "probe", {"where": "saver's database"})
    with PostgresSaver.from_conn_string(url) as again:
        rows = ledger_for(again).audit(thread_id)
    assert [(row["event"], row["detail"]) for row in rows] == [("probe", {"where": "saver's database"})]
