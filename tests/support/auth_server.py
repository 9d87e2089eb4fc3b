"""Serve auth_app.py (beside this file) with the repo's own `langgraph.json` (so its `auth` block,
gatedloop.graph.auth) under the real `langgraph dev`, and give each configured user a `langgraph-sdk` client
carrying her bearer token.

The auth configuration reaches the server process as `GATEDLOOP_AUTH_TOKENS` in its environment (the dev
server's `env` file is dropped so a developer's `.env` cannot interfere). `tokens=None` leaves auth unconfigured:
the local single-user fallback.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devserver import run_dev_server
from langgraph_sdk import get_sync_client

ROOT = Path(__file__).resolve().parents[2]
AUTH_APP = Path(__file__).with_name("auth_app.py")
GRAPH = "auth_app"
CALLERS, EFFECTS = "callers.jsonl", "effects.jsonl"  # as in auth_app.py, which only the server may import

USERS: dict[str, tuple[str, list[str]]] = {
    "ana": ("ana-token-7f3c9e1d2b", ["staff"]),
    "cy": ("cy-token-5a8e0b4c7d", ["staff"]),
    "bo": ("bo-token-1d6f2a9e3c", ["finance"]),
    "dee": ("dee-token-9c4b7e2a6f", ["finance", "staff"]),
    "sue": ("sue-token-4e8a1c6b3d", ["support"]),
}
CONFIG = {
    "supervisor_roles": ["finance", "support"],
    "tokens": {token: {"user_id": user, "roles": roles} for user, (token, roles) in USERS.items()},
}


@dataclass
class AuthServer:
    url: str
    folder: Path

    def client(self, user: str | None = None, headers: dict[str, str] | None = None) -> Any:
        """A client for `user` (her bearer token), or with exactly `headers` (None: no Authorization at all)."""
        sent = {"Authorization": f"Bearer {USERS[user][0]}"} if user else dict(headers or {})
        return get_sync_client(url=self.url, api_key=None, headers=sent, timeout=60)

    def callers(self, since: int = 0) -> list[dict[str, Any]]:
        """The distinct callers recorded from record number `since` on (a call may be checked more than once)."""
        distinct: list[dict[str, Any]] = []
        for caller in self._records(CALLERS)[since:]:
            if caller not in distinct:
                distinct.append(caller)
        return distinct

    def callers_recorded(self) -> int:
        return len(self._records(CALLERS))

    def effects(self) -> list[dict[str, Any]]:
        return self._records(EFFECTS)

    def _records(self, name: str) -> list[dict[str, Any]]:
        path = self.folder / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@contextlib.contextmanager
def serve_auth_app(folder: Path, tokens: dict[str, Any] | None = CONFIG) -> Iterator[AuthServer]:
    env = {
        "AUTH_APP_DIR": str(folder),
        "GATEDLOOP_DB": str(folder / "studio.sqlite"),
        "GATEDLOOP_LEDGER": None,
        "GATEDLOOP_AUTH_TOKENS": None if tokens is None else json.dumps(tokens),
        "GATEDLOOP_AUTH_FILE": None,
    }
    overrides = {"env": None, "graphs": {GRAPH: f"{AUTH_APP}:graph"}}
    with run_dev_server(ROOT, env=env, workdir=folder / "server", config_overrides=overrides) as url:
        yield AuthServer(url, folder)


def say(client: Any, thread_id: str, text: str, **kwargs: Any) -> dict[str, Any]:
    """One user message on a thread, waited for; kwargs go to `runs.wait` (e.g. `context=`)."""
    return client.runs.wait(thread_id, GRAPH, input={"messages": [{"role": "user", "content": text}]}, **kwargs)
