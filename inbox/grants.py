"""The inbox's standing grants: the "Approve and grant similar calls" form of a card, and the Grants page's rows.

The rules are graph/grants.py's (`runs.check_grant`, `runs.grant`, `revoke_refusal`, `confirm_refusal`), judged on
the backend's grant graph (`InboxBackend.grants_graph`); this module only turns a card's call into prefilled bounds
and a submitted form back into `gatedloop grant create`'s arguments (`--where` texts, uses, expiry, requester).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from langgraph.graph.state import CompiledStateGraph
from starlette.datastructures import FormData

from gatedloop.checkpoints.grants import LimitUsage
from gatedloop.graph import runs
from gatedloop.graph.grants import PENDING, GrantView, confirm_refusal, revoke_refusal
from gatedloop.graph.parts_of import parts_of
from gatedloop.inbox.forms import FormError
from gatedloop.inbox.pending import ActionView, PendingView
from gatedloop.nodes.gate.grants import granter_refusal
from gatedloop.tools.policy import CallContext, ToolPolicy

EXPIRY_UNITS = {"minutes": 60, "hours": 3600, "days": 86400}
DEFAULT_USES = 5
DEFAULT_EXPIRY = (8, "hours")
SCALAR_KINDS = ("text", "integer", "number", "boolean")
NUMBER_KINDS = ("integer", "number")
OPS = {"eq": "equal to", "max": "at most", "each": "each one of", "any": "any value"}


@dataclass(frozen=True)
class Bound:
    """One argument's row of the grant form: the bounds it may take (`ops`, first the default) and its value."""

    name: str
    value: str
    ops: tuple[str, ...]
    why_any: str = ""  # why the argument cannot be bounded, when "any value" is all it may take


@dataclass(frozen=True)
class GrantForm:
    """The grant a card offers for one call: its bounds prefilled from the call's arguments."""

    tool: str
    bounds: list[Bound]
    requester: str | None
    uses: int = DEFAULT_USES
    expires: tuple[int, str] = DEFAULT_EXPIRY


@dataclass(frozen=True)
class GrantAsk:
    """A submitted grant form, as `runs.grant`'s arguments."""

    tool: str
    where: list[str]
    uses: int
    expires_in_s: float
    requester: str | None
    note: str | None

    def arguments(self) -> dict[str, Any]:
        return {
            "uses": self.uses,
            "expires_in_s": self.expires_in_s,
            "where": self.where,
            "requester": self.requester,
        }


def grant_forms(
    views: Iterable[PendingView], policy_of: Callable[[PendingView], Callable[[str], ToolPolicy]], who: CallContext
) -> dict[tuple[str, str], GrantForm]:
    """(thread, call id) -> the grant form of each call this reviewer decides and may grant similar calls of: its
    tool's policy is grantable and the granter rule admits her for the call's requester. Other calls get none."""
    forms: dict[tuple[str, str], GrantForm] = {}
    for view in views:
        if view.kind != "approval":
            continue
        policy = policy_of(view)
        for action in view.actions:
            rules = policy(action.name)
            if action.tool_call_id in view.refused or not action.fields:
                continue
            if granter_refusal(rules, action.name, who, view.requested_by) is None:
                forms[(view.thread_id, action.tool_call_id)] = GrantForm(
                    action.name, _bounds(action, rules.secret_args), view.requested_by
                )
    return forms


def _bounds(action: ActionView, secret: frozenset[str]) -> list[Bound]:
    """Each argument equal to its value by default; a number may be widened to "at most"; a list of plain values
    bounded element by element ("each one of" its elements, comma-separated); an argument that cannot be bounded (a
    secret, or not a single value) takes any value, and says why."""
    rows = []
    for field in action.fields:
        items = _plain_items(field.value) if field.kind == "json" else None
        if field.name in secret:
            rows.append(Bound(field.name, "", ("any",), "a secret argument: a grant's bounds are shown to anyone"))
        elif items is not None:
            rows.append(Bound(field.name, ",".join(items), ("each", "any")))
        elif field.kind not in SCALAR_KINDS:
            rows.append(Bound(field.name, field.value, ("any",), "not a single value: a grant cannot bound it"))
        else:
            value = ("true" if field.value else "false") if field.kind == "boolean" else field.value
            ops = ("eq", "max", "any") if field.kind in NUMBER_KINDS else ("eq", "any")
            rows.append(Bound(field.name, value, ops))
    return rows


