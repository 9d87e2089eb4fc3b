"""Standing grants and limits across threads from Python (`runs.grant`, `runs.check_grant`, `runs.confirm_grant`,
`runs.revoke`, `runs.grants`, `runs.limit_usage`), for a graph from `build_graph` over its database; the CLI's
`gatedloop grant` and `gatedloop limits`, and the inbox's grant forms, call these.

The rules are the gate's (nodes/gate/grants.py): a grant is judged under the tool's policy of this graph, as an
approval of the calls it would cover, and is pending until as many distinct authorized granters as the policy's
`approvals_required` confirmed it. Who acts is the `context` given (the CLI's `--user`/`--roles`), as for an answer.
Making, confirming and revoking a grant queue its notice (`grant_created`, `grant_confirmed`, `grant_revoked`) in the
same transaction, its bounds masked by the tool's `secret_args` (checkpoints/grants.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from langchain_core.tools import BaseTool
from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints.grants import Confirmation, Grant, LimitUsage
from gatedloop.checkpoints.ledger import Ledger
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.thread_graph import ledger_of
from gatedloop.nodes.gate.grants import (
    Bounds,
    GrantNotAllowed,
    GrantRefused,
    bound_clauses,
    describe_bounds,
    exact_bounds,
    grant_status,
    granter_refusal,
    parse_where,
    shown_bounds,
)
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.registry import ToolRegistry

PENDING = "pending"
"""How the status of a grant that waits for more granters begins (`grant_status`: "pending (1 of 2 granters)")."""


@dataclass(frozen=True)
class GrantView:
    """A grant as `gatedloop grant list` shows it: its bounds in the `--where` forms, uses left, who granted it, and
    what it is now under this graph's policy (live, pending, revoked, expired, used up)."""

    grant_id: str
    tool: str
    bounds: str
    clauses: tuple[str, ...]
    """The bounds one by one, as `--where` gave them (`bounds` joins them), for a display that wraps them."""
    requester: str | None
    uses: int
    uses_left: int
    expires_at: float
    granted_by: list[str]
    status: str
    note: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.grant_id,
            "tool": self.tool,
            "bounds": self.bounds,
            "requester": self.requester,
            "uses": self.uses,
            "uses_left": self.uses_left,
            "expires_at": self.expires_at,
            "granted_by": self.granted_by,
            "status": self.status,
            "note": self.note,
        }


def _parts(graph: CompiledStateGraph[Any, Any, Any, Any]) -> tuple[ToolRegistry, Ledger]:
    parts, ledger = parts_of(graph), ledger_of(graph)
    if parts is None or ledger is None:
        raise TypeError(f"{type(graph).__name__} is not a graph from gatedloop.graph.build_graph")
    return parts.registry, ledger


def _policy(registry: ToolRegistry, tool: str) -> ToolPolicy:
    if tool not in registry:
        raise GrantRefused(f"no tool named {tool!r} in this graph (its tools: {', '.join(sorted(registry.tools))})")
    return registry.policy(tool)


def grant(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    tool: str,
    *,
    context: CallContext,
    uses: int,
    expires_in_s: float,
    where: Sequence[str] = (),
    requester: str | None = None,
    note: str | None = None,
    exactly: Mapping[str, Any] | None = None,
) -> str:
    """Grant `context`'s approval, ahead of time, of `tool`'s calls within `where` (`name=value`, `name<=n`,
    `name>=n`, `name in a,b`), or of calls with `exactly` these arguments, by `requester` (None: anyone), `uses`
    times, for `expires_in_s` seconds; the new grant's id. A tool whose policy needs several approvers gives a
    pending grant, which others confirm (`confirm_grant`). `GrantRefused` (bad input) or `GrantNotAllowed` (not hers
    to grant), nothing written."""
    registry, ledger = _parts(graph)
    made = grant_in(
        registry,
        ledger,
        tool,
        context=context,
        uses=uses,
        expires_in_s=expires_in_s,
        where=where,
        requester=requester,
        note=note,
        exactly=exactly,
    )
    return made.grant_id


def grant_in(
    registry: ToolRegistry,
    ledger: Ledger,
    tool: str,
    *,
    context: CallContext,
    uses: int,
    expires_in_s: float,
    where: Sequence[str] = (),
    requester: str | None = None,
    note: str | None = None,
    exactly: Mapping[str, Any] | None = None,
) -> GrantView:
    """`grant` over a registry and a ledger (an inbox under a server has these, not the served graph); the grant as
    made. Its `grant_created` notice is queued in the transaction that writes it, bounds masked."""
    policy, bounds = _judged(registry, tool, context, uses, expires_in_s, where, requester, exactly)
    now = time.time()
    made = Grant(
        grant_id=f"g-{uuid.uuid4().hex[:12]}",
        tool=tool,
        bounds=bounds,
        requester=requester,
        uses=uses,
        expires_at=now + float(expires_in_s),
        granted_by=str(context.user_id),
        created_at=now,
        note=note,
    )
    detail = {
        "tool": tool,
        "bounds": bounds,
        "requester": requester,
        "uses": uses,
        "expires_at": made.expires_at,
        "note": note,
        "roles": sorted(context.roles),
        "approvals_required": policy.approvals_required,
    }
    first = replace(made, confirmations=(Confirmation(made.granted_by, context.roles, now),))
    shown = {**_shown_of(bounds, policy.secret_args), "status": grant_status(policy, first, now)}
    ledger.create_grant(made, context.roles, detail, {**shown, "approvals_required": policy.approvals_required})
    return _view(registry, first, now)


