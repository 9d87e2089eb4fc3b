"""Bearer-token auth for LangGraph Server, named in `langgraph.json` as `"auth": {"path": "gatedloop.graph.auth:auth"}`.

Configuration (read once, when the server imports this module) comes from exactly one of:

- `GATEDLOOP_AUTH_TOKENS`: the JSON itself;
- `GATEDLOOP_AUTH_FILE`: the path of a file holding it.

```json
{
  "supervisor_roles": ["finance"],
  "tokens": {
    "a-long-random-token-for-ana": {"user_id": "ana", "roles": ["staff"]},
    "sha256:<64 hex digits>":      {"user_id": "bo", "roles": ["finance"]}
  }
}
```

A token may name the user's `workspace` (a team; every token names one, or none does): a supervisor then sees the
threads of her own workspace only. A file that names no workspaces is one workspace, the rule below unchanged.

A request must carry `Authorization: Bearer <token>` or, as Agent Chat UI sends its key, `X-Api-Key: <token>` (both
only if they carry the same token); the token names the user and her roles (a key may be the token itself, at least
16 characters, or `sha256:` and the hex SHA-256 of it, so the file need not hold secrets). The authenticate handler
takes the request's `headers`, which both servers pass: langgraph-api by name (raw bytes), Aegra positionally (text).
The graph sees that user as the caller whatever `context` the client sends (`gatedloop.nodes.wire.identity`).
Aegra scopes threads by the auth user's `identity`, so it is served by `gatedloop.graph.aegra_auth`, which reads the
same configuration.

Who sees what: a thread belongs to the user who created it (its `owner` metadata, set here, never by the client).
Its state, history, runs (start, resume, stream, join, cancel), updates and search results are visible to its
owner and to supervisors: users holding any of `supervisor_roles` (they review other people's requests; where
workspaces are named, those of their workspace, recorded on each thread as its `workspace` metadata). Anyone
may read assistants; anything else (assistant writes, crons, the store API) is for supervisors only. Which tool
calls a supervisor may decide is still up to each tool's `ToolPolicy.approvers` (the word "approvers" means only
that). `approver_roles`, this key's old name, is still read in this release, with a warning.

With neither variable set, every request is one local user and nothing is restricted, so `langgraph dev` and
Studio work offline as without auth; that user is marked so the graph keeps using the runtime context.
A bad configuration stops the server at start with one `AuthConfigError` naming the problem (never the token).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from langgraph_sdk import Auth
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, ValidationError, model_validator

from gatedloop.nodes.wire.identity import AUTH_KIND_FIELD, LOCAL_USER_MARK, TOKEN_USER_MARK

TOKENS_ENV = "GATEDLOOP_AUTH_TOKENS"
FILE_ENV = "GATEDLOOP_AUTH_FILE"
OWNER_KEY = "owner"
WORKSPACE_KEY = "workspace"
DEFAULT_WORKSPACE = "default"
"""The workspace of every user of a file that names none."""
LOCAL_USER_ID = "local"
DEFAULT_STATS_ROLE = "supervisor"
"""Who sees the inbox's reviewer telemetry when the configuration names no `stats_roles`."""
MIN_TOKEN_CHARS = 16
OLD_SUPERVISOR_KEY = "approver_roles"
log = logging.getLogger("gatedloop.auth")
HASHED_PREFIX = "sha256:"
_HASHED = re.compile(r"sha256:[0-9a-f]{64}")

Name = Annotated[str, StringConstraints(min_length=1, pattern=r"^\S(.*\S)?$")]


class AuthConfigError(ValueError):
    """The auth configuration cannot be used; the message says which setting and what is wrong."""


