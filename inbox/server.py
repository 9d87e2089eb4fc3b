"""The inbox inside LangGraph Server / `langgraph dev`: `"http": {"app": "gatedloop.inbox.server:app"}`.

It lists and answers the pending requests of every graph the server serves through the server's own API, as the
signed-in reviewer (`gatedloop.inbox.served`): an answer is a run in the server's queue. A thread's history and
audit trail are read from the storage the server keeps them in, `GATEDLOOP_DB` (a SQLite file, default
`.gatedloop/studio.sqlite`, or a `postgresql://` URL: on LangGraph Server the database of `POSTGRES_URI`), which is
why a served graph uses gatedloop's checkpointer (`gatedloop.checkpoints.devserver.studio_checkpointer`).

A resume the gate refuses is reported to its client as an error (`gatedloop.inbox.refusals`), which is why the
inbox is the server's `http.app` even for a deployment whose reviewers never open it.

Reviewers: the users of the server's auth configuration (`GATEDLOOP_AUTH_TOKENS` / `GATEDLOOP_AUTH_FILE`), who sign
in with their token; with none configured, the API's unrestricted local user (see `gatedloop.inbox.identity`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from gatedloop.checkpoints.contract import POSTGRES_PREFIXES
from gatedloop.checkpoints.devserver import DB_ENV, studio_db_path
from gatedloop.checkpoints.sqlite import open_sqlite
from gatedloop.graph.auth import load_auth_config
from gatedloop.graph.build import with_saver
from gatedloop.inbox.app import InboxBackend, create_app
from gatedloop.inbox.identity import Sessions
from gatedloop.inbox.pending import PendingRequests
from gatedloop.inbox.refusals import RefusalsReported
from gatedloop.inbox.served import ServedBackend, ServedGraph, listed_graphs
from gatedloop.inbox.slack_actions import SlackActions


@contextmanager
def _storage(target: str) -> Iterator[tuple[Any, Any]]:
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import open_postgres

        with open_postgres(target) as pg_saver:
            yield pg_saver, pg_saver.thread_ids
        return
    with open_sqlite(str(Path(target).expanduser() if target else studio_db_path())) as saver:
        yield saver, saver.thread_ids


def served_inbox(
    storage: Callable[[], str] = lambda: os.environ.get(DB_ENV) or "",
    list_graphs: Callable[[], dict[str, ServedGraph]] = listed_graphs,
) -> Starlette:
    """The inbox app of a server: requests and answers through the server's API for the graphs `list_graphs`
    names; `storage` (read when the app starts) is where the threads' histories and audit trails are read."""

    @contextmanager
    def open_served_backend() -> Iterator[InboxBackend]:
        # Every gatedloop graph has the same state: the demo's graph reads any thread's history and audit trail.
        from gatedloop.demo import studio

        with _storage(storage()) as (saver, listing):
            reader = with_saver(studio.make_studio_graph(), saver)
            pending = PendingRequests(reader, saver.ledger, listing, studio.tools, studio.policies)
            yield ServedBackend(reader, saver.ledger, pending, list_graphs)

    auth = load_auth_config(os.environ)
    slack = SlackActions.from_env(os.environ, auth, served=True)
    app = create_app(open_served_backend, Sessions.local_fallback(auth), slack=slack)
    app.add_middleware(RefusalsReported)  # the server puts it in front of its API too: refusals reach clients
    return app


app = served_inbox()
