"""The tutorial (docs/tutorial.md) as a reader runs it: its scripts in examples/tutorial/, each in a process of its
own on one real SQLite file, and its served agent under the real `langgraph dev`, driven by the script it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parent.parent / "examples" / "tutorial"


def run(script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GATEDLOOP_MODEL", "OPENAI_API_KEY", "PYTHONPATH")}
    done = subprocess.run(
        [sys.executable, script, *args], cwd=TUTORIAL, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_agent_stops_at_the_refund_and_a_reviewer_in_another_process_approves_it_once(tmp_path: Path):
    db = str(tmp_path / "shop.sqlite")
    asked = run("step1_ask.py", db, "t1")
    assert "waiting: refund {'order_id': 'A-1001', 'amount': 42.0} (approvers: ('finance',))" in asked
    assert "if approved, it refunds 42.00 EUR on order A-1001" in asked and "paused" in asked
    decided = run("step2_decide.py", db, "t1")
    assert "ana's approval refused: refund (" in decided and "needs one of the roles ['finance']" in decided
    assert 'status: completed; answer: Done: {"refunded": 42.0, "order_id": "A-1001"}' in decided
    assert "refunds made: [{'order_id': 'A-1001', 'amount': 42.0}]" in decided  # once, in the process that ran it


@pytest.mark.slow
def test_the_served_agent_is_asked_and_approved_through_langgraph_dev(tmp_path: Path):
    from devserver import run_dev_server

    env = {"GATEDLOOP_DB": str(tmp_path / "studio.sqlite"), "GATEDLOOP_AUTH_TOKENS": None, "GATEDLOOP_AUTH_FILE": None}
    with run_dev_server(TUTORIAL, env=env, workdir=tmp_path / "server") as url:
        out = run("serve_client.py", url)
    assert 'status: completed; answer: Done: {"refunded": 42.0, "order_id": "A-1001"}' in out
