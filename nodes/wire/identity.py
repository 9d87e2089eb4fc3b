"""Who is calling: read once per call as it enters the graph (`gatedloop.graph.gated`), then carried as data.

The identity found here is bound to what the call carries (the requester of its message, the sender of its
answer) and put in the runtime context its tools see; no node asks who is running it. Two sources, and one rule
for choosing between them:

- The runtime context of the call (`graph.invoke(..., context=CallContext(...))`, or the `context` a LangGraph
  Server client sends with a run). In plain Python the caller is trusted code, so this is the identity.
- The user LangGraph Server authenticated for the request. For every run the server writes it into
  `config["configurable"]["langgraph_auth_user"]` (langgraph_api.models.run.create_valid_run; a client cannot set
  that key: the server strips it from a request's `config` and `context`, then sets it), as the auth handler
  returned it, normalised to a `BaseUser` (usually `ProxyUser`; a plain dict after a round trip through JSON).

The rule: when the server put a user with a non-empty `identity` there, that user is the caller. Its `identity` is
`user_id` and its `roles` (a list of strings in the user the auth handler returned, as gatedloop's auth does) are
the roles; a user without `roles` has none (fail closed: no client-sent role counts). A user of gatedloop's token
auth that names a `PERSON_FIELD` is that person: under Aegra its `identity` is her workspace, which Aegra scopes
threads by (`gatedloop.graph.aegra_auth`); the field is the auth handler's, like the rest of the user. The client's
`user_id` and `roles` are ignored; the other context keys stay in `extra`. Otherwise the runtime context is used as
it is:

- plain Python (no server, so no such key);
- a server without custom auth: the server records its unauthenticated user as `None`;
- gatedloop's own auth left unconfigured (`gatedloop.graph.auth`): its single local user is marked with
  `LOCAL_USER_MARK` and stands for "nobody authenticated", so `langgraph dev` and Studio behave as without auth.

A server whose auth is someone else's (LangSmith, Studio's own user, another module) is still authority: its
user's identity overrides, with the roles it states, or none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig

from gatedloop.tools.policy import CallContext

SERVER_USER_KEY = "langgraph_auth_user"
AUTH_KIND_FIELD = "gatedloop_auth"
LOCAL_USER_MARK = "local"
"""`{AUTH_KIND_FIELD: LOCAL_USER_MARK}` in a server user: gatedloop's unconfigured fallback, not an identity."""
TOKEN_USER_MARK = "token"
"""`{AUTH_KIND_FIELD: TOKEN_USER_MARK}` in a server user: a user of gatedloop's token auth."""
PERSON_FIELD = "user_id"


def caller_context(runtime_context: Any, config: RunnableConfig | None) -> CallContext:
    """The caller's identity for this run: the server's authenticated user if there is one, else the context."""
    client = client_context(runtime_context)
    user = server_user(config)
    if user is None:
        return client
    return CallContext(user_id=user[0], roles=user[1], extra=client.extra)


def client_context(context: Any) -> CallContext:
    """The runtime context as a CallContext: accepts a CallContext, a dict (from the SDK or Studio), or nothing."""
    if isinstance(context, CallContext):
        return context
    if isinstance(context, Mapping):
        return CallContext(
            user_id=context.get("user_id"),
            roles=frozenset(context.get("roles") or ()),
            extra={k: v for k, v in context.items() if k not in ("user_id", "roles")},
        )
    if context is not None and hasattr(context, "user_id"):  # a `context_schema` of the user's (dataclass, model)
        roles = getattr(context, "roles", None) or ()
        return CallContext(user_id=context.user_id, roles=frozenset(roles), extra={"context": context})
    return CallContext()


def server_user(config: RunnableConfig | None) -> tuple[str, frozenset[str]] | None:
    """(identity, roles) of the user LangGraph Server authenticated for this run, or None when there is none."""
    raw = ((config or {}).get("configurable") or {}).get(SERVER_USER_KEY)
    if raw is None:
        return None
    fields = _user_fields(raw)
    named = fields.get(PERSON_FIELD) if fields.get(AUTH_KIND_FIELD) == TOKEN_USER_MARK else None
    identity = named if isinstance(named, str) and named else fields.get("identity")
    if not isinstance(identity, str) or not identity or fields.get(AUTH_KIND_FIELD) == LOCAL_USER_MARK:
        return None
    roles = fields.get("roles")
    if isinstance(roles, str) or not isinstance(roles, list | tuple | set | frozenset):
        return identity, frozenset()
    return identity, frozenset(r for r in roles if isinstance(r, str))


