"""The graph `langgraph dev` serves and LangGraph Studio shows: compiled with no checkpointer.

The server supplies persistence for checkpoints: with this repo's `langgraph.json` that is gatedloop's
SQLite saver (`gatedloop.checkpoints.devserver.studio_checkpointer`) on `GATEDLOOP_DB` (default
`.gatedloop/studio.sqlite`). The execution ledger (at-most-once writes, audit, cancel flags) goes in the
same file by default, as with `open_sqlite`; `GATEDLOOP_LEDGER` names another file if you must. The demo
tools keep their data in `demo-data.sqlite` beside the ledger. The model comes from `GATEDLOOP_MODEL`
(the offline demo without an API key).
"""

from __future__ import annotations

import os
from pathlib import Path

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph.build import build_graph
from gatedloop.graph.models import load_model
from gatedloop.tools.demo import DemoStore, build_demo_tools, demo_policies

LEDGER_ENV = "GATEDLOOP_LEDGER"


def studio_ledger_path() -> Path:
    """`GATEDLOOP_LEDGER` if set, else the checkpoint file itself (`GATEDLOOP_DB`)."""
    override = os.environ.get(LEDGER_ENV)
    return Path(override).expanduser() if override else studio_db_path()


def make_studio_graph():
    ledger_path = studio_ledger_path()
    store = DemoStore(ledger_path.with_name("demo-data.sqlite"))
    return build_graph(
        load_model(),
        build_demo_tools(store),
        policies=demo_policies(store),
        ledger=SqliteLedger(ledger_path),
        name="gatedloop",
    )


graph = make_studio_graph()