def check_grant(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    tool: str,
    *,
    context: CallContext,
    uses: int,
    expires_in_s: float,
    where: Sequence[str] = (),
    requester: str | None = None,
    exactly: Mapping[str, Any] | None = None,
) -> None:
    """Whether `grant` with these arguments would be made, without making it: the same `GrantRefused` or
    `GrantNotAllowed`, or None. For a caller that must know before doing something else first (the inbox approves
    the call at hand, then grants similar ones)."""
    check_grant_in(
        _parts(graph)[0],
        tool,
        context=context,
        uses=uses,
        expires_in_s=expires_in_s,
        where=where,
        requester=requester,
        exactly=exactly,
    )


def check_grant_in(
    registry: ToolRegistry,
    tool: str,
    *,
    context: CallContext,
    uses: int,
    expires_in_s: float,
    where: Sequence[str] = (),
    requester: str | None = None,
    exactly: Mapping[str, Any] | None = None,
) -> None:
    """`check_grant` over a registry (see `grant_in`)."""
    _judged(registry, tool, context, uses, expires_in_s, where, requester, exactly)


def _judged(
    registry: ToolRegistry,
    tool: str,
    context: CallContext,
    uses: int,
    expires_in_s: float,
    where: Sequence[str],
    requester: str | None,
    exactly: Mapping[str, Any] | None = None,
) -> tuple[ToolPolicy, Bounds]:
    """The tool's policy and the grant's bounds (`where`'s, or `exactly` these arguments), once every rule admits
    the grant."""
    policy = _policy(registry, tool)
    if isinstance(uses, bool) or not isinstance(uses, int) or uses < 1:
        raise GrantRefused(f"uses must be a whole number of at least 1, not {uses!r}")
    if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int | float) or not expires_in_s > 0:
        raise GrantRefused(f"the expiry must be a positive duration, not {expires_in_s!r}")
    refusal = granter_refusal(policy, tool, context, requester)
    if refusal is not None:
        raise GrantNotAllowed(refusal)
    properties = _arguments(registry.tools[tool])
    if exactly is None:
        return policy, parse_where(where, properties, policy.secret_args)
    if where:
        raise GrantRefused("a grant is bounded by its where rules or by exact arguments, not both")
    return policy, exact_bounds(exactly, properties, policy.secret_args)


def confirm_grant(graph: CompiledStateGraph[Any, Any, Any, Any], grant_id: str, *, context: CallContext) -> GrantView:
    """Add `context` as a further granter of a pending grant (a tool with `approvals_required` > 1); the grant as
    it is now. She must be a granter the tool's rule admits, and not one of its granters already."""
    registry, ledger = _parts(graph)
    found = _existing(ledger, grant_id)
    policy = _policy(registry, found.tool)
    now = time.time()
    if not found.open_at(now):
        raise GrantRefused(f"grant {grant_id} is {grant_status(policy, found, now)}: nothing to confirm")
    refusal = granter_refusal(policy, found.tool, context, found.requester)
    if refusal is not None:
        raise GrantNotAllowed(refusal)
    added = Confirmation(str(context.user_id), context.roles, now)
    confirmed = replace(found, confirmations=(*found.confirmations, added))
    shown = {
        **_shown_of(found.bounds, policy.secret_args),
        "status": grant_status(policy, confirmed, now),
        "approvals_required": policy.approvals_required,
    }
    if not ledger.confirm_grant(grant_id, str(context.user_id), context.roles, now, shown):
        raise GrantNotAllowed(f"{context.user_id} is already a granter of {grant_id}; another granter must confirm it")
    return _view(registry, _existing(ledger, grant_id), now)


def revoke(graph: CompiledStateGraph[Any, Any, Any, Any], grant_id: str, *, context: CallContext) -> None:
    """Revoke a grant: from the next claim on, it covers nothing. One of its granters may, or anyone the tool's rule
    admits as a reviewer; revoking a revoked grant is refused (`GrantRefused`), so a typo is not silent."""
    registry, ledger = _parts(graph)
    found = _existing(ledger, grant_id)
    refusal = _revoke_refusal(registry, found.tool, [c.granter for c in found.confirmations], context)
    if refusal is not None:
        raise GrantNotAllowed(refusal)
    secret = registry.policy(found.tool).secret_args if found.tool in registry else frozenset()
    if not ledger.revoke_grant(grant_id, str(context.user_id), time.time(), _shown_of(found.bounds, secret)):
        raise GrantRefused(f"grant {grant_id} was already revoked by {found.revoked_by}")