def _user_fields(user: Any) -> Mapping[str, Any]:
    """A server user as a mapping: a dict, or a BaseUser with `dict()` (ProxyUser, StudioUser), or `.identity`."""
    if isinstance(user, Mapping):
        return user
    as_dict = getattr(user, "dict", None)
    if callable(as_dict):
        fields = as_dict()
        if isinstance(fields, Mapping):
            return fields
    return {"identity": getattr(user, "identity", None)}


def stored_identity(who: CallContext) -> dict[str, Any]:
    """An identity as the graph's data carries it (a resume value's sender, a message's requester): JSON only."""
    return {"user_id": who.user_id, "roles": sorted(who.roles)}


def identity_from_stored(body: Any) -> CallContext:
    """The CallContext a `stored_identity` stands for; anything else (absent, forged shape) is anonymous."""
    if not isinstance(body, Mapping):
        return CallContext()
    user_id, roles = body.get("user_id"), body.get("roles")
    if not isinstance(user_id, str) or not user_id:
        user_id = None
    if not isinstance(roles, list):
        roles = []
    return CallContext(user_id=user_id, roles=frozenset(r for r in roles if isinstance(r, str)))


def requester_of(state: Mapping[str, Any], context: Any) -> CallContext:
    """Who asked for the calls of this turn: the sender of the latest human message, as bound when it entered
    (`GatedState.requester`; anonymous when none was, as for a thread started before requesters were bound),
    with the run's other context fields (`extra`) for validators and predicates."""
    asked = identity_from_stored(state.get("requester"))
    return CallContext(user_id=asked.user_id, roles=asked.roles, extra=client_context(context).extra)


def authenticated_context(context: Any, schema: type[Any] | None, config: RunnableConfig | None) -> Any:
    """The runtime context a run's tools and nodes see: under a server's auth, its identity fields are the
    authenticated user's, whatever the client sent (a client's `user_id`/`roles` are dropped, not kept beside);
    without server auth the context is the caller's own and is returned as it is."""
    user = server_user(config)
    if user is None:
        return context
    identity = {"user_id": user[0], "roles": sorted(user[1])}
    if context is None or isinstance(context, Mapping):
        fields = _identity_fields(schema)
        rest = {k: v for k, v in (context or {}).items() if k not in ("user_id", "roles")}
        if context is None and schema is CallContext:
            return CallContext(user_id=user[0], roles=user[1])
        if context is None and not fields:
            return None
        return {**rest, **{k: v for k, v in identity.items() if k in fields}}
    if isinstance(context, CallContext):
        return CallContext(user_id=user[0], roles=user[1], extra=context.extra)
    fields = _identity_fields(type(context))
    update = {k: v for k, v in identity.items() if k in fields}
    if dataclasses.is_dataclass(context) and not isinstance(context, type):
        return dataclasses.replace(context, **update)
    copy = getattr(context, "model_copy", None)
    if callable(copy):  # a pydantic model
        return copy(update=update)
    raise TypeError(
        f"cannot put the authenticated user into a {type(context).__name__} context; use a dataclass, a pydantic "
        "model or a TypedDict as context_schema"
    )


def declared_fields(schema: type[Any] | None) -> tuple[str, ...]:
    """The fields a context schema declares (a dataclass, pydantic model or TypedDict); none for another type."""
    if schema is None:
        return ()
    if dataclasses.is_dataclass(schema):
        return tuple(f.name for f in dataclasses.fields(schema))
    model_fields = getattr(schema, "model_fields", None)
    if isinstance(model_fields, Mapping):
        return tuple(model_fields)
    return tuple(getattr(schema, "__annotations__", None) or ())


def _identity_fields(schema: type[Any] | None) -> set[str]:
    """Which of `user_id` and `roles` a context schema declares."""
    return set(declared_fields(schema)) & {"user_id", "roles"}
