"""`gatedloop`: run, review, resume, list and inspect threads of the gated loop (SQLite file or Postgres URL).

Every failure is one line on stderr that says what to do (under `--json`, one JSON object), with an exit code per
kind (`EXIT_CODES`); a traceback only with `--debug`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.checkpoints.threads import (
    InvalidThreadId,
    ThreadSummary,
    UnknownThread,
    node_path,
    path_mermaid,
    thread_exists,
    unsettled_writes,
    validate_thread_id,
)
from gatedloop.cli.app import (
    EXIT_BROKEN_PIPE,
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_COMPLETED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_PAUSED,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    DatabaseUnavailable,
    is_postgres,
    named_graph,
    open_app,
    open_saver,
    require_db_folder,
    shown_db,
    writable_hint,
)
from gatedloop.cli.doctor import add_command as add_doctor_command
from gatedloop.cli.evidence import add_commands as add_evidence_commands
from gatedloop.cli.grants import add_commands as add_grant_commands
from gatedloop.cli.output import Output, configure_logging, wants_json
from gatedloop.cli.review import ask_reviewer
from gatedloop.cli.stats import add_command as add_stats_command
from gatedloop.demo import choose_model
from gatedloop.demo.model import describe_choice
from gatedloop.graph import pending as decide
from gatedloop.graph import runs, thread_graph
from gatedloop.graph.contexts import context_for, field_problem
from gatedloop.graph.display import STOP_WORDS, Display, day_and_clock, describe_thread
from gatedloop.graph.late_answers import AlreadyDecided, too_late
from gatedloop.graph.models import ModelConfigError
from gatedloop.graph.pending import PendingRequest
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools.policy import CallContext

DEFAULT_DB = "gatedloop.sqlite"
DECISION_FLAGS = ("approve", "reject", "edit", "respond", "done", "not_done", "abandon")
ANSWER_HINT = "--approve, --reject [REASON], --edit JSON or --respond TEXT"
UNKNOWN_HINT = "--done JSON, --not-done or --abandon"


def interactive(args: argparse.Namespace) -> bool:
    return sys.stdin.isatty() and not args.json


def context_of(args: argparse.Namespace) -> CallContext:
    """Who is asking or reviewing: `--user` (default $USER) with `--roles`."""
    roles = frozenset(r.strip() for r in (args.roles or "").split(",") if r.strip())
    return CallContext(user_id=args.user, roles=roles)


def run_context(args: argparse.Namespace, graph: CompiledStateGraph, *, new_request: bool = False) -> Any:
    """The runtime context of a run or an answer: who you are, and `--context` (the graph's own context fields,
    a JSON object or @FILE) in the graph's `context_schema`. A field it does not declare, or a required one a new
    request leaves out, is a usage error naming it, before anything is written."""
    context = context_for(graph.context_schema, context_of(args), context_fields(args.context))
    problem = field_problem(graph.context_schema, context, new_request=new_request)
    if problem is not None:
        raise CliError(f"--context: {problem}", EXIT_USAGE)
    return context


def context_fields(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    source = "--context"
    if text.startswith("@"):
        source, path = text[1:], Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"--context: cannot read {source}: {exc.strerror}", EXIT_USAGE) from None
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{source} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", EXIT_USAGE) from None
    if not isinstance(fields, dict):
        raise CliError(f"{source} must be a JSON object of context fields, not {type(fields).__name__}", EXIT_USAGE)
    return fields


def require_thread(graph: CompiledStateGraph, thread_id: str, db: str) -> None:
    if not thread_exists(graph, thread_id):
        raise UnknownThread(thread_id, shown_db(db))


def resume_command(thread_id: str, args: argparse.Namespace) -> str:
    """`gatedloop resume THREAD` with the options that reach this thread again, shell-quoted: the same database
    (when not the default), graph and upgrade. Without them a pasted hint resumes against the default database,
    where it creates an empty file and finds no such thread, or against another graph, which is refused."""
    words = ["gatedloop", "resume", thread_id]
    if args.db != DEFAULT_DB:
        words += ["--db", shown_db(args.db)]
    if args.graph:
        words += ["--graph", args.graph]
    if args.upgrade_graph:
        words.append("--upgrade-graph")
    return shlex.join(words)


def settle(graph: CompiledStateGraph, thread_id: str, args: argparse.Namespace, out: Output) -> int:
    """After a run: the result, or the pending request (asked at a terminal, else printed and exit 3)."""
    while True:
        result = runs.output(graph, thread_id)
        pending = result.get("__interrupt__")
        if not pending:
            status = result.get("status") or "unknown"
            out.record(
                "result",
                thread_id=thread_id,
                status=status,
                answer=result.get("answer"),
                stop_detail=result.get("stop_detail"),
            )
            if status == "completed":
                out.say(f"\nanswer: {result.get('answer')}")
            else:
                out.say(
                    f"\n{STOP_WORDS.get(status, status)}"
                    + (f": {result['stop_detail']}" if result.get("stop_detail") else "")
                )
            out.say(f"thread: {thread_id}  status: {status}")
            return EXIT_COMPLETED if status == "completed" else EXIT_FAILED
        request = pending[0].value
        if not interactive(args):
            out.record("request", thread_id=thread_id, request=request)
            out.say(out.display.approval_table(request))
            asked = PendingRequest.parse(request, pending[0].id)
            named = f" --request {shlex.quote(asked.request_id)}" if asked.named else ""
            hint = UNKNOWN_HINT if asked.kind == "unknown_outcome" else ANSWER_HINT
            out.say(f"\nthread {thread_id} is waiting. Answer with: {resume_command(thread_id, args)}{named} {hint}")
            return EXIT_PAUSED
        try:
            answer = ask_reviewer(request, args.user, context_of(args).roles, out.display)
        except (KeyboardInterrupt, EOFError):
            raise CliError(
                f"no answer given; thread {thread_id} is still waiting: {resume_command(thread_id, args)}", EXIT_PAUSED
            ) from None
        try:
            stream(out, args, thread_id, runs.stream_resume(graph, thread_id, answer, context=run_context(args, graph)))
        except InvalidDecision as exc:
            print(f"answer refused: {exc}", file=sys.stderr)


def stream(out: Output, args: argparse.Namespace, thread_id: str, events: Iterator[tuple[str, Any]]) -> None:
    """Print a run's events; Ctrl-C leaves the thread at its last saved step and says how to go on."""
    try:
        out.events(events)
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted; thread {thread_id} stopped mid-run: {resume_command(thread_id, args)} goes on from its "
            "last saved step",
            EXIT_INTERRUPTED,
        ) from None


