"""Writes tests/data/threads_COMMIT.sqlite and threads_COMMIT.expected.json with the code of commit COMMIT (one
of COMMITS): threads in every stored situation a user can have mid-flight, for tests/test_stored_formats.py to
resume with today's code. Run from the repository root, with the old code in its own worktree and venv:

    git worktree add /tmp/old 1ee2d3b
    python3 -m venv /tmp/old/.venv && /tmp/old/.venv/bin/pip install -q -e '/tmp/old[test]'
    /tmp/old/.venv/bin/python tests/data/make_threads.py 1ee2d3b
    git worktree remove --force /tmp/old

It refuses to run with any other gatedloop than that commit's.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from stored_threads_app import COMMITS, FINANCE_ALICE, LOSSY, REQUESTER, REVIEWER, Effects, build

import gatedloop.graph.build
from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import runs

HERE = Path(__file__).parent


def require_commit(commit: str) -> None:
    if commit not in COMMITS:
        sys.exit(f"usage: make_threads.py COMMIT, one of {', '.join(COMMITS)}")
    source = Path(gatedloop.graph.build.__file__).resolve().parent
    head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    if not head.startswith(commit):
        sys.exit(f"gatedloop here is {source} at {head.strip() or 'no commit'}, not {commit}: see this file's top")


def pending(graph: Any, thread_id: str) -> dict[str, Any]:
    request = runs.pending_request(graph, thread_id)
    assert request is not None, f"{thread_id} is not paused"
    return request


def make_threads(graph: Any) -> None:
    """Each thread left the way a user could leave it (see tests/test_stored_formats.py for what each must do)."""
    runs.start(graph, "approval-pending", "pay 120 to bo", context=REQUESTER)
    assert pending(graph, "approval-pending")["kind"] == "approval"

    runs.start(graph, "quorum-partial", "wire 900 to cy", context=REQUESTER)
    runs.resume(graph, "quorum-partial", {"decisions": [{"type": "approve"}]}, context=FINANCE_ALICE)
    assert pending(graph, "quorum-partial")["action_requests"][0]["approved_by"] == ["alice"]

    runs.start(graph, "edit-pending", "wire 800 to dee", context=REQUESTER)
    edit = {"type": "edit", "edited_action": {"name": "wire", "args": {"amount": 750.0, "to": "dee"}}}
    runs.resume(graph, "edit-pending", {"decisions": [edit]}, context=FINANCE_ALICE)
    assert pending(graph, "edit-pending")["action_requests"][0]["args"] == {"amount": 750.0, "to": "dee"}

    runs.start(graph, "unknown-outcome", f"pay 300 to {LOSSY}", context=REQUESTER)
    runs.resume(graph, "unknown-outcome", {"decisions": [{"type": "approve"}]}, context=REVIEWER)
    assert pending(graph, "unknown-outcome")["kind"] == "unknown_outcome"

    runs.start(graph, "completed", "balance bo", context=REQUESTER)
    runs.start(graph, "completed", "pay 50 to bo", context=REQUESTER)
    runs.resume(graph, "completed", {"decisions": [{"type": "approve"}]}, context=REVIEWER)
    runs.start(graph, "completed", "pay 70 to eve", context=REQUESTER)
    reject = {"type": "reject", "message": "eve is not a supplier"}
    runs.resume(graph, "completed", {"decisions": [reject]}, context=REVIEWER)
    assert runs.output(graph, "completed")["status"] == "completed"

    runs.start(graph, "limit", "loop", context=REQUESTER)
    assert runs.output(graph, "limit")["status"] == "step_limit"


def expected(commit: str, graph: Any, saver: Any, thread_ids: list[str]) -> dict[str, Any]:
    """What each thread holds as this commit wrote it: status, pending request, ledger rows, audit events."""
    threads = {}
    for thread_id in thread_ids:
        out = runs.output(graph, thread_id)
        threads[thread_id] = {
            "status": out.get("status"),
            "state_keys": sorted(out.keys() - {"__interrupt__"}),
            "request": runs.pending_request(graph, thread_id),
            "ledger": [[e.call_id, e.tool, e.state, e.attempts] for e in saver.ledger.entries(thread_id)],
            "audit_events": [e["event"] for e in saver.ledger.audit(thread_id)],
        }
    return {"commit": commit, "threads": threads}


def main(commit: str) -> None:
    require_commit(commit)
    db, expected_json = HERE / f"threads_{commit}.sqlite", HERE / f"threads_{commit}.expected.json"
    db.unlink(missing_ok=True)
    Effects(db)
    thread_ids = ["approval-pending", "quorum-partial", "edit-pending", "unknown-outcome", "completed", "limit"]
    with open_sqlite(db) as saver:
        graph = build(saver, db)
        make_threads(graph)
        facts = expected(commit, graph, saver, thread_ids)
    facts["effects"] = Effects(db).rows()
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:  # one self-contained file, small
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("VACUUM")
    shutil.rmtree(f"{db}.leases", ignore_errors=True)
    expected_json.write_text(json.dumps(facts, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {db} ({db.stat().st_size} bytes) and {expected_json}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) == 2 else "")
