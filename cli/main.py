"""`gatedloop`: run, review, resume, list and inspect threads of the gated loop (SQLite file or Postgres URL)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints import open_sqlite
from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.checkpoints.threads import (
    InvalidThreadId,
    describe_thread,
    node_path,
    path_mermaid,
    thread_ids,
    validate_thread_id,
)
from gatedloop.cli.render import STOP_WORDS, approval_table, print_history, step_lines
from gatedloop.cli.review import ask_reviewer
from gatedloop.graph import build_graph, runs
from gatedloop.graph.models import ModelConfigError, describe_choice, load_model
from gatedloop.nodes.hitl import InvalidDecision, pending_summary
from gatedloop.tools import CallContext
from gatedloop.tools.demo import DemoStore, build_demo_tools, demo_policies

EXIT_COMPLETED, EXIT_STOPPED, EXIT_USAGE, EXIT_WAITING = 0, 1, 2, 3
DEFAULT_DB = "gatedloop.sqlite"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")
DEMO_DATA_ENV = "GATEDLOOP_DEMO_DATA"


class DatabaseUnavailable(RuntimeError):
    """The database named by --db / GATEDLOOP_DB cannot be opened."""


def is_postgres(db: str) -> bool:
    return db.startswith(POSTGRES_PREFIXES)


def shown_db(db: str) -> str:
    """The database as printed: a Postgres URL without its password."""
    if not is_postgres(db):
        return db
    parts = urlsplit(db)
    if parts.password is None:
        return db
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def demo_data_path(db: str) -> Path:
    """The demo tools' data: beside a SQLite database; for Postgres, `GATEDLOOP_DEMO_DATA` or the working folder."""
    if is_postgres(db):
        return Path(os.environ.get(DEMO_DATA_ENV) or "gatedloop.demo-data.sqlite")
    path = Path(db)
    return path.with_name(f"{path.stem}.demo-data.sqlite")


@contextmanager
def open_saver(db: str) -> Iterator[Any]:
    """`open_sqlite(db)`, or `open_postgres(db)` for a `postgresql://` URL (needs the `postgres` extra)."""
    if not is_postgres(db):
        with open_sqlite(db) as sqlite_saver:
            yield sqlite_saver
        return
    try:
        from psycopg import OperationalError

        from gatedloop.checkpoints.postgres import open_postgres
    except ImportError as exc:
        raise DatabaseUnavailable(
            f"{shown_db(db)} needs the postgres extra: pip install 'gatedloop[postgres]'"
        ) from exc
    with ExitStack() as stack:
        try:
            saver = stack.enter_context(open_postgres(db))
        except OperationalError as exc:
            raise DatabaseUnavailable(f"cannot open {shown_db(db)}: {exc}") from exc
        yield saver


@contextmanager
def open_app(db: str) -> Iterator[tuple[CompiledStateGraph, Any]]:
    """The CLI's graph: the configured model, the demo tools (data beside the database), SQLite or Postgres
    checkpoints."""
    store = DemoStore(demo_data_path(db))
    with open_saver(db) as saver:
        graph = build_graph(load_model(), build_demo_tools(store), policies=demo_policies(store), checkpointer=saver)
        yield graph, saver


def emit(events: Iterator[tuple[str, Any]], as_json: bool) -> None:
    for mode, chunk in events:
        if as_json:
            print(json.dumps({"mode": mode, "data": _jsonable(chunk)}, ensure_ascii=False), flush=True)
            continue
        if mode == "custom":
            if isinstance(chunk, dict) and chunk.get("event") == "tool_finished":
                print(f"  … {chunk['tool']} {chunk['outcome']} in {chunk['duration_ms']:.0f} ms", flush=True)
            continue
        for node, update in chunk.items():
            for line in step_lines(node, update):
                print(line, flush=True)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, ensure_ascii=False, default=lambda v: getattr(v, "__dict__", repr(v))))


