"""Who the graph believes is calling (gatedloop.nodes.wire.identity): the server's authenticated user when there is
one, the runtime context otherwise. Driven through a real graph on a real SQLite file; the user is put where
LangGraph Server puts it (`configurable["langgraph_auth_user"]`), in the shapes it takes there: a dict (after a JSON
round trip), a user object with `dict()` (as the server's ProxyUser and StudioUser; langgraph_api cannot be imported
outside the server, so `ServerUser` stands in; the real ones are driven in test_server_auth.py), or an object with
only `identity` (langgraph_sdk's StudioUser)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph_sdk.auth.types import StudioUser

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.nodes.wire.identity import AUTH_KIND_FIELD, LOCAL_USER_MARK, caller_context
from gatedloop.tools import CallContext, ToolPolicy


class ServerUser:
    """A user as langgraph_api's ProxyUser presents one: `identity` and `dict()` with the handler's fields."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields

    @property
    def identity(self) -> str:
        return self.fields["identity"]

    def dict(self) -> dict[str, Any]:
        return {"is_authenticated": True, **self.fields}


FORGED = CallContext(user_id="the-CFO", roles=frozenset({"finance"}), extra={"locale": "de"})


def seen_by_the_graph(db: str, server_user: Any, context: Any) -> CallContext:
    """Run one call whose validator records the CallContext it is given (each time it is checked: one caller)."""
    seen: list[CallContext] = []

    @tool
    def whoami() -> str:
        """Who is calling (read)."""
        return "seen"

    def record(args: dict[str, Any], ctx: CallContext) -> str | None:
        seen.append(ctx)
        return None

    configurable: dict[str, Any] = {"thread_id": str(uuid.uuid4())}
    if server_user is not None:
        configurable["langgraph_auth_user"] = server_user
    with open_sqlite(db) as saver:
        graph = build_graph(
            ScriptedChatModel(script=[reply(calls=[call("whoami", {}, "c1")]), reply("done")]),
            [whoami],
            policies={"whoami": ToolPolicy(effect="read", approval="never", validator=record)},
            checkpointer=saver,
        )
        out = graph.invoke({"messages": [("user", "who am I")]}, {"configurable": configurable}, context=context)
    assert out["status"] == "completed" and seen
    assert all(c == seen[0] for c in seen), seen
    return seen[0]


@pytest.mark.parametrize(
    "server_user",
    [
        ServerUser(identity="ana", roles=["staff"], **{AUTH_KIND_FIELD: "token"}),
        {"identity": "ana", "roles": ["staff"]},
    ],
    ids=["user-object", "dict"],
)
def test_the_server_user_overrides_the_client_context(db: str, server_user: Any) -> None:
    expected = CallContext(user_id="ana", roles=frozenset({"staff"}), extra={"locale": "de"})
    assert seen_by_the_graph(db, server_user, FORGED) == expected


def test_a_server_user_without_roles_has_none_whatever_the_client_claims(db: str) -> None:
    for user in (ServerUser(identity="ana"), StudioUser("langgraph-studio-user")):
        seen = seen_by_the_graph(db, user, {"user_id": "the-CFO", "roles": ["finance"]})
        assert (seen.user_id, seen.roles) == (user.identity, frozenset())


@pytest.mark.parametrize(
    "server_user",
    [
        None,
        ServerUser(identity="local", **{AUTH_KIND_FIELD: LOCAL_USER_MARK}),
        {"identity": ""},
        ServerUser(identity=""),
    ],
    ids=["no-server", "gatedloop-local-fallback", "empty-identity-dict", "empty-identity-user"],
)
def test_without_an_authenticated_user_the_runtime_context_is_the_caller(db: str, server_user: Any) -> None:
    assert seen_by_the_graph(db, server_user, FORGED) == FORGED
    expected = CallContext(user_id="bo", roles=frozenset({"x"}))
    assert seen_by_the_graph(db, server_user, {"user_id": "bo", "roles": ["x"]}) == expected


def test_roles_of_a_foreign_user_that_are_not_a_list_of_names_count_as_none() -> None:
    config: Any = {"configurable": {"langgraph_auth_user": ServerUser(identity="ana", roles="finance")}}
    assert caller_context(FORGED, config).roles == frozenset()
    config["configurable"]["langgraph_auth_user"] = {"identity": "ana", "roles": ["finance", 7, None]}
    assert caller_context(None, config) == CallContext(user_id="ana", roles=frozenset({"finance"}))