def revoke_refusal(graph: CompiledStateGraph[Any, Any, Any, Any], view: GrantView, context: CallContext) -> str | None:
    """Why `context` may not revoke the grant `view` shows (None: she may), by `revoke`'s own rule."""
    return _revoke_refusal(_parts(graph)[0], view.tool, view.granted_by, context)


def _revoke_refusal(registry: ToolRegistry, tool: str, granters: Sequence[str], context: CallContext) -> str | None:
    if context.user_id is None:
        return "revoking a grant needs an identified user (a user id)"
    if context.user_id in granters or tool not in registry:
        return None
    refusal = registry.policy(tool).reviewer_refusal(context, None)
    return refusal.replace("deciding this call", f"revoking a grant of {tool}") if refusal is not None else None


def confirm_refusal(graph: CompiledStateGraph[Any, Any, Any, Any], view: GrantView, context: CallContext) -> str | None:
    """Why `context` may not confirm the grant `view` shows (None: she may), by `confirm_grant`'s rules: it waits
    for granters, she is one the tool's rule admits, and not one of its granters already."""
    registry, _ledger = _parts(graph)
    if not view.status.startswith(PENDING):
        return f"grant {view.grant_id} is {view.status}: nothing to confirm"
    refusal = granter_refusal(_policy(registry, view.tool), view.tool, context, view.requester)
    if refusal is not None:
        return refusal
    if context.user_id in view.granted_by:
        return f"{context.user_id} is already a granter of {view.grant_id}; another granter must confirm it"
    return None


def grants(graph: CompiledStateGraph[Any, Any, Any, Any]) -> list[GrantView]:
    """Every grant on the graph's database, newest first, as this graph's policies judge it now."""
    registry, ledger = _parts(graph)
    now = time.time()
    return [_view(registry, found, now) for found in ledger.grants()]


def limit_usage(graph: CompiledStateGraph[Any, Any, Any, Any], since: float | None = None) -> list[LimitUsage]:
    """The counters of limits across threads whose window ends after `since` (None: every window kept)."""
    return _parts(graph)[1].limit_usage(since)


def _arguments(tool: BaseTool) -> dict[str, Any]:
    """The tool's arguments as the model is shown them (`tool_call_schema`: nothing gatedloop injects), by name, each
    schema's references to the tool's definitions inlined (pydantic refers to a nested model, `list[Item]`, by
    `$ref`), so a bound on a field sees the field's type."""
    schema = tool.tool_call_schema
    found = schema if isinstance(schema, dict) else cast(Any, schema).model_json_schema()
    definitions = found.get("$defs") or found.get("definitions") or {}
    return {name: _inlined(spec, definitions, 0) for name, spec in (found.get("properties") or {}).items()}


def _inlined(schema: Any, definitions: Mapping[str, Any], depth: int) -> Any:
    """`schema` with local `$ref`s replaced by the definitions they name, to a few levels (a recursive model stops
    there: its deeper fields cannot be bounded anyway)."""
    if not isinstance(schema, Mapping) or depth > 4:
        return schema
    ref = schema.get("$ref")
    named = ref.rsplit("/", 1)[-1] if isinstance(ref, str) else ""
    if named in definitions:
        rest = {key: value for key, value in schema.items() if key != "$ref"}
        return _inlined({**definitions[named], **rest}, definitions, depth + 1)
    inlined = dict(schema)
    if isinstance(schema.get("items"), Mapping):
        inlined["items"] = _inlined(schema["items"], definitions, depth + 1)
    if isinstance(schema.get("properties"), Mapping):
        inlined["properties"] = {k: _inlined(v, definitions, depth + 1) for k, v in schema["properties"].items()}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            inlined[key] = [_inlined(option, definitions, depth + 1) for option in schema[key]]
    return inlined


def _shown_of(bounds: Mapping[str, Mapping[str, Any]], secret: frozenset[str]) -> dict[str, Any]:
    """A grant's bounds as its notices show them (`bounds`, and `bounds_text` in the `--where` forms), masked."""
    masked = shown_bounds(bounds, secret)
    return {"bounds": masked, "bounds_text": describe_bounds(masked)}


def _existing(ledger: Ledger, grant_id: str) -> Grant:
    found = ledger.grant(grant_id)
    if found is None:
        raise GrantRefused(f"no grant {grant_id!r} (see: gatedloop grant list)")
    return found


def _view(registry: ToolRegistry, found: Grant, now: float) -> GrantView:
    policy = registry.policy(found.tool) if found.tool in registry else None
    return GrantView(
        grant_id=found.grant_id,
        tool=found.tool,
        bounds=describe_bounds(found.bounds),
        clauses=tuple(bound_clauses(found.bounds)),
        requester=found.requester,
        uses=found.uses,
        uses_left=found.uses_left,
        expires_at=found.expires_at,
        granted_by=[c.granter for c in found.confirmations],
        status=grant_status(policy, found, now),
        note=found.note,
    )