def settle(graph: CompiledStateGraph, thread_id: str, args: argparse.Namespace) -> int:
    """After a run: ask at a terminal, or print the pending request and the thread id and stop."""
    while True:
        result = runs.outcome(graph, thread_id)
        pending = result.get("__interrupt__")
        if not pending:
            status = result.get("status") or "unknown"
            if status == "completed":
                print(f"\nanswer: {result.get('answer')}")
            else:
                print(
                    f"\n{STOP_WORDS.get(status, status)}"
                    + (f": {result['stop_detail']}" if result.get("stop_detail") else "")
                )
            print(f"thread: {thread_id}  status: {status}")
            return EXIT_COMPLETED if status == "completed" else EXIT_STOPPED
        request = pending[0].value
        if not (sys.stdin.isatty() and not args.json):
            print(approval_table(request))
            named = f" --request {request['request_id']}" if request.get("request_id") else ""
            print(
                f"\nthread {thread_id} is waiting. Answer with: gatedloop resume {thread_id}{named} --approve "
                "(or --reject [REASON], --edit JSON, --respond TEXT)"
            )
            return EXIT_WAITING
        answer = ask_reviewer(request, args.reviewer)
        try:
            emit(runs.stream_resume(graph, thread_id, answer, context=reviewer_context(args)), args.json)
        except InvalidDecision as exc:
            print(f"answer refused: {exc}")


def cmd_run(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread or f"t-{uuid.uuid4().hex[:12]}")
    print(f"model: {describe_choice()}   thread: {thread_id}   db: {shown_db(args.db)}")
    with open_app(args.db) as (graph, _):
        emit(runs.stream_start(graph, thread_id, args.question), args.json)
        return settle(graph, thread_id, args)


def reviewer_context(args: argparse.Namespace) -> CallContext:
    """Who answers: `--reviewer` and `--roles` (a local operator's word; LangGraph Server takes it from auth)."""
    roles = [r.strip() for r in (args.roles or "").split(",") if r.strip()]
    return CallContext(user_id=args.reviewer, roles=frozenset(roles))


