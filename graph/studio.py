"""The graph `langgraph dev` serves and LangGraph Studio shows: compiled with no checkpointer.

The server supplies persistence for checkpoints. The execution ledger (at-most-once writes, audit,
cancel flags) is a SQLite file named by `GATEDLOOP_LEDGER` (default `.gatedloop/ledger.sqlite`), and the
demo tools keep their data beside it. The model comes from `GATEDLOOP_MODEL` (the offline demo without
an API key).
"""

from __future__ import annotations

import os
from pathlib import Path

from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph.build import build_graph
from gatedloop.graph.models import load_model
from gatedloop.tools.demo import DemoStore, build_demo_tools, demo_policies


def make_studio_graph():
    ledger_path = Path(os.environ.get("GATEDLOOP_LEDGER", ".gatedloop/ledger.sqlite"))
    store = DemoStore(ledger_path.with_name("demo-data.sqlite"))
    return build_graph(
        load_model(),
        build_demo_tools(store),
        policies=demo_policies(store),
        ledger=SqliteLedger(ledger_path),
        name="gatedloop",
    )


graph = make_studio_graph()