class TokenUser(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: Name
    roles: frozenset[Name] = frozenset()
    workspace: Name | None = None
    """Whose supervisors review her threads; None in a file that names no workspaces (one workspace)."""


class AuthConfig(BaseModel):
    """The validated configuration; requests are matched on the SHA-256 digests of the tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: dict[str, TokenUser] = Field(min_length=1, repr=False)
    supervisor_roles: frozenset[Name] = frozenset()
    """Roles whose users see and may resume every thread of their workspace (a tool's `approvers` still decide who
    may approve it)."""
    stats_roles: frozenset[Name] = frozenset({DEFAULT_STATS_ROLE})
    """Roles whose users see the inbox's Stats page (reviewer telemetry over the whole database: every reviewer's
    decisions and times, every workspace's); default the role `supervisor`."""
    _by_digest: dict[str, TokenUser] = PrivateAttr(default_factory=dict)
    _supervisors: frozenset[str] = PrivateAttr(default=frozenset())
    _workspaces: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _old_name(cls, data: Any) -> Any:
        """`approver_roles` is the old name of `supervisor_roles` (read in this release, with a warning)."""
        if not isinstance(data, dict) or OLD_SUPERVISOR_KEY not in data:
            return data
        if "supervisor_roles" in data:
            raise ValueError(f"{OLD_SUPERVISOR_KEY} is the old name of supervisor_roles: give only supervisor_roles")
        log.warning("gatedloop auth config: %s is now called supervisor_roles", OLD_SUPERVISOR_KEY)
        return {
            **{k: v for k, v in data.items() if k != OLD_SUPERVISOR_KEY},
            "supervisor_roles": data[OLD_SUPERVISOR_KEY],
        }

    @model_validator(mode="after")
    def _check_tokens(self) -> AuthConfig:
        digested: dict[str, TokenUser] = {}
        roles_of: dict[str, frozenset[str]] = {}
        workspace_of: dict[str, str] = {}
        for position, (key, user) in enumerate(self.tokens.items(), start=1):
            where = f"tokens: entry #{position} (user {user.user_id!r})"
            if key.startswith(HASHED_PREFIX):
                if not _HASHED.fullmatch(key):
                    raise ValueError(f"{where}: a hashed key is 'sha256:' and 64 lowercase hex digits")
                digest = key.removeprefix(HASHED_PREFIX)
            elif len(key) < MIN_TOKEN_CHARS or any(c.isspace() for c in key):
                raise ValueError(f"{where}: a token needs at least {MIN_TOKEN_CHARS} characters and no whitespace")
            else:
                digest = token_digest(key)
            if digest in digested:
                raise ValueError(f"{where}: the same token is listed twice")
            if roles_of.setdefault(user.user_id, user.roles) != user.roles:
                raise ValueError(f"{where}: this user has another token with different roles")
            workspace = user.workspace or DEFAULT_WORKSPACE
            if workspace_of.setdefault(user.user_id, workspace) != workspace:
                raise ValueError(f"{where}: this user has another token in another workspace")
            digested[digest] = user
        if len({user.workspace is None for user in digested.values()}) > 1:
            raise ValueError("tokens: name a workspace in every token, or in none")
        self._by_digest = digested
        self._workspaces = workspace_of
        self._supervisors = frozenset(u.user_id for u in digested.values() if u.roles & self.supervisor_roles)
        return self

    def user_for(self, token: str) -> TokenUser | None:
        return self._by_digest.get(token_digest(token))

    def is_supervisor(self, user_id: str) -> bool:
        return user_id in self._supervisors

    def workspace_of(self, user_id: str) -> str:
        """The user's workspace; `DEFAULT_WORKSPACE` for everyone when the file names none."""
        return self._workspaces[user_id]

    @property
    def names_workspaces(self) -> bool:
        return any(user.workspace is not None for user in self._by_digest.values())


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def load_auth_config(environ: Mapping[str, str]) -> AuthConfig | None:
    """The configuration from `GATEDLOOP_AUTH_TOKENS` or `GATEDLOOP_AUTH_FILE`; None when neither is set."""
    inline, path = environ.get(TOKENS_ENV), environ.get(FILE_ENV)
    if inline is not None and path is not None:
        raise AuthConfigError(f"set {TOKENS_ENV} or {FILE_ENV}, not both")
    if inline is None and path is None:
        return None
    if inline is not None:
        source, text = TOKENS_ENV, inline
    else:
        source = f"{FILE_ENV}={path}"
        try:
            text = Path(str(path)).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"gatedloop auth config ({source}): cannot read the file: {exc}") from None
    return parse_auth_config(text, source)


