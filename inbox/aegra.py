"""The inbox inside Aegra: `"http": {"app": "gatedloop.inbox.aegra:app"}` in aegra.json.

The same served inbox as under LangGraph Server (`gatedloop.inbox.server`): requests listed and answered through
the server's API as the signed-in reviewer, so an answer is a run in Aegra's queue that any worker of any process
may take. Three things differ, and are what this module adds: Aegra takes only a FastAPI app as its `http.app`
(the inbox's routes and lifespan are moved into one); its graphs are aegra.json's (it sets no `LANGSERVE_GRAPHS`),
their paths relative to that file; and the threads' histories and audit trails are read from Aegra's own database,
`DATABASE_URL`, where gatedloop's ledger lives (`GATEDLOOP_DB` overrides it).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from gatedloop.checkpoints.devserver import DB_ENV
from gatedloop.inbox.refusals import RefusalsReported
from gatedloop.inbox.served import GRAPHS_ENV, ServedGraph, served_graphs
from gatedloop.inbox.server import served_inbox

if TYPE_CHECKING:
    from fastapi import FastAPI

AEGRA_DB_ENV = "DATABASE_URL"


def aegra_graphs() -> dict[str, ServedGraph]:
    """The graphs of Aegra's configuration, as the inbox needs them (tools for edit forms, policies)."""
    from aegra_api.config import get_config_dir, load_config  # Aegra's own reading of aegra.json / langgraph.json

    graphs = (load_config() or {}).get("graphs") or {}
    return served_graphs({GRAPHS_ENV: json.dumps(graphs)}, get_config_dir())


def aegra_storage() -> str:
    """Aegra's database as a plain `postgresql://` URL (Aegra also accepts a driver in the scheme)."""
    url = os.environ.get(DB_ENV) or os.environ.get(AEGRA_DB_ENV) or ""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+')[0]}{sep}{rest}" if sep else url


def aegra_app() -> FastAPI:
    from fastapi import FastAPI

    inbox = served_inbox(aegra_storage, aegra_graphs)
    app = FastAPI(lifespan=inbox.router.lifespan_context, docs_url=None, redoc_url=None, openapi_url=None)
    app.router.routes.extend(inbox.routes)
    app.add_middleware(RefusalsReported)  # Aegra's own routes join this app: its refused resumes are reported too
    return app


def __getattr__(name: str) -> Any:
    """`app`, built when Aegra loads it: importing this module needs neither Aegra nor FastAPI (they are Aegra's)."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = globals()["app"] = aegra_app()
    return built
