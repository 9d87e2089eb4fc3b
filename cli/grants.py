"""`gatedloop grant create|confirm|list|revoke` and `gatedloop limits`: standing grants and the counters of limits
across threads, for the graph (`--graph`) over the database (`--db`); `--user`/`--roles` name the granter.

The rules are the graph's policies, applied by gatedloop.graph.grants (`runs.grant`, ...): bad input is a usage
error naming the problem (exit 2), a grant the person may not make is refused (exit 6); either way nothing is written.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from gatedloop.checkpoints.review_stats import DURATION, UNIT_S
from gatedloop.cli.app import EXIT_COMPLETED, EXIT_REFUSED, EXIT_USAGE, CliError, named_graph, open_app, shown_db
from gatedloop.cli.output import Output
from gatedloop.cli.stats import window_start
from gatedloop.graph import runs
from gatedloop.graph.display import day_and_clock
from gatedloop.graph.grants import GrantView
from gatedloop.graph.parts_of import parts_of
from gatedloop.nodes.gate.grants import WHERE_FORMS, GrantNotAllowed, GrantRefused
from gatedloop.tools.policy import CallContext
from gatedloop.tools.usage import window_words


def _who(args: argparse.Namespace) -> CallContext:
    roles = frozenset(r.strip() for r in (args.roles or "").split(",") if r.strip())
    return CallContext(user_id=args.user, roles=roles)


def expiry_s(text: str) -> float:
    """--expires: a duration from now (`90s`, `30m`, `2h`, `7d`)."""
    found = DURATION.fullmatch(text.strip())
    seconds = float(found.group(1)) * UNIT_S[found.group(2)] if found else 0.0
    if not seconds:
        raise CliError(f"--expires {text!r}: expected a positive duration such as 90s, 30m, 2h or 7d", EXIT_USAGE)
    return seconds


def _refused(exc: GrantRefused) -> CliError:
    return CliError(str(exc), EXIT_REFUSED if isinstance(exc, GrantNotAllowed) else EXIT_USAGE)


def cmd_grant_create(args: argparse.Namespace) -> int:
    out = Output(args.json)
    expires = expiry_s(args.expires)
    with open_app(args.db, named=named_graph(args.graph), with_model=False) as (graph, _saver):
        try:
            grant_id = runs.grant(
                graph,
                args.tool,
                context=_who(args),
                uses=args.uses,
                expires_in_s=expires,
                where=args.where,
                requester=args.requester,
                note=args.note,
            )
        except GrantRefused as exc:
            raise _refused(exc) from None
        view = next(v for v in runs.grants(graph) if v.grant_id == grant_id)
    out.record("grant", id=grant_id, status=view.status)
    out.say(grant_id)
    uses = f"{view.uses} use" + ("s" if view.uses != 1 else "")
    out.say(f"{view.tool} where {view.bounds}; {uses}; until {day_and_clock(view.expires_at)}; {view.status}")
    if view.status.startswith("pending"):
        out.say(f"another granter confirms it with: gatedloop grant confirm {grant_id}")
    return EXIT_COMPLETED


def cmd_grant_confirm(args: argparse.Namespace) -> int:
    out = Output(args.json)
    with open_app(args.db, named=named_graph(args.graph), with_model=False) as (graph, _saver):
        try:
            view = runs.confirm_grant(graph, args.grant_id, context=_who(args))
        except GrantRefused as exc:
            raise _refused(exc) from None
    out.record("grant", id=view.grant_id, status=view.status, granted_by=view.granted_by)
    out.say(f"{view.grant_id}: {view.status} (granted by {', '.join(view.granted_by)})")
    return EXIT_COMPLETED


def cmd_grant_revoke(args: argparse.Namespace) -> int:
    out = Output(args.json)
    with open_app(args.db, named=named_graph(args.graph), with_model=False) as (graph, _saver):
        try:
            runs.revoke(graph, args.grant_id, context=_who(args))
        except GrantRefused as exc:
            raise _refused(exc) from None
    out.record("grant", id=args.grant_id, status="revoked")
    out.say(f"{args.grant_id}: revoked; it covers no call from now on")
    return EXIT_COMPLETED


def cmd_grant_list(args: argparse.Namespace) -> int:
    out = Output(args.json)
    with open_app(args.db, named=named_graph(args.graph), with_model=False, read_only=True) as (graph, _saver):
        views = runs.grants(graph)
    for view in views:
        out.record("grant", **view.as_json())
    if not views:
        out.say(f"no grants in {shown_db(args.db)}")
        return EXIT_COMPLETED
    rows = [
        [
            v.grant_id,
            v.tool,
            _bounds_cell(v),
            f"{v.uses_left}/{v.uses}",
            day_and_clock(v.expires_at),
            ", ".join(v.granted_by),
            v.status + (f" - {v.note}" if v.note else ""),
        ]
        for v in views
    ]
    for line in _table(["id", "tool", "bounds", "uses left", "expires", "granted by", "status"], rows):
        out.say(line)
    return EXIT_COMPLETED


def cmd_limits(args: argparse.Namespace) -> int:
    out = Output(args.json)
    since = window_start(args.since, time.time()) if args.since else None
    with open_app(args.db, named=named_graph(args.graph), with_model=False, read_only=True) as (graph, _saver):
        usage = runs.limit_usage(graph, since)
        described = _described_limits(graph)
    for row in usage:
        out.record(
            "limit",
            tool=row.tool,
            limit=row.limit,
            group=row.group,
            window_start=row.window_start,
            window_end=row.window_end,
            total=row.total,
            at_most=row.at_most,
            calls=row.calls,
        )
    if not usage:
        out.say(f"no limit has been charged in {shown_db(args.db)}")
        return EXIT_COMPLETED
    rows = [
        [
            r.tool,
            described.get((r.tool, r.limit), r.limit),
            r.group or "(all)",
            f"{day_and_clock(r.window_start)} + {window_words(r.window_s)}",
            f"{r.total:g} of {r.at_most:g}" + (" (over: a person let it)" if r.total > r.at_most else ""),
            str(r.calls),
        ]
        for r in usage
    ]
    for line in _table(["tool", "limit", "per", "window", "used", "calls"], rows):
        out.say(line)
    return EXIT_COMPLETED


def _described_limits(graph: Any) -> dict[tuple[str, str], str]:
    """(tool, counter key) -> the limit in words, for the limits the graph's policies declare now."""
    parts = parts_of(graph)
    policies = parts.registry.policies if parts is not None else {}
    return {(tool, limit.key): limit.describe() for tool, policy in policies.items() for limit in policy.limits}


