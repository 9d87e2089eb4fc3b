"""The demo graph this deployment serves, for Aegra (`aegra.json` names graphs by file: `./demo.py:graph`; the
bookings example's are in `./bookings.py`).

It is compiled with no checkpointer and no `ledger=`: Aegra gives every run its own `AsyncPostgresSaver`, and
gatedloop keeps its ledger (approvals, claims, the audit trail) in that saver's database, so every server process
and worker finds what the others recorded (`gatedloop.checkpoints.ledger_for`). Nothing here names a database.

Its tools are the demo's (`gatedloop.demo`), whose own data is a small SQLite file (`GATEDLOOP_DEMO_DATA`, default
`.gatedloop/demo-data.sqlite`; every server process on one host shares it), with the offline scripted model unless
`GATEDLOOP_MODEL` names a real one.

Importing gatedloop's auth here too stops the server at start on a bad `GATEDLOOP_AUTH_TOKENS`/`GATEDLOOP_AUTH_FILE`:
Aegra itself would log the auth module's error and serve every request as one anonymous user.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from langgraph.graph.state import CompiledStateGraph

import gatedloop.graph.aegra_auth  # noqa: F401  (a bad auth configuration fails the start, see above)
from gatedloop.demo import DemoStore, build_demo_tools, demo_policies
from gatedloop.demo.model import choose_model
from gatedloop.graph import build_graph

DEMO_DATA_ENV = "GATEDLOOP_DEMO_DATA"


@lru_cache(maxsize=1)
def demo_graph() -> CompiledStateGraph:
    data = Path(os.environ.get(DEMO_DATA_ENV) or ".gatedloop/demo-data.sqlite").expanduser()
    data.parent.mkdir(parents=True, exist_ok=True)
    store = DemoStore(data)
    return build_graph(choose_model(), build_demo_tools(store), policies=demo_policies(store), name="gatedloop")


graph = demo_graph()
