"""The inbox inside LangGraph Server / `langgraph dev`: `"http": {"app": "gatedloop.inbox.server:app"}`.

It reads and answers the threads of the graph the server serves (`gatedloop.demo.studio`), on the same storage:
`GATEDLOOP_DB` (a SQLite file, default `.gatedloop/studio.sqlite`, or a `postgresql://` URL: on LangGraph Server the
database of `POSTGRES_URI`). Answers run `runs.resume` in the server's process with the reviewer's identity; the
server's own thread list (its runtime) does not see that run, the checkpoints do (Studio shows the new state).

Reviewers: the users of the server's auth configuration (`GATEDLOOP_AUTH_TOKENS` / `GATEDLOOP_AUTH_FILE`), who sign
in with their token; with none configured, the API's unrestricted local user (see `gatedloop.inbox.identity`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gatedloop.checkpoints.contract import POSTGRES_PREFIXES
from gatedloop.checkpoints.devserver import DB_ENV, studio_db_path
from gatedloop.checkpoints.sqlite import open_sqlite
from gatedloop.graph.auth import load_auth_config
from gatedloop.inbox.app import InboxBackend, create_app
from gatedloop.inbox.identity import Sessions
from gatedloop.inbox.pending import PendingRequests


@contextmanager
def _storage() -> Iterator[tuple[Any, Any]]:
    target = os.environ.get(DB_ENV) or ""
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import open_postgres

        with open_postgres(target) as pg_saver:
            yield pg_saver, pg_saver.thread_ids
        return
    path = str(studio_db_path())
    with open_sqlite(path) as saver:
        yield saver, saver.thread_ids


@contextmanager
def open_studio_backend() -> Iterator[InboxBackend]:
    from gatedloop.demo import studio

    with _storage() as (saver, listing):
        graph = studio.make_studio_graph().copy(update={"checkpointer": saver})  # `studio.graph` is a factory
        pending = PendingRequests(graph, saver.ledger, listing, studio.tools, studio.policies)
        yield InboxBackend(graph, saver.ledger, pending)


app = create_app(open_studio_backend, Sessions.local_fallback(load_auth_config(os.environ)))
