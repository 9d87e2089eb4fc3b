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


NOT_SINGLE = "not a single value: a grant cannot bound it"


def _bounds(action: ActionView, secret: frozenset[str]) -> list[Bound]:
    """Each argument equal to its value by default; a number may be widened to "at most"; a list of plain values
    bounded element by element ("each one of" its elements, comma-separated); an object by each of its fields, and a
    list of objects by each field of its elements ("items.sku" each one of the skus the call has); an argument that
    cannot be bounded (a secret, or not a single value) takes any value, and says why."""
    rows = []
    for field in action.fields:
        value = _json(field.value) if field.kind == "json" else None
        if field.name in secret:
            rows.append(Bound(field.name, "", ("any",), "a secret argument: a grant's bounds are shown to anyone"))
        elif isinstance(value, dict) and value:
            rows.extend(_value_row(f"{field.name}.{key}", value[key]) for key in sorted(value))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            rows.extend(_each_field_rows(field.name, value))
        elif isinstance(value, list):
            rows.append(_each_row(field.name, value))
        elif field.kind not in SCALAR_KINDS:
            rows.append(Bound(field.name, field.value, ("any",), NOT_SINGLE))
        else:
            shown = ("true" if field.value else "false") if field.kind == "boolean" else field.value
            ops = ("eq", "max", "any") if field.kind in NUMBER_KINDS else ("eq", "any")
            rows.append(Bound(field.name, shown, ops))
    return rows


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _value_row(name: str, value: Any) -> Bound:
    """A field of an object argument: equal to its value (a number may be widened to "at most")."""
    if isinstance(value, bool):
        return Bound(name, "true" if value else "false", ("eq", "any"))
    if isinstance(value, int | float):
        return Bound(name, json.dumps(value), ("eq", "max", "any"))
    if isinstance(value, str) and value:
        return Bound(name, value, ("eq", "any"))
    return Bound(name, json.dumps(value), ("any",), NOT_SINGLE)


def _each_row(name: str, values: list[Any], ranged: bool = False) -> Bound:
    """A list of plain values (or, `ranged`, the values a field takes across a list's objects, which may also be
    bounded by "at most"): "each one of" them."""
    items = _plain_items(values)
    if items is None:
        return Bound(name, json.dumps(values), ("any",), "not plain values a comma can list: a grant cannot bound it")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    return Bound(
        name, ",".join(dict.fromkeys(items)), ("each", "max", "any") if ranged and numbers else ("each", "any")
    )


def _each_field_rows(name: str, objects: list[dict[str, Any]]) -> list[Bound]:
    """A list of objects: a row per field, "each one of" the values its objects have (a field some object lacks, or
    that is not a plain value, takes any value)."""
    rows = []
    for key in sorted({key for item in objects for key in item}):
        if any(key not in item for item in objects):
            rows.append(Bound(f"{name}.{key}", "", ("any",), "not in every element: a grant cannot bound it"))
        else:
            rows.append(_each_row(f"{name}.{key}", [item[key] for item in objects], ranged=True))
    return rows


def _plain_items(values: list[Any]) -> list[str] | None:
    """A list's elements as `--where 'name in a,b'` takes them (None: not a non-empty list of plain values that a
    comma cannot split wrongly)."""
    if not values:
        return None
    items = [v if isinstance(v, str) else json.dumps(v) for v in values if isinstance(v, str | int | float | bool)]
    return items if len(items) == len(values) and not any("," in i or not i or i != i.strip() for i in items) else None


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
