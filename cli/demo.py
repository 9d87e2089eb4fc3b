"""`gatedloop demo`: the articles' scenarios, offline, approvals answered automatically and shown.

The lunch booking pauses for approval and is resumed by a *separate process* by thread id alone, which
is the durability promise in one line of output. Under `--json` every line is a JSON object: the scenario, its
steps, its request and result, the other process's own `--json` lines, and a closing `demo` summary.
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
from gatedloop.cli.output import Output
from gatedloop.demo import DEMO_QUESTIONS
from gatedloop.graph import runs
from gatedloop.graph.display import Display
from gatedloop.graph.pending import PendingRequest
from gatedloop.tools import CallContext

REVIEWER = "demo-reviewer"


def run_demo(db: str | None = None, given: Output | None = None) -> int:
    out = given or Output(False)
    os.environ["GATEDLOOP_MODEL"] = "demo"
    db = (
        db if db and db != "gatedloop.sqlite" else str(Path(tempfile.mkdtemp(prefix="gatedloop-demo-")) / "demo.sqlite")
    )
    out.say(f"gatedloop demo: scripted model, offline; checkpoints in {db}")
    suffix = uuid.uuid4().hex[:6]
    failures = 0
    with open_app(db) as (graph, _):
        out = Output(out.as_json, Display.for_graph(graph))  # what it prints masks the demo tools' secrets
        for key in ("order", "trip", "math"):
            _banner(out, key, f"{key}-{suffix}", DEMO_QUESTIONS[key])
            failures += _show_run(out, graph, f"{key}-{suffix}", DEMO_QUESTIONS[key]) != "completed"

        lunch = f"lunch-{suffix}"
        _banner(out, "lunch", lunch, DEMO_QUESTIONS["lunch"], "(needs approval)")
        _show_run(out, graph, lunch, DEMO_QUESTIONS["lunch"])
        request = runs.pending_request(graph, lunch)
        if request is None:
            out.say("expected an approval request")
            out.record("demo", db=db, failures=failures + 1)
            return 1
        out.record("request", thread_id=lunch, request=request)
        out.say(out.display.approval_table(request))
        out.say(f"-> paused. Resuming thread {lunch} in a new process with --approve (reviewer {REVIEWER}):")
    child = subprocess.run(
        [
            *(sys.executable, "-m", "gatedloop.cli.main", "--db", db, "--reviewer", REVIEWER),
            *("resume", lunch, "--request", PendingRequest.parse(request).request_id, "--approve"),
            *(["--json"] if out.as_json else []),
        ],
        env={**os.environ, "GATEDLOOP_MODEL": "demo"},
        capture_output=True,
        text=True,
        check=False,
    )
    for line in child.stdout.strip().splitlines():
        print(line if out.as_json else "   | " + line, flush=True)  # the other process's lines, as it wrote them
    print(child.stderr, end="", file=sys.stderr, flush=True)  # its failure, if any, as it wrote it
    failures += child.returncode != 0

    with open_app(db) as (graph, _):
        out = Output(out.as_json, Display.for_graph(graph))
        seat = f"workshop-{suffix}"
        _banner(out, "workshop", seat, DEMO_QUESTIONS["workshop"], "(reviewer edits the participant)")
        _show_run(out, graph, seat, DEMO_QUESTIONS["workshop"])
        edit = {
            "decisions": [
                {
                    "type": "edit",
                    "edited_action": {"name": "reserve_seat", "args": {"event_id": "WS-101", "participant": "Bob"}},
                }
            ],
            "reviewer": REVIEWER,
        }
        out.say("-> reviewer edits participant to Bob")
        failures += _show_resume(out, graph, seat, edit) != "completed"

        rejected = f"reject-{suffix}"
        _banner(out, "reject", rejected, "Reserve a seat in workshop WS-102 for Alice", "(reviewer rejects)")
        _show_run(out, graph, rejected, "Reserve a seat in workshop WS-102 for Alice")
        reject = {
            "decisions": [{"type": "reject", "message": "Alice is already booked elsewhere."}],
            "reviewer": REVIEWER,
        }
        out.say("-> reviewer rejects")
        failures += _show_resume(out, graph, rejected, reject) != "completed"
    out.say(f"\nThreads are in {db}: try `gatedloop --db {db} threads` and `gatedloop --db {db} show {lunch}`.")
    out.record("demo", db=db, failures=failures)
    return 1 if failures else 0


def _banner(out: Output, scenario: str, thread_id: str, question: str, note: str = "") -> None:
    out.say(f"\n=== {scenario}{' ' + note if note else ''}: {question}")
    out.record("scenario", scenario=scenario, thread_id=thread_id, question=question)


def _show_run(out: Output, graph: Any, thread_id: str, question: str) -> str | None:
    out.events(_updates(runs.stream_start(graph, thread_id, question)), indent="   ")
    return _final(out, graph, thread_id)


def _show_resume(out: Output, graph: Any, thread_id: str, answer: dict) -> str | None:
    out.record("answer", thread_id=thread_id, answer=answer)
    reviewer = CallContext(user_id=REVIEWER)
    out.events(_updates(runs.stream_resume(graph, thread_id, answer, context=reviewer)), indent="   ")
    return _final(out, graph, thread_id)


def _updates(events: Any) -> Any:
    """The steps only: the demo shows what each node did, not the tools' progress events."""
    return ((mode, chunk) for mode, chunk in events if mode == "updates")


def _final(out: Output, graph: Any, thread_id: str) -> str | None:
    result = runs.output(graph, thread_id)
    if "__interrupt__" in result:
        return None
    status, answer = result.get("status"), result.get("answer")
    out.record("result", thread_id=thread_id, status=status, answer=answer, stop_detail=result.get("stop_detail"))
    out.say(f"   status: {status}   answer: {answer}")
    return status