BOUNDS_WIDTH = 40
"""Bounds longer than this are listed a clause per line (a grant of mail to a team names every address)."""


def _bounds_cell(view: GrantView) -> str:
    whose = [f"(requester {view.requester})"] if view.requester else []
    if len(view.bounds) <= BOUNDS_WIDTH:
        return " ".join([view.bounds, *whose])
    return "\n".join([*(c + "," for c in view.clauses[:-1]), view.clauses[-1], *whose])


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest line; a cell with several lines makes its row as many lines tall."""
    cells = [[cell.split("\n") for cell in row] for row in [header, *rows]]
    widths = [max(len(line) for row in cells for line in row[i]) for i in range(len(header))]
    lines = []
    for row in cells:
        for k in range(max(len(cell) for cell in row)):
            parts = [(cell[k] if k < len(cell) else "").ljust(w) for cell, w in zip(row, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    return lines


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def add_commands(command: Callable[[str, str], argparse.ArgumentParser], shared: argparse.ArgumentParser) -> None:
    """`grant` (create, confirm, list, revoke) and `limits`, on the main parser's `command` factory."""
    grant = command("grant", "standing grants: approve a tool's calls within bounds ahead of time (docs/grants.md)")
    sub: Any = grant.add_subparsers(dest="grant_command", required=True, parser_class=type(grant))
    create = sub.add_parser(
        "create", help="grant (as --user, --roles) a bounded approval; prints its id", parents=[shared]
    )
    create.add_argument("--tool", required=True, help="the tool whose calls it approves (its policy: grantable=True)")
    create.add_argument(
        "--where", action="append", default=[], metavar="RULE", help=f"bound an argument: {WHERE_FORMS} (repeatable)"
    )
    create.add_argument("--uses", type=_positive_int, required=True, metavar="N", help="how many calls it approves")
    create.add_argument("--expires", required=True, metavar="DURATION", help="for how long: 90s, 30m, 2h, 7d")
    create.add_argument("--requester", metavar="USER", help="only this requester's calls (default: anyone's)")
    create.add_argument("--note", metavar="TEXT", help="why, kept with the grant and shown by list")
    create.set_defaults(func=cmd_grant_create)
    confirm = sub.add_parser(
        "confirm", help="add yourself as a further granter (a tool that needs several approvers)", parents=[shared]
    )
    confirm.add_argument("grant_id", metavar="GRANT_ID")
    confirm.set_defaults(func=cmd_grant_confirm)
    listed = sub.add_parser(
        "list", help="every grant: bounds, uses left, expiry, who granted it, status", parents=[shared]
    )
    listed.set_defaults(func=cmd_grant_list)
    revoke = sub.add_parser("revoke", help="revoke a grant: it covers no call from now on", parents=[shared])
    revoke.add_argument("grant_id", metavar="GRANT_ID")
    revoke.set_defaults(func=cmd_grant_revoke)
    limits = command("limits", "the counters of limits across threads: each window's total against its bound")
    limits.add_argument("--since", metavar="TIME", help="only windows that end after: 7d, 24h, 90m, ISO 8601 or epoch")
    limits.set_defaults(func=cmd_limits)
