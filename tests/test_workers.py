"""More than one worker on one Postgres: claims name a worker any other process can check, on any host.

A claimant is a session-level advisory lock its worker holds for as long as it lives, so liveness is asked
of the database, not of the local process table. `bench.workers --quick` runs 3 real worker processes on
16 threads with real SIGKILLs during writes and restarts, and checks every invariant from Postgres alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pg_server import new_thread_id, require_postgres

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from gatedloop.checkpoints.postgres import PostgresLedger
ledger = PostgresLedger(sys.argv[1], setup=False)
won, entry = ledger.claim(sys.argv[2], "c1", "book", "digest")
print(entry.claimant, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def pg_url() -> str:
    return require_postgres()


def test_a_claim_is_alive_while_its_worker_lives_and_dead_once_killed_whatever_host_it_names(pg_url: str):
    from gatedloop.checkpoints.postgres import WORKER_PREFIX, PostgresLedger

    thread_id = new_thread_id("worker-lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, pg_url, thread_id], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    ledger = PostgresLedger(pg_url, setup=False)
    try:
        assert holder.stdout is not None
        claimant = holder.stdout.readline().strip()
        assert claimant.startswith(WORKER_PREFIX) and claimant != ledger.claimant
        token, _host, pid = claimant.removeprefix(WORKER_PREFIX).split(":")
        elsewhere = f"{WORKER_PREFIX}{token}:another-host:{pid}"  # the host part is for people; never consulted
        assert ledger.entries(thread_id)[0].claimant == claimant
        assert ledger.claimant_alive(claimant) and ledger.claimant_alive(elsewhere)
        assert ledger.claimant_alive(claimant), "a check must not take the worker's lock from it"
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        deadline = time.monotonic() + 10
        while ledger.claimant_alive(claimant) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ledger.claimant_alive(claimant) and not ledger.claimant_alive(elsewhere)
        assert ledger.claimant_alive(ledger.claimant), "this process's own name stays alive"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        ledger.close()


def test_workers_killed_during_writes_leave_no_double_effect_no_unanswered_call_and_no_question(pg_url: str):
    env = {**os.environ, "GATEDLOOP_TEST_PG_URL": pg_url}
    done = subprocess.run(
        [sys.executable, "-m", "bench.workers", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    run = summary["with_kills"]
    assert run["double_effects"] == 0 and run["missing_effects"] == 0, run
    assert run["unanswered_calls"] == 0 and run["threads_incomplete"] == 0, run
    assert run["writes_sent_to_a_person"] == 0 and run["error_count"] == 0, run
    assert run["ledger_states"] == {"done": run["turns"]}, run
    # Kills land only while work is left: on a very slow or very fast machine fewer than the 3 planned may land; at
    # least one must, or this run proved nothing about recovery.
    assert 1 <= sum(run["kills_landed"].values()) <= 3, run
    assert done.returncode == 0, done.stderr[-3000:]
