"""gatedloop's auth served by Aegra: `"auth": {"path": "gatedloop.graph.aegra_auth:auth"}` in aegra.json.

The same tokens file as `gatedloop.graph.auth` (`GATEDLOOP_AUTH_TOKENS` / `GATEDLOOP_AUTH_FILE`) and the same rule
as under `langgraph dev`: a thread is its creator's; a supervisor of her workspace reads it and answers it; a user of
another workspace does not find it (404). What Aegra 0.11 does with an auth user, and so why this module exists:

- Every thread, run and checkpoint read is scoped to the auth user's `identity` (`Thread.user_id == identity`, and
  `Run.user_id` likewise) before any handler is asked, so a user whose `identity` is her own name never reaches
  another's thread. Here `identity` is her workspace, `workspace:<name>` (`workspace:default` in a file that names
  no workspaces): Aegra's own scope is the line between workspaces, on every route.
- The person and her roles ride beside it in the auth user (`user_id`, `roles`), which Aegra hands each run whole as
  `langgraph_auth_user` (a client's `config` cannot replace it), so the gate judges an answer under the person
  (`gatedloop.nodes.wire.identity`, `PERSON_FIELD`) and the audit names her, never the workspace.
- Aegra calls the `@auth.on` handlers on every thread and run route, but applies a returned metadata filter only
  when it lists, searches, gets or deletes threads; for state, history, updates and runs it keeps only a refusal.
  So for a user who is not a supervisor each handler both returns the owner filter (`gatedloop_owner`: Aegra sets
  `owner` to the `identity` itself) and, when the request names a thread, looks that thread up in Aegra's database
  and refuses it with Aegra's own 404 unless it is hers. Supervisors need neither: the workspace is their scope.

Without a configuration this is `gatedloop.graph.auth`'s unrestricted local user, as there.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langgraph_sdk import Auth

from gatedloop.graph.auth import (
    OWNER_KEY,
    AuthConfig,
    TokenUser,
    build_auth,
    load_auth_config,
    refuse_restamping,
    refuse_routing,
    request_token,
    stamped,
)
from gatedloop.nodes.wire.identity import AUTH_KIND_FIELD, PERSON_FIELD, TOKEN_USER_MARK

PERSON_KEY = "gatedloop_owner"
"""The thread metadata naming the person who made it (Aegra's own `owner` is the workspace)."""
WORKSPACE_PREFIX = "workspace:"

ThreadMetadata = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(thread id, Aegra identity) -> the metadata of that thread in that scope, or None when it has no such thread."""


async def aegra_thread_metadata(thread_id: str, identity: str) -> Mapping[str, Any] | None:
    """The thread's metadata from Aegra's own database (imported here: only a process Aegra runs calls this)."""
    from aegra_api.core.orm import Thread, get_session_maker

    async with get_session_maker()() as session:
        thread = await session.get(Thread, thread_id)
    if thread is None or thread.user_id != identity:
        return None
    return thread.metadata_json or {}


def aegra_user(config: AuthConfig, user: TokenUser) -> dict[str, Any]:
    """The auth user Aegra keeps: scoped to her workspace, naming the person and her roles for the graph."""
    workspace = config.workspace_of(user.user_id)
    return {
        "identity": WORKSPACE_PREFIX + workspace,
        "display_name": user.user_id,
        PERSON_FIELD: user.user_id,
        "roles": sorted(user.roles),
        "workspace": workspace,
        AUTH_KIND_FIELD: TOKEN_USER_MARK,
    }


def person_of(ctx: Auth.types.AuthContext) -> str:
    return str(getattr(ctx.user, PERSON_FIELD))


def build_aegra_auth(config: AuthConfig | None, thread_metadata: ThreadMetadata = aegra_thread_metadata) -> Auth:
    """The `Auth` object Aegra loads; `thread_metadata` finds a thread's owner (Aegra's database when served)."""
    if config is None:
        return build_auth(None)
    auth = Auth()

    @auth.authenticate
    async def workspace_user(headers: Mapping[Any, Any] | None = None) -> dict[str, Any]:
        user = config.user_for(request_token(headers))
        if user is None:
            raise Auth.exceptions.HTTPException(status_code=401, detail="unknown token")
        return aegra_user(config, user)

    async def only_hers(ctx: Auth.types.AuthContext, value: Any) -> dict[str, str] | None:
        """For a user who is not a supervisor: a thread the request names must be hers (else 404, as Aegra answers
        for a thread outside the scope, so its existence is not told), and the filter for listings."""
        person = person_of(ctx)
        if config.is_supervisor(person):
            return None
        thread_id = value.get("thread_id")
        if thread_id:
            metadata = await thread_metadata(str(thread_id), ctx.user.identity)
            if metadata is not None and metadata.get(PERSON_KEY) != person:
                raise Auth.exceptions.HTTPException(status_code=404, detail=f"Thread '{thread_id}' not found")
        return {PERSON_KEY: person}

    @auth.on.threads.create
    async def on_thread_create(ctx: Auth.types.AuthContext, value: Auth.types.ThreadsCreate) -> None:
        """Returns nothing: Aegra reads a returned dict's `metadata` as the new thread's (`if_exists` may name
        an existing thread, hence the check)."""
        await only_hers(ctx, value)
        stamped(value, {PERSON_KEY: person_of(ctx)})

    @auth.on.threads.create_run
    async def on_run_create(ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate) -> None:
        """Returns nothing: Aegra reads a returned dict as the run's `config` and `context` overrides. A thread
        the run creates is Aegra's doing, without the person: only supervisors see it (create threads first)."""
        refuse_routing(value)
        await only_hers(ctx, value)

    @auth.on.threads.update
    async def on_thread_update(ctx: Auth.types.AuthContext, value: Auth.types.ThreadsUpdate) -> None:
        """Returns nothing (Aegra reads a returned dict's `metadata` as the update). Cancelling runs by status
        (`POST /runs/cancel` without a thread) reaches the whole workspace: supervisors only."""
        refuse_restamping(value, OWNER_KEY, PERSON_KEY)
        if not value.get("thread_id") and not config.is_supervisor(person_of(ctx)):
            raise Auth.exceptions.HTTPException(status_code=403, detail="only supervisors may cancel runs by status")
        await only_hers(ctx, value)

    @auth.on(resources="threads", actions=["read", "delete", "search"])
    async def on_thread_access(ctx: Auth.types.AuthContext, value: Any) -> dict[str, str] | None:
        return await only_hers(ctx, value)

    @auth.on(resources="assistants", actions=["read", "search"])
    async def on_assistant_read(ctx: Auth.types.AuthContext, value: Any) -> None:
        return None

    @auth.on
    async def supervisors_only(ctx: Auth.types.AuthContext, value: Any) -> None:
        if not config.is_supervisor(person_of(ctx)):
            raise Auth.exceptions.HTTPException(
                status_code=403, detail=f"only supervisors may {ctx.action} {ctx.resource}"
            )

    return auth


auth = build_aegra_auth(load_auth_config(os.environ))
