"""The `gatedloop` command: demo, run without a terminal, resume, threads, show, cancel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def cli(*args: str, db: str, check_code: int | None = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GATEDLOOP_MODEL": "demo", "OPENAI_API_KEY": ""}
    out = subprocess.run(
        [sys.executable, "-m", "gatedloop.cli.main", "--db", db, *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    if check_code is not None:
        assert out.returncode == check_code, out.stdout + out.stderr
    return out


def pending_id(db: str, thread_id: str) -> str:
    out = cli("resume", thread_id, "--approve", db=db, check_code=2)
    return out.stderr.split("--request ")[1].split()[0]


def test_a_non_interactive_answer_for_a_request_no_longer_pending_is_refused(tmp_path):
    """Finding 5: the reviewer was shown WS-101 for Ana; the user then asked for WS-102 for Mallory."""
    db = str(tmp_path / "runs.sqlite")
    cli("run", "Reserve a seat in workshop WS-101 for Ana", "--thread", "w5", db=db, check_code=3)
    shown = pending_id(db, "w5")
    cli("run", "Reserve a seat in workshop WS-102 for Mallory", "--thread", "w5", db=db, check_code=3)
    out = cli("resume", "w5", "--request", shown, "--approve", db=db, check_code=2)
    assert "no longer pending" in out.stderr and "reserve_seat" in out.stderr
    shown_history = cli("show", "w5", db=db).stdout
    assert "superseded" in shown_history and "Reserved" not in shown_history  # WS-101 superseded, nothing booked
    assert "waiting for approval" in cli("threads", db=db).stdout


def test_demo_runs_offline_shows_an_approval_and_a_resumed_thread(tmp_path):
    out = cli("demo", db=str(tmp_path / "demo.sqlite"))
    assert "Approval needed" in out.stdout
    assert "Resuming thread lunch-" in out.stdout and "in a new process" in out.stdout
    assert out.stdout.count("status: completed") >= 6
    assert "reviewer edits participant to Bob" in out.stdout and "for Bob" in out.stdout
    assert "rejected_by_reviewer" in out.stdout


def test_run_without_a_terminal_stops_and_prints_the_thread_and_the_request(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    out = cli("run", "Reserve a seat in workshop WS-101 for Alice", "--thread", "w1", db=db, check_code=3)
    assert "thread w1 is waiting" in out.stdout and "reserve_seat" in out.stdout
    assert "w1" in cli("threads", db=db).stdout and "waiting for approval" in cli("threads", db=db).stdout
    bad = cli("resume", "w1", "--edit", "{not json", db=db, check_code=2)
    assert "gatedloop:" in bad.stderr
    unnamed = cli("resume", "w1", "--approve", "--reviewer", "rita", db=db, check_code=2)
    assert "--request req-" in unnamed.stderr  # an answer must name the request the reviewer saw
    request_id = unnamed.stderr.split("--request ")[1].split()[0]
    done = cli("resume", "w1", "--request", request_id, "--approve", "--reviewer", "rita", db=db)
    assert "Reserved" in done.stdout and "status: completed" in done.stdout
    shown = cli("show", "w1", db=db).stdout
    assert "decision by rita: approve" in shown and "executed: ok" in shown
    drawn = cli("show", "w1", "--mermaid", db=db).stdout
    steps = [line.split('"')[1].split(". ", 1)[1] for line in drawn.splitlines() if '["' in line]
    assert steps == ["model", "validate", "approve (paused for a person)", "execute", "model", "finalize"]
    assert "done([completed])" in drawn


def test_resume_with_reject_and_a_reason(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    cli("run", "Reserve a seat in workshop WS-101 for Alice", "--thread", "w2", db=db, check_code=3)
    out = cli("resume", "w2", "--request", pending_id(db, "w2"), "--reject", "not this week", db=db)
    assert "not this week" in out.stdout


def test_cancel_stops_a_waiting_thread(tmp_path):
    db = str(tmp_path / "runs.sqlite")
    cli("run", "Reserve a seat in workshop WS-101 for Alice", "--thread", "w3", db=db, check_code=3)
    cli("cancel", "w3", db=db)
    out = cli("resume", "w3", "--request", pending_id(db, "w3"), "--approve", db=db, check_code=1)
    assert "cancelled" in out.stdout
    assert "cancelled" in cli("threads", db=db).stdout


@pytest.mark.parametrize("bad", ["../x", "a b", ""])
def test_bad_thread_ids_are_refused(tmp_path, bad):
    out = cli("show", bad, db=str(tmp_path / "runs.sqlite"), check_code=2)
    assert "invalid thread id" in out.stderr


def test_json_events(tmp_path):
    out = cli("--json", "run", "订单 ORD-2026-001 到哪里了?", "--thread", "j1", db=str(tmp_path / "r.sqlite"))
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    import json

    events = [json.loads(line) for line in lines]
    assert any(e["mode"] == "custom" and e["data"]["event"] == "tool_finished" for e in events)
    assert any(e["mode"] == "updates" and "finalize" in e["data"] for e in events)
