"""Who is calling: the `CallContext` that validators, approval predicates and the approve node see.

Two sources, and one rule for choosing between them:

- The runtime context of the call (`graph.invoke(..., context=CallContext(...))`, or the `context` a LangGraph
  Server client sends with a run). In plain Python the caller is trusted code, so this is the identity.
- The user LangGraph Server authenticated for the request. For every run the server writes it into
  `config["configurable"]["langgraph_auth_user"]` (langgraph_api.models.run.create_valid_run; a client cannot set
  that key: the server strips it from a request's `config` and `context`, then sets it), as the auth handler
  returned it, normalised to a `BaseUser` (usually `ProxyUser`; a plain dict after a round trip through JSON).

The rule: when the server put a user with a non-empty `identity` there, that user is the caller. Its `identity` is
`user_id` and its `roles` (a list of strings in the user the auth handler returned, as gatedloop's auth does) are
the roles; a user without `roles` has none (fail closed: no client-sent role counts). The client's `user_id` and
`roles` are ignored; the other context keys stay in `extra`. Otherwise the runtime context is used as it is:

- plain Python (no server, so no such key);
- a server without custom auth: the server records its unauthenticated user as `None`;
- gatedloop's own auth left unconfigured (`gatedloop.graph.auth`): its single local user is marked with
  `LOCAL_USER_MARK` and stands for "nobody authenticated", so `langgraph dev` and Studio behave as without auth.

A server whose auth is someone else's (LangSmith, Studio's own user, another module) is still authority: its
user's identity overrides, with the roles it states, or none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig

from gatedloop.tools.policy import CallContext

SERVER_USER_KEY = "langgraph_auth_user"
AUTH_KIND_FIELD = "gatedloop_auth"
LOCAL_USER_MARK = "local"
"""`{AUTH_KIND_FIELD: LOCAL_USER_MARK}` in a server user: gatedloop's unconfigured fallback, not an identity."""


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
    identity = fields.get("identity")
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