def _plain_items(text: str) -> list[str] | None:
    """A list argument's elements as `--where 'name in a,b'` takes them (None: not a non-empty list of plain values
    that a comma cannot split wrongly)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    items = [v if isinstance(v, str) else json.dumps(v) for v in value if isinstance(v, str | int | float | bool)]
    return items if len(items) == len(value) and not any("," in i or not i or i != i.strip() for i in items) else None


def grant_from_form(offered: GrantForm, form: FormData, index: int) -> GrantAsk:
    """The grant the reviewer asked for with the call at `index`'s grant form: `FormError` naming a field that does
    not parse; the grant's own rules (bounds, uses, expiry, who) are `runs.check_grant`'s."""
    prefix = f"grant-{index}-"

    def text(name: str) -> str:
        value = form.get(prefix + name)
        return value.strip() if isinstance(value, str) else ""

    where = []
    for bound in offered.bounds:
        op = text(f"op-{bound.name}") or bound.ops[0]
        if op not in bound.ops:
            raise FormError(f"grant: {bound.name} may be {' or '.join(OPS[o] for o in bound.ops)}, not {op!r}")
        value = text(f"value-{bound.name}")
        if op == "each":
            where.append(f"{bound.name} in {value}")
        elif op != "any":
            where.append(f"{bound.name}{'=' if op == 'eq' else '<='}{value}")
    try:
        uses = int(text("uses"))
    except ValueError:
        raise FormError(f"grant: uses {text('uses')!r} is not a whole number") from None
    unit = text("unit")
    if unit not in EXPIRY_UNITS:
        raise FormError(f"grant: the expiry's unit is one of {', '.join(EXPIRY_UNITS)}, not {unit!r}")
    try:
        expires_in_s = float(text("expires")) * EXPIRY_UNITS[unit]
    except ValueError:
        raise FormError(f"grant: the expiry {text('expires')!r} is not a number") from None
    requester = offered.requester if text("only-requester") else None
    return GrantAsk(offered.tool, where, uses, expires_in_s, requester, text("note") or None)


@dataclass(frozen=True)
class GrantRow:
    """A grant on the Grants page, with what this reviewer may do about it."""

    grant: GrantView
    may_revoke: bool
    may_confirm: bool

    @property
    def open(self) -> bool:
        return self.grant.status == "live" or self.grant.status.startswith(PENDING)


@dataclass(frozen=True)
class LimitRow:
    usage: LimitUsage
    described: str


def grant_rows(graph: CompiledStateGraph, who: CallContext) -> list[GrantRow]:
    """Every grant, newest first, with whether this reviewer may revoke or confirm it (graph/grants.py's rules)."""
    return [
        GrantRow(view, revoke_refusal(graph, view, who) is None, confirm_refusal(graph, view, who) is None)
        for view in runs.grants(graph)
    ]


def limit_rows(graph: CompiledStateGraph) -> list[LimitRow]:
    """The counters of the limits' current windows, each limit in words as its policy declares it now."""
    parts = parts_of(graph)
    policies = parts.registry.policies if parts is not None else {}
    words = {(tool, limit.key): limit.describe() for tool, policy in policies.items() for limit in policy.limits}
    return [LimitRow(u, words.get((u.tool, u.limit), u.limit)) for u in runs.limit_usage(graph, since=time.time())]


def grants_page(graph: CompiledStateGraph, who: CallContext) -> dict[str, Any]:
    """The Grants page: live and pending grants first, then those that ended, and the limits' current windows."""
    rows = grant_rows(graph, who)
    return {
        "open_grants": [r for r in rows if r.open],
        "ended_grants": [r for r in rows if not r.open],
        "limits": limit_rows(graph),
    }
