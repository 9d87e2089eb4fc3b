"""Standing grants and limits across threads, decided: pure functions over a grant's rows, a call, its requester,
the tool's policy in force and the time.

A grant is a reviewer's approval given ahead of time, so it is judged as one: under the tool's rule as it is now
(`grantable`, `approvers`, `approvals_required`, `self_approval`), each granter like a reviewer of the call it would
cover. It covers a call only inside its bounds (each constrained argument equal to a value, one of values, in a
numeric range, for a list argument each of its elements one of values, and the same rules on the fields of an object
argument or of every element of a list of objects), for its requester (or anyone), while
open (not revoked, expired or used up: the claim checks these again, atomically, checkpoints/grants.py), and never a
call a reviewer edited. What a write is charged against each of its policy's limits is decided here too; the ledger
only adds it up.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gatedloop.checkpoints.grants import Charge, Grant
from gatedloop.tools.policy import MASK, CallContext, ToolPolicy
from gatedloop.tools.usage import UsageLimit

Bounds = dict[str, dict[str, Any]]
"""argument -> {"eq": value} | {"in": [values]} | {"min": n, "max": n} (either or both) | {"each_in": [values]} (a list
argument: every element one of the values) | {"fields": Bounds} (an object argument: its fields so bounded) |
{"each": Bounds} (a list of objects: every element's fields so bounded). With `"or_absent": true`, an optional list
whose default is empty may also be left out or null: it then has no element."""

WHERE_FORMS = "name=value, name<=n, name>=n or 'name in a,b' (name.field for an object's or a list's objects' fields)"
_NAME = r"(\w+(?:\.\w+)?)"
_IN = re.compile(rf"^\s*{_NAME}\s+in\s+(.+?)\s*$")
_COMPARED = re.compile(rf"^\s*{_NAME}\s*(<=|>=|=)\s*(.*?)\s*$")
_NESTED = ("fields", "each")


class GrantRefused(ValueError):
    """A grant (or a confirmation, or a revocation) that cannot be made as given: why, in one line; nothing was
    written."""


class GrantNotAllowed(GrantRefused):
    """The person may not make this grant, confirmation or revocation under the tool's rule; nothing was written."""


def parse_where(texts: Sequence[str], properties: Mapping[str, Mapping[str, Any]], secret: frozenset[str]) -> Bounds:
    """`--where` texts as bounds, each value read as the tool's argument schema (`properties`, references inlined)
    types it, so `to=123` is the text "123" for a string argument and the number for a numeric one. A list argument
    takes only `name in a,b`: each of its elements one of these (its items' schema types them); if it is optional
    with an empty default (`cc: list[str] | None = None`), a call may also leave it out. An object argument, or a list
    of objects, is bounded by its fields: `payment.currency=EUR`, `items.qty<=5` (every element's). A name the tool
    does not take, a secret argument (a grant's bounds are listed), a rule on a whole object, a range on a
    non-number, `=` on a list, or two rules for one argument that cannot both hold is refused."""
    bounds: Bounds = {}
    for text in texts:
        name, op, raw = _split(text)
        arg, _, field = name.partition(".")
        if arg not in properties:
            known = ", ".join(sorted(properties)) or "none"
            raise GrantRefused(f"--where {text!r}: the tool has no argument {arg!r} (its arguments: {known})")
        if arg in secret:
            raise GrantRefused(f"--where {text!r}: {arg!r} is a secret argument; a grant's bounds are shown to anyone")
        spec = _non_null(properties[arg])
        rule = bounds.setdefault(arg, {})
        if field:
            _field_rule(rule, arg, field, spec, op, raw, text)
        elif _json_type(spec) == "array":
            _list_rule(rule, arg, spec, op, raw, text)
        else:
            _value_rule(rule, arg, spec, op, raw, text)
        if _json_type(spec) == "array" and properties[arg].get("default", ...) in (None, []):
            rule["or_absent"] = True  # left out, it has no element
    return bounds


def _value_rule(rule: dict[str, Any], name: str, spec: Mapping[str, Any], op: str, raw: str, text: str) -> None:
    """`=`, `in` or a range on one value (an argument, or a field of an object)."""
    kind = _json_type(spec)
    if kind in ("object", "array"):
        raise GrantRefused(f"--where {text!r}: {_unbounded_whole(name, kind, spec)}; leave it out for any value")
    if op == "in":
        _add(rule, "in", _listed(raw, kind, text), text)
    elif op == "=":
        _add(rule, "eq", _value(raw, kind, text), text)
    else:
        if kind not in ("number", "integer", None):
            raise GrantRefused(f"--where {text!r}: {name!r} is a {kind}, not a number: a range cannot bound it")
        _add(rule, "max" if op == "<=" else "min", _number(raw, text), text)
    if "min" in rule and "max" in rule and rule["min"] > rule["max"]:
        raise GrantRefused(f"--where: {name} >= {rule['min']:g} and <= {rule['max']:g} admit no value")


def _list_rule(rule: dict[str, Any], name: str, spec: Mapping[str, Any], op: str, raw: str, text: str) -> None:
    """`name in a,b` on a list of values: each of its elements one of these."""
    items = _non_null(spec.get("items") or {})
    item_kind = _json_type(items)
    if item_kind == "object":
        raise GrantRefused(
            f"--where {text!r}: {name!r} is a list of objects: bound its elements' fields with "
            f"'{name}.field in a,b'{_fields_hint(items)}"
        )
    if op != "in":
        raise GrantRefused(
            f"--where {text!r}: {name!r} is a list: bound its elements with '{name} in a,b' (each one of these)"
        )
    _add(rule, "each_in", _listed(raw, item_kind, text), text)


def _field_rule(
    rule: dict[str, Any], arg: str, field: str, spec: Mapping[str, Any], op: str, raw: str, text: str
) -> None:
    """A rule on a field of an object argument (`fields`), or of every object of a list argument (`each`)."""
    kind = _json_type(spec)
    holder = _non_null(spec.get("items") or {}) if kind == "array" else spec
    fields = holder.get("properties")
    if _json_type(holder) != "object" or not isinstance(fields, Mapping) or not fields:
        raise GrantRefused(f"--where {text!r}: {arg!r} has no declared fields to bound")
    if field not in fields:
        known = ", ".join(sorted(fields)) or "none"
        raise GrantRefused(f"--where {text!r}: {arg!r} has no field {field!r} (its fields: {known})")
    key = "each" if kind == "array" else "fields"
    if set(rule) - {key, "or_absent"}:
        raise GrantRefused(f"--where {text!r}: the argument already has a rule that this one contradicts or repeats")
    _value_rule(
        rule.setdefault(key, {}).setdefault(field, {}), f"{arg}.{field}", _non_null(fields[field]), op, raw, text
    )


def _listed(raw: str, kind: str | None, text: str) -> list[Any]:
    """The values of `name in a,b`, each read as `kind`; at least one."""
    values = [_value(part.strip(), kind, text) for part in raw.split(",") if part.strip()]
    if not values:
        raise GrantRefused(f"--where {text!r}: 'in' needs at least one value")
    return values


def _fields_hint(spec: Mapping[str, Any]) -> str:
    fields = spec.get("properties")
    return f" (its fields: {', '.join(sorted(fields))})" if isinstance(fields, Mapping) and fields else ""


def _unbounded_whole(name: str, kind: str, spec: Mapping[str, Any]) -> str:
    """Why a rule on a whole object (or on a list inside an object) cannot be a bound, and what can."""
    if "." in name:
        return f"{name!r} is {'an object' if kind == 'object' else 'a list'}: a grant bounds one level of fields"
    if not spec.get("properties"):
        return f"{name!r} is an object with no declared fields: a grant cannot bound it"
    return f"{name!r} is an object: bound its fields with '{name}.field=value'{_fields_hint(spec)}"


def exact_bounds(
    args: Mapping[str, Any], properties: Mapping[str, Mapping[str, Any]], secret: frozenset[str]
) -> Bounds:
    """Bounds that admit only these arguments ("Approve + grant" in Slack): each argument the tool takes, equal to
    this call's value. Refused when no grant can be that exact: the call leaves out an argument the tool takes (bounds
    cannot require an argument to be absent, so the grant would cover any value of it), gives one the tool does not
    take, or gives a secret one (a grant's bounds are shown to anyone)."""
    hidden = sorted(set(args) & secret)
    if hidden:
        raise GrantRefused(f"{', '.join(hidden)}: a secret argument cannot bound a grant (its bounds are shown)")
    unknown = sorted(set(args) - set(properties))
    if unknown:
        raise GrantRefused(f"the call gives {', '.join(unknown)}, which the tool does not take")
    missing = sorted(set(properties) - set(args))
    if missing:
        raise GrantRefused(
            f"the call leaves out {', '.join(missing)}: a grant of its exact arguments would cover any value of it"
        )
    return {name: {"eq": value} for name, value in args.items()}


def shown_bounds(bounds: Mapping[str, Mapping[str, Any]], secret: frozenset[str]) -> Bounds:
    """Bounds as a notice shows them: a secret argument's rule masked whole, as `name=***` (no grant can bound a
    secret argument, but an argument may have become secret since the grant was made)."""
    return {name: {"eq": MASK} if name in secret else dict(rule) for name, rule in bounds.items()}


def _split(text: str) -> tuple[str, str, str]:
    found = _IN.match(text)
    if found:
        return found.group(1), "in", found.group(2)
    found = _COMPARED.match(text)
    if found is None or not found.group(3):
        raise GrantRefused(f"--where {text!r}: expected {WHERE_FORMS}")
    return found.group(1), found.group(2), found.group(3)


def _add(rule: dict[str, Any], key: str, value: Any, text: str) -> None:
    """A value rule (=, in) stands alone; a range may have one lower and one upper bound; fields' rules stand with
    no rule on their whole object."""
    alone = {"eq", "in", "each_in", *_NESTED}
    clash = bool(set(rule) - {"or_absent"}) if key in alone else bool({*alone, key} & set(rule))
    if clash:
        raise GrantRefused(f"--where {text!r}: the argument already has a rule that this one contradicts or repeats")
    rule[key] = value


def _non_null(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """An optional argument's schema (`anyOf` one type and null, as pydantic writes `X | None`) as that one type's."""
    options = schema.get("anyOf")
    if isinstance(options, list):
        typed = [o for o in options if isinstance(o, Mapping) and o.get("type") != "null"]
        if len(typed) == 1 and len(options) == 2:
            return typed[0]
    return schema


def _json_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    return kind if isinstance(kind, str) else None


def _value(raw: str, kind: str | None, text: str) -> Any:
    if kind == "string":
        return raw
    if kind in ("number", "integer"):
        return _number(raw, text)
    if kind == "boolean":
        if raw.lower() not in ("true", "false"):
            raise GrantRefused(f"--where {text!r}: expected true or false")
        return raw.lower() == "true"
    try:  # an argument whose schema gives no single type: a JSON scalar if the text is one, else the text
        value = json.loads(raw)
    except ValueError:
        return raw
    return value if isinstance(value, str | int | float | bool) else raw


def _number(raw: str, text: str) -> int | float:
    try:
        value = float(raw)
    except ValueError:
        raise GrantRefused(f"--where {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise GrantRefused(f"--where {text!r}: {raw!r} is not a finite number")
    return int(value) if value.is_integer() else value


def within_bounds(bounds: Mapping[str, Mapping[str, Any]], args: Mapping[str, Any]) -> bool:
    """Every bounded argument present and inside its rule; an argument the bounds do not name may be anything."""
    for name, rule in bounds.items():
        if rule.get("or_absent") and args.get(name) is None:
            continue
        if name not in args:
            return False
        value = args[name]
        if "eq" in rule and not _same(value, rule["eq"]):
            return False
        if "in" in rule and not any(_same(value, allowed) for allowed in rule["in"]):
            return False
        if "each_in" in rule and not _each_within(value, rule["each_in"]):
            return False
        if ("min" in rule or "max" in rule) and not _number_within(value, rule.get("min"), rule.get("max")):
            return False
        if "fields" in rule and not (isinstance(value, Mapping) and within_bounds(rule["fields"], value)):
            return False
        if "each" in rule and not _each_object_within(value, rule["each"]):
            return False
    return True


def _each_object_within(value: Any, fields: Mapping[str, Mapping[str, Any]]) -> bool:
    """A list each of whose elements is an object with its bounded fields inside their rules (an empty list too)."""
    return isinstance(value, list) and all(isinstance(item, Mapping) and within_bounds(fields, item) for item in value)


def _same(value: Any, expected: Any) -> bool:
    """Equal and of the same kind: True is not 1, "5" is not 5 (a number equals a number: 100 is 100.0)."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if isinstance(value, int | float) and isinstance(expected, int | float):
        return value == expected
    return type(value) is type(expected) and value == expected


def _each_within(value: Any, allowed: Sequence[Any]) -> bool:
    """A list each of whose elements is one of `allowed` (an empty list too: it asks for nothing outside them)."""
    return isinstance(value, list) and all(any(_same(item, a) for a in allowed) for item in value)


def _number_within(value: Any, low: float | None, high: float | None) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def describe_bounds(bounds: Mapping[str, Mapping[str, Any]]) -> str:
    """Bounds in the `--where` forms they were given in: "to=bo, amount<=100"."""
    return ", ".join(bound_clauses(bounds)) or "any arguments"


def bound_clauses(bounds: Mapping[str, Mapping[str, Any]], prefix: str = "") -> list[str]:
    """Each bound in its `--where` form, by argument name: ["amount<=100", "to=bo"] (a field's as "items.qty<=5")."""
    parts = []
    for name, rule in sorted(bounds.items()):
        shown = f"{prefix}{name}"
        if "eq" in rule:
            parts.append(f"{shown}={_shown(rule['eq'])}")
        for key in ("in", "each_in"):  # a list's rule reads as it was given: the argument's type tells them apart
            if key in rule:
                parts.append(f"{shown} in {','.join(_shown(v) for v in rule[key])}")
        if "min" in rule:
            parts.append(f"{shown}>={rule['min']:g}")
        if "max" in rule:
            parts.append(f"{shown}<={rule['max']:g}")
        for key in _NESTED:
            if key in rule:
                parts.extend(bound_clauses(rule[key], f"{shown}."))
    return parts


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def granter_refusal(policy: ToolPolicy, tool: str, granter: CallContext, requester: str | None) -> str | None:
    """Why this person may not grant (or confirm a grant of) calls of `tool` for `requester` (None: anyone), or None.
    A grant is an approval given ahead of time: the granter must be a reviewer the tool's rule admits for the
    requester's calls (never the requester herself unless the policy allows self-approval), and only a tool whose
    policy opts in can be granted at all. Backup approvers decide late requests; a grant is none."""
    if not policy.grantable:
        return f"{tool} is not grantable (its ToolPolicy does not set grantable=True)"
    if granter.user_id is None:
        return "granting needs an identified reviewer (a user id)"
    refusal = policy.reviewer_refusal(granter, requester)
    if refusal is None:
        return None
    if granter.user_id == requester:
        return f"{granter.user_id} may not grant her own calls of {tool} (its policy does not allow self-approval)"
    return refusal.replace("deciding this call", f"granting calls of {tool}")


def granters_for(policy: ToolPolicy, grant: Grant, requester: str | None) -> list[str]:
    """The distinct granters of `grant` who may approve `requester`'s calls under the policy now (the quorum so far):
    for a grant covering anyone, its granters other than the requester of the call at hand (unless self-approval)."""
    counted: list[str] = []
    for confirmation in grant.confirmations:
        granter = CallContext(user_id=confirmation.granter, roles=confirmation.roles)
        if granter_refusal(policy, grant.tool, granter, requester) is None and confirmation.granter not in counted:
            counted.append(confirmation.granter)
    return counted


def grant_status(policy: ToolPolicy | None, grant: Grant, now: float) -> str:
    """What a grant is now: revoked, expired, used up, pending (not enough authorized granters yet) or live."""
    if grant.revoked_at is not None:
        return "revoked"
    if now >= grant.expires_at:
        return "expired"
    if grant.uses_left == 0:
        return "used up"
    if policy is None or not policy.grantable:
        return "void (the tool is not grantable now)"
    counted = len(granters_for(policy, grant, grant.requester))
    if counted < policy.approvals_required:
        return f"pending ({counted} of {policy.approvals_required} granters)"
    return "live"


def covering_grants(
    grants: Sequence[Grant], policy: ToolPolicy, tool: str, args: Mapping[str, Any], requester: CallContext, now: float
) -> tuple[str, ...]:
    """The grants that approve this call in a person's place, in the order the claim tries them: the one ending
    soonest first (then the one with fewest uses left), so short and small grants are spent before broad ones."""
    if not policy.grantable:
        return ()
    fit = [
        g
        for g in grants
        if g.tool == tool
        and g.open_at(now)
        and (g.requester is None or g.requester == requester.user_id)
        and within_bounds(g.bounds, args)
        and len(granters_for(policy, g, requester.user_id)) >= policy.approvals_required
    ]
    return tuple(g.grant_id for g in sorted(fit, key=lambda g: (g.expires_at, g.uses_left, g.grant_id)))


def charges(policy: ToolPolicy, args: Mapping[str, Any], requester: CallContext) -> list[Charge] | str:
    """What this write is charged against each of the policy's limits, or why it cannot be (a summed argument that
    is not a number: the write is refused rather than charged nothing)."""
    found: list[Charge] = []
    for limit in policy.limits:
        amount = _amount(limit, args)
        if isinstance(amount, str):
            return amount
        found.append(
            {
                "limit": limit.key,
                "described": limit.describe(),
                "group": _group(limit, args, requester),
                "window_s": float(limit.window_s),
                "amount": amount,
                "at_most": float(limit.at_most),
                "over": limit.over,
            }
        )
    return found


def _amount(limit: UsageLimit, args: Mapping[str, Any]) -> float | str:
    if limit.sums is None:
        return 1.0
    value = args.get(limit.sums)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return f"Not run: the limit {limit.describe()} sums {limit.sums!r}, which this call does not give as a number."
    return float(value)


def _group(limit: UsageLimit, args: Mapping[str, Any], requester: CallContext) -> str:
    """The counter's group: the requester, a field of her context, an argument's value ("" when absent, so calls
    without it share one counter), or "" for a limit kept for every call together."""
    if limit.per is None:
        return ""
    if limit.per == "requester":
        return requester.user_id or ""
    kind, _, name = limit.per.partition(":")
    value = requester.extra.get(name) if kind == "context" else args.get(name)
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
