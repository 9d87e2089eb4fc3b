"""Who the reviewer is, and forms that only they can submit.

Identity, in order:

1. Served by LangGraph Server with `"enable_custom_route_auth": true`: the user the server's auth handler
   authenticated (`request.user`): `identity` is the user id, roles from the user's `roles` field, else its
   `permissions`. The same identity the server hands the graph, so the inbox cannot disagree with it.
2. Otherwise, a reviewer token map (`gatedloop inbox --reviewers FILE`, or `GATEDLOOP_REVIEWERS`): a JSON object
   `{"<token>": {"user": "bo", "roles": ["finance"]}, ...}`. The reviewer signs in once with their token on the
   login form; the session is an HttpOnly, SameSite=Strict cookie holding a random id (kept in memory here).
3. `gatedloop inbox --user ID --roles R` (local use): every visitor is that one reviewer.

CSRF: every form carries a token that is an HMAC of the session id under a per-process secret, checked on every
POST, and the session cookie is SameSite=Strict (a hand-written double check: no well-kept Starlette CSRF library is
in our dependency set).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request

from gatedloop.tools.policy import CallContext

SESSION_COOKIE = "gatedloop_inbox"


class ReviewerConfigError(ValueError):
    """The reviewer token map cannot be read."""


@dataclass(frozen=True)
class Reviewer:
    user_id: str
    roles: frozenset[str]
    source: str  # "server", "token" or "fixed"

    @property
    def context(self) -> CallContext:
        return CallContext(user_id=self.user_id, roles=self.roles)


def load_token_map(path: str | Path) -> dict[str, Reviewer]:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ReviewerConfigError(f"cannot read the reviewer token map {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise ReviewerConfigError(f'{path}: expected {{"<token>": {{"user": "...", "roles": [...]}}}}')
    reviewers = {}
    for token, entry in raw.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("user"), str) or len(token) < 16:
            raise ReviewerConfigError(
                f'{path}: each entry needs a token of 16+ characters and {{"user": "...", "roles": [...]}}'
            )
        roles = entry.get("roles") or []
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ReviewerConfigError(f"{path}: roles of {entry['user']!r} must be a list of strings")
        reviewers[token] = Reviewer(entry["user"], frozenset(roles), "token")
    return reviewers


def server_reviewer(request: Request) -> Reviewer | None:
    """The user LangGraph Server's auth authenticated for this request, if any."""
    user: Any = request.scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    identity = getattr(user, "identity", "")
    if not identity:
        return None
    getter = getattr(user, "get", None)
    roles = (getter("roles") or getter("permissions") or []) if callable(getter) else []
    return Reviewer(str(identity), frozenset(str(r) for r in roles), "server")


class Sessions:
    """Session ids (random, in a cookie) -> signed-in reviewer; and the CSRF token of each session."""

    def __init__(self, tokens: Mapping[str, Reviewer] | None = None, fixed: Reviewer | None = None):
        self.tokens = dict(tokens or {})
        self.fixed = fixed
        self._secret = secrets.token_bytes(32)
        self._signed_in: dict[str, Reviewer] = {}
        self._lock = threading.Lock()

    @staticmethod
    def new_id() -> str:
        return secrets.token_urlsafe(24)

    def csrf_token(self, session_id: str) -> str:
        return hmac.new(self._secret, session_id.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session_id: str | None, token: str | None) -> bool:
        if not session_id or not token:
            return False
        return hmac.compare_digest(self.csrf_token(session_id), token)

    def sign_in(self, session_id: str, token: str) -> Reviewer | None:
        reviewer = next((r for t, r in self.tokens.items() if hmac.compare_digest(t, token)), None)
        if reviewer is not None:
            with self._lock:
                self._signed_in[session_id] = reviewer
        return reviewer

    def sign_out(self, session_id: str) -> None:
        with self._lock:
            self._signed_in.pop(session_id, None)

    def reviewer(self, request: Request, session_id: str | None) -> Reviewer | None:
        found = server_reviewer(request)
        if found is not None:
            return found
        if self.fixed is not None:
            return self.fixed
        if session_id is None:
            return None
        with self._lock:
            return self._signed_in.get(session_id)

    @property
    def can_sign_in(self) -> bool:
        return bool(self.tokens)
