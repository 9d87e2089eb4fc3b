"""The graph `langgraph dev` serves and LangGraph Studio shows: compiled with no checkpointer.

The server supplies persistence for checkpoints: with this repo's `langgraph.json` that is gatedloop's
SQLite saver (`gatedloop.checkpoints.devserver.studio_checkpointer`) on `GATEDLOOP_DB` (default
`.gatedloop/studio.sqlite`). The execution ledger (at-most-once writes, audit, cancel flags) goes in the
same file by default, as with `open_sqlite`; `GATEDLOOP_LEDGER` names another file if you must. Either may be a
`postgresql://` URL: then the ledger is a `PostgresLedger` in that database (on LangGraph Server, the database of
`POSTGRES_URI`, whose checkpoints the server keeps itself). The demo tools keep their data in `demo-data.sqlite`
beside a SQLite ledger, or in `GATEDLOOP_DEMO_DATA` (default `.gatedloop/demo-data.sqlite`) with Postgres.
The model comes from `GATEDLOOP_MODEL` (the offline demo without an API key).
"""

from __future__ import annotations

import os
from pathlib import Path

from langchain_core.tools import BaseTool

from gatedloop.checkpoints.devserver import DB_ENV, studio_db_path
from gatedloop.checkpoints.ledger import Ledger, SqliteLedger
from gatedloop.graph.build import build_graph
from gatedloop.graph.models import load_model
from gatedloop.tools.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.tools.policy import ToolPolicy

LEDGER_ENV = "GATEDLOOP_LEDGER"
DEMO_DATA_ENV = "GATEDLOOP_DEMO_DATA"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


def studio_ledger_path() -> Path:
    """`GATEDLOOP_LEDGER` if set, else the checkpoint file itself (`GATEDLOOP_DB`)."""
    override = os.environ.get(LEDGER_ENV)
    return Path(override).expanduser() if override else studio_db_path()


def studio_ledger() -> tuple[Ledger, Path]:
    """The ledger (`GATEDLOOP_LEDGER`, else `GATEDLOOP_DB`: a SQLite file or a Postgres URL) and the demo data file."""
    target = os.environ.get(LEDGER_ENV) or os.environ.get(DB_ENV) or ""
    if target.startswith(POSTGRES_PREFIXES):
        from gatedloop.checkpoints.postgres import PostgresLedger

        demo_data = Path(os.environ.get(DEMO_DATA_ENV) or ".gatedloop/demo-data.sqlite").expanduser()
        return PostgresLedger(target), demo_data
    ledger_path = studio_ledger_path()
    return SqliteLedger(ledger_path), ledger_path.with_name("demo-data.sqlite")


def make_studio_tools() -> tuple[list[BaseTool], dict[str, ToolPolicy], Ledger]:
    """The demo tools (data beside the ledger), their policies, and the ledger."""
    ledger, demo_data = studio_ledger()
    demo_data.parent.mkdir(parents=True, exist_ok=True)
    store = DemoStore(demo_data)
    return build_demo_tools(store), demo_policies(store), ledger


tools, policies, _ledger = make_studio_tools()
"""Kept for the approval inbox served beside this graph (`gatedloop.inbox.server`): argument schemas, who may
approve."""
graph = build_graph(load_model(), tools, policies=policies, ledger=_ledger, name="gatedloop")
