"""`gatedloop demo`: the articles' scenarios, offline, approvals answered automatically and shown.

The lunch booking pauses for approval and is resumed by a *separate process* by thread id alone, which
is the durability promise in one line of output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from gatedloop.cli.app import open_app
from gatedloop.demo import DEMO_QUESTIONS
from gatedloop.graph import runs
from gatedloop.graph.display import Display
from gatedloop.tools import CallContext

REVIEWER = "demo-reviewer"


def _banner(text: str) -> None:
    print(f"\n=== {text}")


def run_demo(db: str | None = None) -> int:
    os.environ["GATEDLOOP_MODEL"] = "demo"
    db = (
        db if db and db != "gatedloop.sqlite" else str(Path(tempfile.mkdtemp(prefix="gatedloop-demo-")) / "demo.sqlite")
    )
    print(f"gatedloop demo: scripted model, offline; checkpoints in {db}")
    suffix = uuid.uuid4().hex[:6]
    failures = 0
    with open_app(db) as (graph, _):
        for key in ("order", "trip", "math"):
            _banner(f"{key}: {DEMO_QUESTIONS[key]}")
            failures += _show_run(graph, f"{key}-{suffix}", DEMO_QUESTIONS[key]) != "completed"

        _banner(f"lunch (needs approval): {DEMO_QUESTIONS['lunch']}")
        lunch = f"lunch-{suffix}"
        _show_run(graph, lunch, DEMO_QUESTIONS["lunch"])
        request = runs.pending_request(graph, lunch)
        if request is None:
            print("expected an approval request")
            return 1
        print(Display.for_graph(graph).approval_table(request))
        print(f"-> paused. Resuming thread {lunch} in a new process with --approve (reviewer {REVIEWER}):")
    child = subprocess.run(
        [
            *(sys.executable, "-m", "gatedloop.cli.main", "--db", db, "--reviewer", REVIEWER),
            *("resume", lunch, "--request", request["request_id"], "--approve"),
        ],
        env={**os.environ, "GATEDLOOP_MODEL": "demo"},
        capture_output=True,
        text=True,
        check=False,
    )
    print("\n".join("   | " + line for line in child.stdout.strip().splitlines()))
    failures += child.returncode != 0

    with open_app(db) as (graph, _):
        _banner(f"workshop, reviewer edits the participant: {DEMO_QUESTIONS['workshop']}")
        seat = f"workshop-{suffix}"
        _show_run(graph, seat, DEMO_QUESTIONS["workshop"])
        edit = {
            "decisions": [
                {
                    "type": "edit",
                    "edited_action": {"name": "reserve_seat", "args": {"event_id": "WS-101", "participant": "Bob"}},
                }
            ],
            "reviewer": REVIEWER,
        }
        print("-> reviewer edits participant to Bob")
        failures += _show_resume(graph, seat, edit) != "completed"

        _banner("workshop, reviewer rejects: Reserve a seat in workshop WS-102 for Alice")
        rejected = f"reject-{suffix}"
        _show_run(graph, rejected, "Reserve a seat in workshop WS-102 for Alice")
        reject = {
            "decisions": [{"type": "reject", "message": "Alice is already booked elsewhere."}],
            "reviewer": REVIEWER,
        }
        print("-> reviewer rejects")
        failures += _show_resume(graph, rejected, reject) != "completed"
    print(f"\nThreads are in {db}: try `gatedloop --db {db} threads` and `gatedloop --db {db} show {lunch}`.")
    return 1 if failures else 0


def _print_events(graph: Any, events: Any) -> None:
    display = Display.for_graph(graph)
    for mode, chunk in events:
        if mode == "updates":
            for node, update in chunk.items():
                for line in display.step_lines(node, update):
                    print("   " + line)


def _show_run(graph: Any, thread_id: str, question: str) -> str | None:
    _print_events(graph, runs.stream_start(graph, thread_id, question))
    return _final(graph, thread_id)


def _show_resume(graph: Any, thread_id: str, answer: dict) -> str | None:
    reviewer = CallContext(user_id=REVIEWER)
    _print_events(graph, runs.stream_resume(graph, thread_id, answer, context=reviewer))
    return _final(graph, thread_id)


def _final(graph: Any, thread_id: str) -> str | None:
    result = runs.output(graph, thread_id)
    if "__interrupt__" in result:
        return None
    print(f"   status: {result.get('status')}   answer: {result.get('answer')}")
    return result.get("status")