def cmd_run(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread or f"t-{uuid.uuid4().hex[:12]}")
    named = named_graph(args.graph)
    with open_app(args.db, named=named) as (graph, _saver):
        out = Output(args.json, Display.for_graph(graph))
        model = f"graph: {named.reference}" if named is not None else f"model: {describe_choice()}"
        out.say(f"{model}   thread: {thread_id}   db: {shown_db(args.db)}")
        events = runs.stream_start(
            graph,
            thread_id,
            args.question,
            context=run_context(args, graph, new_request=True),
            upgrade=args.upgrade_graph,
        )
        stream(out, args, thread_id, events)
        return settle(graph, thread_id, args, out)


def _json_option(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        example = f'{option} \'{{"key": "value"}}\''
        raise CliError(f"{option} is not JSON ({exc}); quote it, e.g. {example}", EXIT_USAGE) from None


def resume_answer(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    """Turn --approve/--reject/--edit/... into one decision per pending action, each naming its call, and the
    answer naming the request it answers (`--request`), so it can never land on a request the reviewer did not
    see."""
    asked = PendingRequest.parse(request)
    calls = asked.calls
    if asked.kind == "unknown_outcome":
        if args.done is not None:
            decision: dict[str, Any] = decide.done(_json_option(args.done, "--done"))
        elif args.not_done:
            decision = decide.not_done()
        elif args.abandon:
            decision = decide.abandon()
        else:
            raise InvalidDecision(f"this thread waits on a write of unknown outcome: use {UNKNOWN_HINT}")
        return asked.answer([dict(decision) for _ in calls], args.user, justification=args.justification)
    calls = asked.mine(context_of(args).roles, time.time())
    if args.request is None:
        summary = ", ".join(f"{c.name} (tool_call_id {c.tool_call_id})" for c in calls) or "nothing"
        raise CliError(f"name the request you answer: --request {asked.request_id} (pending: {summary})", EXIT_USAGE)
    if args.approve:
        decisions = [decide.approve(c) for c in calls]
    elif args.reject is not None:
        decisions = [decide.reject(c, args.reject) for c in calls]
    elif args.respond is not None:
        decisions = [decide.respond(c, args.respond) for c in calls]
    elif args.edit is not None:
        edited = _json_option(args.edit, "--edit")
        edits = edited if isinstance(edited, list) else [edited]
        if len(edits) != len(calls) or not all(isinstance(e, dict) for e in edits):
            names = ", ".join(c.name for c in calls)
            raise InvalidDecision(
                f"--edit needs {len(calls)} argument object(s), one per pending call in order ({names}); "
                f"got {len(edits)}" + ("" if all(isinstance(e, dict) for e in edits) else " (not all objects)")
            )
        decisions = [decide.edit(c, e) for c, e in zip(calls, edits, strict=True)]
    else:
        raise InvalidDecision(f"this thread waits for approval: use {ANSWER_HINT}")
    return asked.answer(decisions, args.user, justification=args.justification, request_id=args.request, calls=calls)


def _refuse_closed(summary: ThreadSummary, thread_id: str) -> NoReturn:
    if summary.status == "cancelled":
        raise CliError(
            f"answer refused: thread {thread_id} was cancelled ({summary.detail}); status: cancelled", EXIT_REFUSED
        )
    raise CliError(
        f"answer refused: thread {thread_id} is not waiting for an answer (status: {summary.status}"
        + (f": {summary.detail}" if summary.detail else "")
        + ")",
        EXIT_REFUSED,
    )


def cmd_resume(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread)
    answering = any(getattr(args, flag) not in (None, False) for flag in DECISION_FLAGS)
    with open_app(args.db, named=named_graph(args.graph)) as (graph, saver):
        out = Output(args.json, Display.for_graph(graph))
        require_thread(graph, thread_id, args.db)
        if not args.upgrade_graph:
            thread_graph.check_thread_graph(graph, thread_id)
        summary = describe_thread(graph, thread_id, saver.ledger)
        request = runs.pending_request(graph, thread_id)
        if answering and request is None and args.request:
            late = too_late(saver.ledger, thread_id, {"request_id": args.request}, None)
            if late is not None:
                raise late
        if answering and (summary.status == "cancelled" or request is None):
            _refuse_closed(summary, thread_id)
        if summary.status == "cancelled":
            raise CliError(f"thread {thread_id} was cancelled ({summary.detail}); nothing to resume", EXIT_FAILED)
        if request is not None and not answering:
            return settle(graph, thread_id, args, out)  # prompts at a terminal, else prints the request
        if request is None and summary.status != "interrupted":
            out.say(f"thread {thread_id} has nothing to resume")
            return settle(graph, thread_id, args, out)
        answer = resume_answer(args, request) if request is not None else None
        for sentence in unsettled_writes(saver.ledger, thread_id):
            out.say(f"settling: {sentence}")
            out.record("settling", thread_id=thread_id, detail=sentence)
        events = runs.stream_resume(
            graph, thread_id, answer, context=run_context(args, graph), upgrade=args.upgrade_graph
        )
        stream(out, args, thread_id, events)
        after = runs.pending_request(graph, thread_id)
        if request is not None and after is not None and after.get("error"):
            raise CliError(f"answer refused: {after['error']}; thread {thread_id} is still waiting", EXIT_REFUSED)
        return settle(graph, thread_id, args, out)


def cmd_threads(args: argparse.Namespace) -> int:
    out = Output(args.json)
    with open_app(args.db, named=named_graph(args.graph), with_model=False, read_only=True) as (graph, saver):
        listed = saver.thread_ids()
        for thread_id in listed:
            summary = describe_thread(graph, thread_id, saver.ledger)
            out.record(
                "thread",
                thread_id=thread_id,
                status=summary.status,
                detail=summary.detail,
                messages=summary.messages,
                request_id=summary.request_id,
            )
            out.say(f"{summary.thread_id:<28} {summary.status:<16} {summary.detail}")
        if not listed:
            out.say(f"no threads in {shown_db(args.db)}")
    return EXIT_COMPLETED


def cmd_show(args: argparse.Namespace) -> int:
    thread_id = validate_thread_id(args.thread)
    with open_app(args.db, named=named_graph(args.graph), with_model=False, read_only=True) as (graph, saver):
        require_thread(graph, thread_id, args.db)
        thread_graph.check_thread_graph(graph, thread_id)  # another graph's secret_args would not mask these
        messages = runs.output(graph, thread_id).get("messages", [])
        out = Output(args.json, Display.for_thread(graph, thread_id, messages))  # redacted as the inbox does
        summary = describe_thread(graph, thread_id, saver.ledger)
        if args.mermaid:
            drawing = path_mermaid(node_path(graph, thread_id), summary.status)
            out.record("mermaid", thread_id=thread_id, text=drawing)
            out.say(drawing)
            return EXIT_COMPLETED
        audit = saver.ledger.audit(thread_id)
        if out.as_json:
            for message in messages:
                out.record("message", thread_id=thread_id, **out.display.message_json(message))
            for event in audit:
                out.record("audit", thread_id=thread_id, **out.display.redacted(event))
        for line in out.display.history_lines(messages, audit):
            out.say(line)
        out.record(
            "status", thread_id=thread_id, status=summary.status, detail=summary.detail, request_id=summary.request_id
        )
        out.say(f"status: {summary.status}" + (f" ({summary.detail})" if summary.detail else ""))
    return EXIT_COMPLETED


def cmd_extend(args: argparse.Namespace) -> int:
    out = Output(args.json)
    thread_id = validate_thread_id(args.thread)
    with open_app(args.db, named=named_graph(args.graph), with_model=False) as (graph, _saver):
        require_thread(graph, thread_id, args.db)
        thread_graph.check_thread_graph(graph, thread_id)
        extended = runs.extend(graph, thread_id, context=context_of(args), request_id=args.request)
    until = extended.until
    out.record("extend", thread_id=thread_id, request_id=args.request, until=until, kept=extended.kept)
    if not extended.kept:
        out.say(f"request {args.request} of thread {thread_id} may be decided until {day_and_clock(until)}")
        return EXIT_COMPLETED
    out.say(f"{', '.join(extended.extended)} of thread {thread_id} may be decided until {day_and_clock(until)}")
    for where, why in extended.kept.items():
        out.say(f"  {where} keeps its deadline: {why}")
    return EXIT_COMPLETED


def cmd_cancel(args: argparse.Namespace) -> int:
    out = Output(args.json)
    thread_id = validate_thread_id(args.thread)
    with open_app(args.db, named=named_graph(args.graph), with_model=False) as (graph, saver):
        require_thread(graph, thread_id, args.db)
        thread_graph.check_thread_graph(graph, thread_id)
        summary = describe_thread(graph, thread_id, saver.ledger)
        if summary.status not in ("waiting", "interrupted", "cancelled"):
            out.record("cancel", thread_id=thread_id, cancelled=False, status=summary.status)
            out.say(f"thread {thread_id} has already ended ({summary.status}); nothing to cancel")
            return EXIT_COMPLETED
        runs.cancel(thread_id, ledger=saver.ledger)
        after = describe_thread(graph, thread_id, saver.ledger)
    out.record("cancel", thread_id=thread_id, cancelled=True, status=after.status)
    if after.status == "cancelled":
        out.say(f"thread {thread_id} is cancelled; its pending request can no longer be answered")
    else:
        out.say(f"cancel requested for {thread_id}; it stops at its next step")
    return EXIT_COMPLETED


def cmd_inbox(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from gatedloop.graph.auth import FILE_ENV, AuthConfigError, load_auth_config
        from gatedloop.inbox import InboxBackend, create_app
        from gatedloop.inbox.identity import Reviewer, Sessions
        from gatedloop.inbox.notify import delivering
    except ImportError as exc:
        raise CliError(f"the inbox needs: pip install 'gatedloop[inbox]' ({exc.name} is missing)", EXIT_USAGE) from exc
    try:
        config = load_auth_config({**os.environ, FILE_ENV: args.auth_file} if args.auth_file else os.environ)
    except AuthConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    if (config is None) == (args.as_user is None):
        raise CliError(
            "say who reviews: --auth-file FILE (or GATEDLOOP_AUTH_FILE / GATEDLOOP_AUTH_TOKENS: the tokens of "
            "LangGraph Server's auth), or --as USER [--roles R1,R2] for local use",
            EXIT_USAGE,
        )
    fixed = Reviewer(args.as_user, context_of(args).roles, "fixed") if args.as_user else None
    notify = _notify_config(args, default_inbox_url=f"http://{args.host}:{args.port}/inbox")
    require_db_folder(args.db)  # before the server starts: its startup is where the database is opened

    named = named_graph(args.graph)

    @contextmanager
    def open_backend() -> Iterator[InboxBackend]:
        with open_app(args.db, named=named) as (graph, saver), delivering(saver.ledger, notify):
            yield InboxBackend.over(graph, saver)

    if named is None:
        choose_model()  # a model that is not configured is a one-line error now, not at the first answer
    app = create_app(open_backend, Sessions(config, fixed), slack=_slack_actions())
    url = f"http://{args.host}:{args.port}/inbox"
    if args.json:
        Output(True).record("inbox", url=url, db=shown_db(args.db))
    else:
        print(f"gatedloop inbox on {url}  (db: {shown_db(args.db)})", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="debug" if args.debug else "warning")
    return EXIT_COMPLETED


def _slack_actions() -> Any:
    """Slack's click endpoint when `SLACK_SIGNING_SECRET` is set (None otherwise)."""
    from gatedloop.inbox.slack_actions import SlackActions, SlackConfigError

    try:
        return SlackActions.from_env(os.environ)
    except SlackConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except ImportError as exc:
        raise CliError(f"Slack needs: pip install 'gatedloop[slack]' ({exc.name} is missing)", EXIT_USAGE) from exc


def _notify_config(args: argparse.Namespace, **defaults: Any) -> Any:
    """The webhooks of `--webhook`/`--slack-webhook` (or GATEDLOOP_NOTIFY_URLS); None when there are none."""
    from gatedloop.inbox.notify import NotifyConfigError, notify_config

    try:
        return notify_config(
            args.webhook,
            args.slack_webhook,
            args.slack_channel,
            inbox_url=args.inbox_url,
            grant_uses=args.grant_uses or None,
            **defaults,
        )
    except NotifyConfigError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc


def cmd_notify(args: argparse.Namespace) -> int:
    try:
        from gatedloop.inbox.notify import Deliverer, delivery_status, status_line
    except ImportError as exc:
        raise CliError(f"notify needs: pip install 'gatedloop[inbox]' ({exc.name} is missing)", EXIT_USAGE) from exc
    out = Output(args.json)
    if args.status:
        if not is_postgres(args.db) and not Path(args.db).is_file():
            raise CliError(f"no database at {args.db}: check --db (or GATEDLOOP_DB)", EXIT_NOT_FOUND)
        with open_saver(args.db) as saver:
            rows = delivery_status(saver.ledger)
        for row in rows:
            out.record("delivery", **row)
            out.say(status_line(row))
        if not rows:
            out.say(f"no pending or failed notifications in {shown_db(args.db)}")
        return EXIT_COMPLETED
    config = _notify_config(args)
    if config is None:
        raise CliError(
            "no webhook configured: --webhook URL, --slack-webhook URL, --slack-channel C or GATEDLOOP_NOTIFY_URLS",
            EXIT_USAGE,
        )
    with open_saver(args.db) as saver:
        deliverer = Deliverer(saver.ledger, config)
        if args.once:
            result = deliverer.run_once()
            out.record("notify", delivered=result.delivered, failed=result.failed, skipped=result.skipped)
            out.say(f"delivered {result.delivered}, failed {result.failed}, skipped {result.skipped}")
            return EXIT_FAILED if result.failed else EXIT_COMPLETED
        print(f"gatedloop notify: {len(config.webhooks)} webhook(s), db {shown_db(args.db)}", file=sys.stderr)
        deliverer.run(threading.Event())  # until Ctrl-C or a signal
    return EXIT_COMPLETED


def _notify_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help="POST notifications here "
        "(repeatable; slack+https://... for Slack; GATEDLOOP_NOTIFY_URLS); signed with "
        "GATEDLOOP_NOTIFY_SECRET",
    )
    command.add_argument("--slack-webhook", action="append", default=[], metavar="URL", help="a Slack webhook")
    command.add_argument(
        "--slack-channel",
        action="append",
        default=[],
        metavar="CHANNEL",
        help="post approval requests with Approve / Reject buttons to this Slack channel (SLACK_BOT_TOKEN)",
    )
    command.add_argument("--inbox-url", metavar="URL", help="the inbox page's URL in links (GATEDLOOP_INBOX_URL)")
    command.add_argument(
        "--grant-uses",
        action="store_true",
        help="also send grant_used, one notice per write a standing grant approved (GATEDLOOP_NOTIFY_GRANT_USES=1)",
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from gatedloop.cli.demo import run_demo

    return run_demo(args.db, Output(args.json))


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (exit 2) instead of the usage block and a message: raised, so that
    `main` prints it as every other failure (JSON under --json)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see: {self.prog} --help)", EXIT_USAGE)


def tcp_port(text: str) -> int:
    """A port to listen on, 1-65535: a larger one would be taken modulo 65536 by the socket layer (99999 listens on
    34463) while the URL printed says 99999."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


def _shared_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Options accepted before or after the command; the command's copies only override what is given."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    parser.add_argument(
        "--db",
        default=default(os.environ.get("GATEDLOOP_DB", DEFAULT_DB)),
        help="SQLite file or postgresql:// URL (GATEDLOOP_DB)",
    )
    parser.add_argument(
        "--graph",
        default=default(None),
        help="your graph: MODULE:ATTR or file.py:ATTR (as langgraph.json names it), or a graph name of the "
        "langgraph.json in this folder (GATEDLOOP_GRAPH; default: that langgraph.json's graph, else the demo)",
    )
    parser.add_argument(
        "--upgrade-graph",
        action="store_true",
        default=default(False),
        help="run a thread another graph made with this graph anyway (recorded in the audit trail)",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON lines only (stdout)")
    parser.add_argument("--debug", action="store_true", default=default(False), help="log details and tracebacks")
    parser.add_argument(
        "--user",
        "--reviewer",
        dest="user",
        default=default(os.environ.get("USER") or "cli"),
        help="who you are: the requester of a run, the reviewer of an answer ($USER)",
    )
    parser.add_argument(
        "--roles",
        default=default(os.environ.get("GATEDLOOP_ROLES", "")),
        help="your roles, comma-separated (GATEDLOOP_ROLES); some tools need one to be approved",
    )
    parser.add_argument(
        "--context",
        default=default(os.environ.get("GATEDLOOP_CONTEXT")),
        help="the graph's own context fields (its context_schema) as a JSON object, or @FILE (GATEDLOOP_CONTEXT); "
        "an answer without them reuses the request's",
    )


def parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.items())
    root = Parser(
        prog="gatedloop",
        description=__doc__,
        epilog=f"exit codes:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _shared_options(root, top=True)
    shared = Parser(add_help=False)
    _shared_options(shared, top=False)
    sub = root.add_subparsers(dest="command", required=True, parser_class=Parser)

    def command(name: str, helptext: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=helptext, parents=[shared])

    run = command("run", "ask a question; approvals asked at a terminal")
    run.add_argument("question")
    run.add_argument("--thread", help="thread id (new one if omitted)")
    run.set_defaults(func=cmd_run)
    resume = command("resume", "answer a paused thread (prompts at a terminal), or continue one stopped mid-run")
    resume.add_argument("thread")
    resume.add_argument("--request", metavar="ID", help="the approval request you answer (shown with it)")
    group = resume.add_mutually_exclusive_group()
    group.add_argument("--approve", action="store_true", help="approve every pending call, with the arguments shown")
    group.add_argument(
        "--reject", nargs="?", const="", metavar="REASON", help="reject every pending call; the model is told REASON"
    )
    group.add_argument("--edit", metavar="JSON", help="new args: an object, or a list of objects, one per call")
    group.add_argument("--respond", metavar="TEXT", help="answer the model in the tool's place")
    group.add_argument("--done", metavar="JSON", help="unknown outcome: it happened, with this result")
    group.add_argument("--not-done", action="store_true", help="unknown outcome: it did not happen; run it")
    group.add_argument("--abandon", action="store_true", help="unknown outcome: leave it to a person; stop")
    resume.add_argument(
        "--justification", metavar="TEXT", help="why you decide so: kept with the decision (some tools require it)"
    )
    resume.set_defaults(func=cmd_resume)
    command("threads", "list threads and where each stands").set_defaults(func=cmd_threads)
    show = command("show", "print a thread's conversation, each call's fate, times and durations")
    show.add_argument("thread")
    show.add_argument("--mermaid", action="store_true", help="draw the thread's path through the graph")
    show.set_defaults(func=cmd_show)
    extend = command("extend", "give a waiting approval request its time to live again (an approver only)")
    extend.add_argument("thread")
    extend.add_argument("--request", metavar="ID", required=True, help="the approval request you extend")
    extend.set_defaults(func=cmd_extend)
    cancel = command("cancel", "stop a thread at its next step (a waiting thread: close its request)")
    cancel.add_argument("thread")
    cancel.set_defaults(func=cmd_cancel)
    inbox = command("inbox", "serve the approval inbox (a web page for reviewers) for this database")
    inbox.add_argument("--host", default="127.0.0.1")
    inbox.add_argument("--port", type=tcp_port, default=8765)
    inbox.add_argument(
        "--auth-file", metavar="FILE", help="reviewers' tokens, as for LangGraph Server (GATEDLOOP_AUTH_FILE)"
    )
    inbox.add_argument("--as", dest="as_user", metavar="USER", help="local use: every visitor is this reviewer")
    _notify_options(inbox)
    inbox.set_defaults(func=cmd_inbox)
    notify = command("notify", "send approval requests to reviewers' webhooks (the notification outbox)")
    _notify_options(notify)
    notify.add_argument("--once", action="store_true", help="one pass: send what is due, then exit")
    notify.add_argument("--status", action="store_true", help="list pending and failed deliveries")
    notify.set_defaults(func=cmd_notify)
    command("demo", "play the articles' scenarios offline, approvals answered and shown").set_defaults(func=cmd_demo)
    add_evidence_commands(command, shared)
    add_grant_commands(command, shared)
    add_stats_command(command)
    add_doctor_command(command)
    return root


def explain(exc: BaseException, args: argparse.Namespace) -> tuple[str, int]:
    """One line and an exit code for an exception that reached the top."""
    if isinstance(exc, CliError):
        return str(exc), exc.code
    if isinstance(exc, InvalidThreadId | ModelConfigError):
        return str(exc), EXIT_USAGE
    if isinstance(exc, UnknownThread):
        return str(exc), EXIT_NOT_FOUND
    if isinstance(exc, ThreadBusy):
        return str(exc), EXIT_BUSY
    if isinstance(exc, AlreadyDecided):
        return f"answer not applied: {exc}", EXIT_REFUSED
    if isinstance(exc, InvalidDecision):
        return f"answer refused: {exc}", EXIT_REFUSED
    if isinstance(exc, thread_graph.GraphMismatch):
        return f"{exc}; name that graph with --graph MODULE:ATTR (or GATEDLOOP_GRAPH)", EXIT_REFUSED
    if isinstance(exc, DatabaseUnavailable):
        return str(exc), EXIT_FAILED
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc)):
        return (
            f"the database {args.db} is busy: another process held it longer than the busy timeout; try again "
            "(threads resume from their last saved step)",
            EXIT_BUSY,
        )
    if isinstance(exc, sqlite3.OperationalError):
        return f"the database {args.db} failed: {exc}{writable_hint(exc)}", EXIT_FAILED
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"unexpected {type(exc).__name__}: {first} (run with --debug for the traceback)", EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser().parse_args(argv)
    except CliError as exc:  # a usage error
        Output(wants_json(argv)).error(str(exc), exc.code)
        return exc.code
    configure_logging(args.debug, args.json)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`gatedloop threads | head -1`): nobody is left to tell. Point stdout at /dev/null so
        # the interpreter's final flush does not fail again, and exit as a process killed by SIGPIPE would. A run cut
        # off this way stopped at its last saved step, as after Ctrl-C; `resume` goes on.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (Exception, KeyboardInterrupt) as exc:
        if args.debug and not isinstance(exc, CliError):
            raise
        message, code = explain(exc, args)
        Output(args.json).error(message, code)
        return code


if __name__ == "__main__":
    sys.exit(main())
