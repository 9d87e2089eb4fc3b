"""A graph's runtime context, whatever its `context_schema`: built for a caller, kept with a request, reused by
its answers.

A user's schema (a dataclass, pydantic model or TypedDict with fields of the team's beside `user_id` and
`roles`) must reach the tools on every run, including the runs that only carry an answer: the CLI's, the inbox's,
Agent Chat UI's, which know nothing of the team's fields. So the fields a request was made under (the ones that
are JSON data, identity fields left out) are kept with its requester in the state, and an answer that brings no
value for a field gets the request's. Identity fields are never reused: an answer's identity is its sender's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from gatedloop.nodes.wire.identity import declared_fields
from gatedloop.tools.arguments import argument_problem
from gatedloop.tools.policy import CallContext, ToolPolicy

IDENTITY_FIELDS = ("user_id", "roles")
ROLE_RULES = ("roles", "approvers", "backup_approvers")
"""The `ToolPolicy` fields that name roles a caller must hold (to ask, to decide, to decide once escalated)."""


def context_for(schema: type[Any] | None, caller: CallContext, fields: Mapping[str, Any]) -> Any:
    """The context a front end (the CLI, the inbox) sends for `caller` with the team's `fields`: a CallContext
    for gatedloop's own schema, else a dict that LangGraph turns into the schema (fields it lacks are filled from
    the request's context as the run enters, `reused_fields`)."""
    if schema is None or schema is CallContext:
        return CallContext(user_id=caller.user_id, roles=caller.roles, extra=dict(fields))
    identity = {"user_id": caller.user_id, "roles": sorted(caller.roles)}
    declared = declared_fields(schema)
    return {**dict(fields), **{k: v for k, v in identity.items() if k in declared}}


def field_problem(schema: type[Any] | None, context: Any, *, new_request: bool) -> str | None:
    """What is wrong with the fields of a front end's context (`context_for`'s dict), naming them, or None. A field
    the schema does not declare is a typo that LangGraph would raise on deep in the run (a dataclass) or drop
    unseen (a pydantic model); a required field left out fails a new request, while an answer may leave it out (it
    reuses the request's, `reused_fields`). gatedloop's own `CallContext` takes any field (as `extra`)."""
    declared = declared_fields(schema)
    if schema is None or not declared or not isinstance(context, Mapping):
        return None
    name = schema.__name__
    unknown = [] if _takes_any_field(schema) else [f for f in context if f not in declared]
    if unknown:
        return f"{name} has no field {', '.join(map(repr, unknown))} (its fields: {', '.join(declared)})"
    missing = [f for f in _required_fields(schema) if f not in context] if new_request else []
    if missing:
        return f"{name} needs the field {', '.join(map(repr, missing))}, which a new request has no earlier value for"
    return None


def unreachable_roles(schema: type[Any] | None, policies: Mapping[str, ToolPolicy]) -> str | None:
    """Why no caller can ever hold a role these policies name, or None. A caller's roles are read from the
    context's `roles` (gatedloop.nodes.wire.identity), so a schema that declares its fields without one leaves every
    role-based rule unmet: each approval refused ("needs one of the roles ..."), each call by role denied. Only
    LangGraph Server's authenticated user brings roles of its own, whatever the schema."""
    declared = declared_fields(schema)
    if schema is None or not declared or "roles" in declared:
        return None
    named = [
        f"{tool} {rule} {sorted(roles)}"
        for tool, policy in sorted(policies.items())
        for rule in ROLE_RULES
        if (roles := getattr(policy, rule)) is not None
    ]
    if not named:
        return None
    return (
        f"context_schema {schema.__name__} has no 'roles' field, so no caller can hold the roles its policies name "
        f"({'; '.join(named)}) and each rule that needs one would refuse everyone: add roles: list[str] to "
        f"{schema.__name__}"
    )


def _required_fields(schema: type[Any]) -> list[str]:
    """The fields a schema cannot be made without: no default (dataclass, pydantic), or a TypedDict's required keys."""
    if dataclasses.is_dataclass(schema):
        empty = dataclasses.MISSING
        return [f.name for f in dataclasses.fields(schema) if f.default is empty and f.default_factory is empty]
    model_fields = getattr(schema, "model_fields", None)
    if isinstance(model_fields, Mapping):
        return [name for name, spec in model_fields.items() if spec.is_required()]
    return sorted(getattr(schema, "__required_keys__", ()))


def _takes_any_field(schema: type[Any]) -> bool:
    """A pydantic model configured to keep fields it does not declare (`extra="allow"`)."""
    config = getattr(schema, "model_config", None)
    return isinstance(config, Mapping) and config.get("extra") == "allow"


def kept_fields(context: Any) -> dict[str, Any]:
    """The non-identity fields of a request's context that can be kept as data (JSON values only)."""
    if isinstance(context, CallContext):
        return {}
    if isinstance(context, Mapping):
        values: Mapping[str, Any] = context
    elif dataclasses.is_dataclass(context) and not isinstance(context, type):
        values = {f.name: getattr(context, f.name) for f in dataclasses.fields(context)}
    elif callable(getattr(context, "model_dump", None)):
        values = context.model_dump(mode="json")
    else:
        return {}
    return {k: v for k, v in values.items() if k not in IDENTITY_FIELDS and _is_data(v)}


def missing_fields(context: Any, schema: type[Any] | None) -> bool:
    """Whether an answer's context leaves out non-identity fields its schema declares (nothing, or a dict). Not
    for gatedloop's own `CallContext`, whose `extra` is optional and which an answer never needs to rebuild."""
    if schema is None or schema is CallContext or not (context is None or isinstance(context, Mapping)):
        return False
    wanted = [f for f in declared_fields(schema) if f not in IDENTITY_FIELDS]
    return any(f not in (context or {}) for f in wanted)


def reused_fields(context: Any, schema: type[Any] | None, kept: Mapping[str, Any]) -> Any:
    """An answer's context with the fields it lacks taken from the request's `kept` fields."""
    declared = declared_fields(schema)
    filled = {k: v for k, v in kept.items() if k in declared and k not in IDENTITY_FIELDS}
    return {**filled, **dict(context or {})} if filled or context is not None else None


def _is_data(value: Any) -> bool:
    if argument_problem(value) is not None:
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