def parse_auth_config(text: str, source: str) -> AuthConfig:
    """Validate the JSON text; the error names `source` and each problem, never a token."""
    prefix = f"gatedloop auth config ({source})"
    if not text.strip():
        raise AuthConfigError(f"{prefix}: it is empty; unset it for the local single-user mode")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AuthConfigError(f"{prefix}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    try:
        return AuthConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error, data) for error in exc.errors())
        raise AuthConfigError(f"{prefix}: {problems}") from None


def _describe(error: Any, data: Any) -> str:
    """One pydantic error as `where: what`, with a token key replaced by its entry number."""
    loc = list(error["loc"])
    if len(loc) > 1 and loc[0] == "tokens" and isinstance(data, dict) and isinstance(data.get("tokens"), dict):
        keys = list(data["tokens"])
        loc[1] = f"entry #{keys.index(loc[1]) + 1}" if loc[1] in keys else "an entry"
    where = ".".join(str(part) for part in loc)
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


SEND_A_TOKEN = "send 'Authorization: Bearer <token>' (or 'X-Api-Key: <token>')"
TWO_TOKENS = "Authorization and X-Api-Key carry different tokens"


def bearer_token(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Auth.exceptions.HTTPException(status_code=401, detail=SEND_A_TOKEN)
    return token.strip()


def header(headers: Mapping[Any, Any] | None, name: str) -> str | None:
    """One header of a request, by lowercase name, from langgraph-api's raw `{bytes: bytes}` or Aegra's `{str: str}`."""
    for key, value in (headers or {}).items():
        text_key = key.decode("latin-1") if isinstance(key, bytes) else str(key)
        if text_key.lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


def request_token(headers: Mapping[Any, Any] | None) -> str:
    """The token of a request: `Authorization: Bearer <token>`, else `X-Api-Key: <token>` (Agent Chat UI's header);
    both present with different tokens is refused, so no header can stand in for another user's."""
    authorization, api_key = header(headers, "authorization"), (header(headers, "x-api-key") or "").strip()
    if authorization is None or not authorization.strip():
        if not api_key:
            raise Auth.exceptions.HTTPException(status_code=401, detail=SEND_A_TOKEN)
        return api_key
    token = bearer_token(authorization)
    if api_key and api_key != token:
        raise Auth.exceptions.HTTPException(status_code=401, detail=TWO_TOKENS)
    return token


ROUTING_REFUSED = (
    "gatedloop runs do not accept command.goto: a routed node would run beside the request that waits for a "
    "person and leave the thread unable to resume. To end a paused request, reject its calls with a reason, or "
    "cancel the thread (gatedloop cancel THREAD) and answer it; to go on, answer it with command.resume"
)


def refuse_routing(value: Auth.types.RunsCreate) -> None:
    """A client's `Command(goto=...)` is refused before the run exists (with or without auth configured).

    LangGraph runs a routed node in the same step as the node that paused, and on the next resume both write the
    same state keys (`InvalidUpdateError`): the thread could never move again. Nothing a client needs is a goto:
    answers are `command.resume`, state changes are `command.update` (which the gate does not trust)."""
    command = (value.get("kwargs") or {}).get("command") or {}
    if isinstance(command, Mapping) and command.get("goto"):
        raise Auth.exceptions.HTTPException(status_code=422, detail=ROUTING_REFUSED)


def stamped(value: Any, keys: Mapping[str, str]) -> None:
    """Set keys in a request's metadata, over the client's; Aegra hands `"metadata": None` when it sent none."""
    metadata = value.get("metadata")
    if not isinstance(metadata, dict):
        metadata = value["metadata"] = {}
    metadata.update(keys)


def refuse_restamping(value: Any, *keys: str) -> None:
    """A thread's owner (and workspace) are set when it is made, by the auth; no update may change them."""
    if set(keys) & set(value.get("metadata") or {}):
        raise Auth.exceptions.HTTPException(status_code=403, detail="the owner of a thread cannot be changed")


def build_auth(config: AuthConfig | None) -> Auth:
    """The `Auth` object the server loads: token users and owner-or-supervisor rules, or the local fallback."""
    auth = Auth()
    if config is None:

        @auth.authenticate
        async def local_user(headers: Mapping[Any, Any] | None = None) -> dict[str, Any]:
            return {"identity": LOCAL_USER_ID, AUTH_KIND_FIELD: LOCAL_USER_MARK}

        @auth.on.threads.create_run
        async def on_local_run_create(ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate) -> None:
            refuse_routing(value)

        @auth.on
        async def local_user_may_do_anything(ctx: Auth.types.AuthContext, value: Any) -> None:
            """One local user, nothing restricted, said explicitly: without a handler for every other path,
            langgraph-api warns at start that those paths fail open (which here is the intent)."""
            return None

        return auth

    @auth.authenticate
    async def token_user(headers: Mapping[Any, Any] | None = None) -> dict[str, Any]:
        user = config.user_for(request_token(headers))
        if user is None:
            raise Auth.exceptions.HTTPException(status_code=401, detail="unknown token")
        return {"identity": user.user_id, "roles": sorted(user.roles), AUTH_KIND_FIELD: TOKEN_USER_MARK}

    def owned_unless_supervisor(ctx: Auth.types.AuthContext) -> dict[str, str] | None:
        """The filter LangGraph applies to thread metadata: the caller's own threads, or for a supervisor those of
        her workspace (every thread when the file names no workspaces)."""
        identity = ctx.user.identity
        if not config.is_supervisor(identity):
            return {OWNER_KEY: identity}
        return {WORKSPACE_KEY: config.workspace_of(identity)} if config.names_workspaces else None

    def own(ctx: Auth.types.AuthContext, value: Any) -> None:
        """Stamp a thread the request creates: its owner, and its workspace where the file names them."""
        identity = ctx.user.identity
        workspace = {WORKSPACE_KEY: config.workspace_of(identity)} if config.names_workspaces else {}
        stamped(value, {OWNER_KEY: identity, **workspace})

    @auth.on.threads.create
    async def on_thread_create(ctx: Auth.types.AuthContext, value: Auth.types.ThreadsCreate) -> dict[str, str] | None:
        own(ctx, value)
        return owned_unless_supervisor(ctx)

    @auth.on.threads.create_run
    async def on_run_create(ctx: Auth.types.AuthContext, value: Auth.types.RunsCreate) -> dict[str, str] | None:
        refuse_routing(value)
        own(ctx, value)  # owns a thread this run creates
        return owned_unless_supervisor(ctx)

    @auth.on.threads.update
    async def on_thread_update(ctx: Auth.types.AuthContext, value: Auth.types.ThreadsUpdate) -> dict[str, str] | None:
        refuse_restamping(value, OWNER_KEY, *([WORKSPACE_KEY] if config.names_workspaces else []))
        return owned_unless_supervisor(ctx)

    @auth.on(resources="threads", actions=["read", "delete", "search"])
    async def on_thread_access(ctx: Auth.types.AuthContext, value: Any) -> dict[str, str] | None:
        return owned_unless_supervisor(ctx)

    @auth.on(resources="assistants", actions=["read", "search"])
    async def on_assistant_read(ctx: Auth.types.AuthContext, value: Any) -> None:
        return None

    @auth.on
    async def supervisors_only(ctx: Auth.types.AuthContext, value: Any) -> None:
        if not config.is_supervisor(ctx.user.identity):
            raise Auth.exceptions.HTTPException(
                status_code=403, detail=f"only supervisors may {ctx.action} {ctx.resource}"
            )

    return auth


auth = build_auth(load_auth_config(os.environ))