def resume_answer(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    """Turn --approve/--reject/--edit/... into one decision per pending action, each naming its call, and the
    answer naming the request it answers (`--request`), so it can never land on a request the reviewer did not
    see."""
    count = len(request.get("calls") or request.get("action_requests") or [])
    if request.get("kind") == "unknown_outcome":
        if args.done is not None:
            decision: dict[str, Any] = {"type": "done", "result": json.loads(args.done)}
        elif args.not_done:
            decision = {"type": "not_done"}
        elif args.abandon:
            decision = {"type": "abandon"}
        else:
            raise InvalidDecision(
                "this thread waits on a write of unknown outcome: use --done JSON, --not-done or --abandon"
            )
        return {"decisions": [decision] * count, "reviewer": args.reviewer}
    actions = request["action_requests"]
    if args.request is None:
        raise InvalidDecision(
            f"name the request you answer: --request {request.get('request_id')} (pending: {pending_summary(actions)})"
        )
    if args.approve:
        decisions = [{"type": "approve", "args_digest": a["args_digest"]} for a in actions]
    elif args.reject is not None:
        decisions = [{"type": "reject", "message": args.reject or "Rejected by the reviewer."}] * count
    elif args.respond is not None:
        decisions = [{"type": "respond", "message": args.respond}] * count
    elif args.edit is not None:
        edited = json.loads(args.edit)
        edits = edited if isinstance(edited, list) else [edited]
        if len(edits) != len(actions):
            raise InvalidDecision(f"--edit needs {len(actions)} argument object(s), one per action; got {len(edits)}")
        decisions = [
            {"type": "edit", "edited_action": {"name": a["name"], "args": e}}
            for a, e in zip(actions, edits, strict=True)
        ]
    else:
        raise InvalidDecision("say what to do: --approve, --reject [REASON], --edit JSON or --respond TEXT")
    named = [{**d, "tool_call_id": a["tool_call_id"]} for d, a in zip(decisions, actions, strict=True)]
    return {"decisions": named, "reviewer": args.reviewer, "request_id": args.request}


def cmd_resume(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread)
    with open_app(args.db) as (graph, _):
        request = runs.pending_request(graph, thread_id)
        answer = resume_answer(args, request) if request else None
        if request is None and describe_thread(graph, thread_id).status != "interrupted":
            print(f"thread {thread_id} has nothing to resume")
            return settle(graph, thread_id, args)
        emit(runs.stream_resume(graph, thread_id, answer, context=reviewer_context(args)), args.json)
        return settle(graph, thread_id, args)


def cmd_threads(args: argparse.Namespace) -> int:
    if not is_postgres(args.db) and not Path(args.db).exists():
        print(f"no database at {args.db}")
        return EXIT_COMPLETED
    with open_app(args.db) as (graph, saver):
        listed = saver.thread_ids() if is_postgres(args.db) else thread_ids(args.db)
        for thread_id in listed:
            summary = describe_thread(graph, thread_id)
            print(f"{summary.thread_id:<28} {summary.status:<16} {summary.detail}")
    return EXIT_COMPLETED


def cmd_show(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread)
    with open_app(args.db) as (graph, saver):
        if args.mermaid:
            print(path_mermaid(node_path(graph, thread_id), describe_thread(graph, thread_id).status))
            return EXIT_COMPLETED
        values = runs.outcome(graph, thread_id)
        print_history(values.get("messages", []), saver.ledger.audit(thread_id), sys.stdout)
        summary = describe_thread(graph, thread_id)
        print(f"status: {summary.status} {summary.detail}")
    return EXIT_COMPLETED


def cmd_cancel(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread)
    with open_saver(args.db) as saver:
        runs.cancel(thread_id, ledger=saver.ledger)
    print(f"cancel requested for {thread_id}; it stops at its next step")
    return EXIT_COMPLETED


def cmd_demo(args: argparse.Namespace) -> int:
    from gatedloop.cli.demo import run_demo

    return run_demo(args.db)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="gatedloop", description=__doc__)
    root.add_argument(
        "--db",
        default=os.environ.get("GATEDLOOP_DB", DEFAULT_DB),
        help="SQLite file or postgresql:// URL (GATEDLOOP_DB)",
    )
    root.add_argument("--json", action="store_true", help="print machine-readable events")
    root.add_argument("--reviewer", default=os.environ.get("USER", "cli"), help="reviewer id recorded with decisions")
    root.add_argument("--roles", default="", help="the reviewer's roles, comma-separated (for tools with approvers)")
    sub = root.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="ask a question; approvals asked at a terminal")
    run.add_argument("question")
    run.add_argument("--thread", help="thread id (new one if omitted)")
    run.set_defaults(func=cmd_run)
    resume = sub.add_parser("resume", help="answer a paused thread, or continue one stopped by a crash")
    resume.add_argument("thread")
    resume.add_argument("--reviewer", default=argparse.SUPPRESS, help="reviewer id recorded with the decision")
    resume.add_argument("--request", metavar="ID", help="the approval request you answer (shown with it)")
    group = resume.add_mutually_exclusive_group()
    group.add_argument("--approve", action="store_true")
    group.add_argument("--reject", nargs="?", const="", metavar="REASON")
    group.add_argument("--edit", metavar="JSON", help="new args (an object, or a list of objects, one per action)")
    group.add_argument("--respond", metavar="TEXT", help="answer the model in the tool's place")
    group.add_argument("--done", metavar="JSON", help="unknown outcome: it happened, with this result")
    group.add_argument("--not-done", action="store_true", help="unknown outcome: it did not happen; run it")
    group.add_argument("--abandon", action="store_true", help="unknown outcome: leave it to a person; stop")
    resume.set_defaults(func=cmd_resume)
    sub.add_parser("threads", help="list threads and where each stands").set_defaults(func=cmd_threads)
    show = sub.add_parser("show", help="print a thread's conversation and each call's fate")
    show.add_argument("thread")
    show.add_argument("--mermaid", action="store_true", help="draw the thread's path through the graph")
    show.set_defaults(func=cmd_show)
    cancel = sub.add_parser("cancel", help="stop a thread at its next step")
    cancel.add_argument("thread")
    cancel.set_defaults(func=cmd_cancel)
    sub.add_parser("demo", help="play the articles' scenarios offline, approvals answered and shown").set_defaults(
        func=cmd_demo
    )
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (
        InvalidDecision,
        InvalidThreadId,
        ModelConfigError,
        ThreadBusy,
        DatabaseUnavailable,
        json.JSONDecodeError,
    ) as exc:
        print(f"gatedloop: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
