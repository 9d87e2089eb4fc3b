"""The approval inbox on a SQLite file, for the browser tests: the demo tools, with `reserve_seat` approvable only
by the `events` role (so role filtering shows), served by uvicorn in this process.

    python tests/support/inbox_app.py DB PORT AUTH_JSON      (the token configuration of `gatedloop.graph.auth`)

`app_parts(db)` builds the same tools, policies and graph for the test process that starts the threads.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gatedloop.checkpoints import open_sqlite
from gatedloop.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.demo.model import demo_model
from gatedloop.graph import build_graph

EVENTS_ROLE = "events"


def tools_and_policies(db: str) -> tuple[list[Any], dict[str, Any], DemoStore]:
    store = DemoStore(Path(db).with_name("demo-data.sqlite"))
    policies = demo_policies(store)
    policies["reserve_seat"] = dataclasses.replace(policies["reserve_seat"], approvers=frozenset({EVENTS_ROLE}))
    return build_demo_tools(store), policies, store


@contextmanager
def app_parts(db: str) -> Iterator[tuple[Any, Any, list[Any], dict[str, Any], DemoStore]]:
    tools, policies, store = tools_and_policies(db)
    with open_sqlite(db) as saver:
        yield build_graph(demo_model(), tools, policies=policies, checkpointer=saver), saver, tools, policies, store


def main(db: str, port: int, reviewers: str) -> None:
    import uvicorn

    from gatedloop.graph.auth import parse_auth_config
    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox.identity import Sessions
    from gatedloop.inbox.pending import PendingRequests

    @contextmanager
    def open_backend() -> Iterator[InboxBackend]:
        with app_parts(db) as (graph, saver, tools, policies, _):
            pending = PendingRequests(graph, saver.ledger, saver.thread_ids, tools, policies)
            yield InboxBackend(graph, saver.ledger, pending)

    app = create_app(open_backend, Sessions(parse_auth_config(Path(reviewers).read_text(), reviewers)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
