"""The inbox over the payments agent of grants_app (grantable `pay` with a limit, `wire` granted by two, `mail`
not grantable and decided by `support` here, `announce(to: list)`, grantable, whose grant bounds each recipient,
and `order(items: list[Line], payment: Payment)`, whose grant bounds fields), for the browser tests of the grant
forms, the Grants page and the Stats page; served by uvicorn in this process.

    python tests/support/inbox_grants_app.py DB PORT AUTH_JSON

`app_parts(db)` builds the same graph for the test process that starts the threads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grants_app import FINANCE, POLICIES, make_tools, responder
from langchain_core.tools import BaseTool, tool
from pydantic import BaseModel
from sample_app import Effects

from gatedloop.checkpoints import open_sqlite
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel
from gatedloop.tools import ToolPolicy

POLICIES_HERE = {
    **POLICIES,
    "mail": ToolPolicy(effect="write", approvers=frozenset({"support"})),
    "announce": ToolPolicy(effect="write", approvers=FINANCE, grantable=True),
    "order": ToolPolicy(effect="write", approvers=FINANCE, grantable=True),
}


class Line(BaseModel):
    sku: str
    qty: int


class Payment(BaseModel):
    currency: str
    amount: float


def tools_here(effects: Effects) -> list[BaseTool]:
    @tool
    def announce(to: list[str]) -> str:
        """Announce something to several people (write)."""
        effects.add("announce", {"to": to}, None)
        return "announced"

    @tool
    def order(items: list[Line], payment: Payment) -> str:
        """Order items and pay for them (write)."""
        effects.add("order", {"items": [i.model_dump() for i in items], "payment": payment.model_dump()}, None)
        return "ordered"

    return [*make_tools(effects), announce, order]


@contextmanager
def app_parts(db: str) -> Iterator[tuple[Any, Any, Effects]]:
    effects = Effects(Path(db).with_name("effects.sqlite"))
    with open_sqlite(db) as saver:
        model = ScriptedChatModel(responder=responder)
        graph = build_graph(model, tools_here(effects), policies=POLICIES_HERE, checkpointer=saver, name="pay")
        yield graph, saver, effects


def main(db: str, port: int, reviewers: str) -> None:
    import uvicorn

    from gatedloop.graph.auth import parse_auth_config
    from gatedloop.inbox import InboxBackend, create_app
    from gatedloop.inbox import app as inbox_app
    from gatedloop.inbox.identity import Sessions

    @contextmanager
    def open_backend() -> Iterator[InboxBackend]:
        with app_parts(db) as (graph, saver, _effects):
            yield InboxBackend.over(graph, saver)

    inbox_app.POLL_MS = int(os.environ.get("GATEDLOOP_TEST_INBOX_POLL_MS", "400"))
    app = create_app(open_backend, Sessions(parse_auth_config(Path(reviewers).read_text(), reviewers)))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
