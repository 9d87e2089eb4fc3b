"""Who the reviewer is, and forms that only they can submit.

The inbox uses the same identities as the API (`gatedloop.graph.auth`): the token configuration of
`GATEDLOOP_AUTH_TOKENS` / `GATEDLOOP_AUTH_FILE` (or `gatedloop inbox --auth-file FILE`), `{"supervisor_roles": [...],
"tokens": {"<token or sha256:hex>": {"user_id": "ana", "roles": [...]}}}`. A browser cannot add an
`Authorization: Bearer` header to page loads and forms, so the reviewer signs in once by pasting her token on the
login form; the session is an HttpOnly, SameSite=Strict cookie (`Secure` over HTTPS) holding a random id (kept in
memory here). The token maps to the same user and roles as on the API.

Session fixation: a browser on the same host (a page on another port) can plant a cookie. So an id this process did
not issue is never adopted (each id carries an HMAC under the per-process secret), and signing in or out always
starts a new id: a planted id, even one this process issued, is worth nothing once its browser signs in.

In order, the reviewer is:

1. the user LangGraph Server's auth authenticated for this request (`request.user`), when something sends the
   bearer header and `"enable_custom_route_auth": true` is set in `langgraph.json`'s `http` section;
2. the user signed in with a token of the configuration;
3. with no configuration: `gatedloop inbox --as USER --roles R` (standalone), or under LangGraph Server the same
   unrestricted local user as the API's fallback (`local`, no roles).

As on the API, a user who holds none of `supervisor_roles` sees only the requests of threads she asked for;
which calls anyone may decide is up to each tool's `ToolPolicy` (`reviewer_refusal`). The Stats page (reviewer
telemetry: every reviewer's decisions and times) is for users holding a role of `stats_roles` (default: the role
`supervisor`; `gatedloop inbox --as U --roles supervisor` standalone).

CSRF: every form carries a token that is an HMAC of the session id under a per-process secret, checked on every
POST, besides the SameSite=Strict cookie (hand-written: no well-kept Starlette CSRF library is in our dependencies).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from gatedloop.graph.auth import DEFAULT_STATS_ROLE, LOCAL_USER_ID, AuthConfig
from gatedloop.nodes.wire.identity import AUTH_KIND_FIELD, LOCAL_USER_MARK
from gatedloop.tools.policy import CallContext

SESSION_COOKIE = "gatedloop_inbox"


@dataclass(frozen=True)
class Reviewer:
    user_id: str
    roles: frozenset[str]
    source: str  # "server", "token" or "fixed"
    sees_all_threads: bool = True
    authorization: str | None = field(default=None, repr=False)
    """How to act as this reviewer on the server's API (`Bearer <token>`); never shown on a page."""

    @property
    def context(self) -> CallContext:
        return CallContext(user_id=self.user_id, roles=self.roles)


def server_reviewer(request: Request, config: AuthConfig | None) -> Reviewer | None:
    """The user LangGraph Server's auth authenticated for this request, if any (not its unconfigured fallback)."""
    user: Any = request.scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "identity", ""):
        return None
    getter = getattr(user, "get", None)
    if not callable(getter) or getter(AUTH_KIND_FIELD) == LOCAL_USER_MARK:
        return None
    identity = str(user.identity)
    roles = frozenset(str(r) for r in getter("roles") or [])
    authorization = request.headers.get("authorization")
    return Reviewer(identity, roles, "server", config is None or config.is_supervisor(identity), authorization)


class Sessions:
    """Session ids (random, in a cookie) -> signed-in reviewer; and the CSRF token of each session."""

    def __init__(self, config: AuthConfig | None = None, fixed: Reviewer | None = None):
        self.config = config
        self.fixed = fixed
        self._secret = secrets.token_bytes(32)
        self._signed_in: dict[str, Reviewer] = {}
        self._lock = threading.Lock()

    @classmethod
    def local_fallback(cls, config: AuthConfig | None) -> Sessions:
        """Under LangGraph Server: token sign-in when configured, else the API's unrestricted local user."""
        return cls(config, None if config is not None else Reviewer(LOCAL_USER_ID, frozenset(), "fixed"))

    def new_id(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._mac('session', nonce)}"

    def issued(self, session_id: str | None) -> bool:
        """Whether this process issued `session_id` (not merely whether a client sent one)."""
        nonce, _, mac = (session_id or "").partition(".")
        return bool(nonce and mac) and hmac.compare_digest(self._mac("session", nonce), mac)

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def csrf_token(self, session_id: str) -> str:
        return self._mac("csrf", session_id)

    def csrf_ok(self, session_id: str | None, token: str | None) -> bool:
        if not session_id or not token or not self.issued(session_id):
            return False
        return hmac.compare_digest(self.csrf_token(session_id), token)

    def sign_in(self, session_id: str, token: str) -> str | None:
        """The new session id of the reviewer `token` names (the old id is dropped), or None for no reviewer."""
        config = self.config
        user = config.user_for(token.strip()) if config is not None and token.strip() else None
        if config is None or user is None:
            return None
        approver = config.is_supervisor(user.user_id)
        reviewer = Reviewer(user.user_id, frozenset(user.roles), "token", approver, f"Bearer {token.strip()}")
        fresh = self.new_id()
        with self._lock:
            self._signed_in.pop(session_id, None)
            self._signed_in[fresh] = reviewer
        return fresh

    def signed_in(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._signed_in

    def sign_out(self, session_id: str) -> str:
        """Forget the session; the id the browser gets instead."""
        with self._lock:
            self._signed_in.pop(session_id, None)
        return self.new_id()

    def reviewer(self, request: Request, session_id: str | None) -> Reviewer | None:
        found = server_reviewer(request, self.config)
        if found is not None:
            return found
        if session_id is not None:
            with self._lock:
                signed_in = self._signed_in.get(session_id)
            if signed_in is not None:
                return signed_in
        return self.fixed

    def may_see_stats(self, reviewer: Reviewer) -> bool:
        """Whether the reviewer holds a role of the configuration's `stats_roles` (none configured: the role
        `supervisor`), who see the Stats page: every reviewer's decisions and times."""
        roles = self.config.stats_roles if self.config is not None else frozenset({DEFAULT_STATS_ROLE})
        return bool(reviewer.roles & roles)

    @property
    def can_sign_in(self) -> bool:
        return self.config is not None
