"""gatedloop.graph: build the gated loop, its limits, its state and the model it talks to; and the one import a user
needs (`from gatedloop.graph import build_graph, Limits, ToolPolicy, CallContext, ToolFailure, InvalidDecision,
ThreadBusy, open_sqlite, open_async_sqlite, runs`, `PendingRequest` (a pending request read once, and its answer
built; the decision builders are in `gatedloop.graph.pending`), `conditions` (what a policy asks on: egress,
recipients, counterparties, own resources; `gatedloop.tools.conditions`), `UsageLimit` (a limit across threads, for
`ToolPolicy(limits=[...])`), and `open_postgres`,
`open_async_postgres` with the `postgres` extra installed)."""

from typing import Any

from gatedloop.checkpoints.lease import ThreadBusy
from gatedloop.checkpoints.sqlite import open_async_sqlite, open_sqlite
from gatedloop.checkpoints.threads import UnknownThread
from gatedloop.graph import runs
from gatedloop.graph.build import build_graph
from gatedloop.graph.display import describe_thread
from gatedloop.graph.pending import PendingCall, PendingRequest
from gatedloop.graph.thread_graph import GraphMismatch
from gatedloop.nodes.limits import Limits
from gatedloop.nodes.state import STATUSES, GatedState
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.tools import conditions
from gatedloop.tools.errors import ToolFailure
from gatedloop.tools.policy import CallContext, ToolPolicy
from gatedloop.tools.usage import UsageLimit

__all__ = [
    "STATUSES",
    "CallContext",
    "GatedState",
    "GraphMismatch",
    "InvalidDecision",
    "Limits",
    "PendingCall",
    "PendingRequest",
    "ThreadBusy",
    "ToolFailure",
    "ToolPolicy",
    "UnknownThread",
    "UsageLimit",
    "build_graph",
    "conditions",
    "describe_thread",
    "open_async_postgres",
    "open_async_sqlite",
    "open_postgres",
    "open_sqlite",
    "runs",
]

POSTGRES_OPENERS = ("open_postgres", "open_async_postgres")


def __getattr__(name: str) -> Any:
    """The Postgres openers, imported on first use: psycopg is an optional extra, and the SQLite path must not need
    it."""
    if name not in POSTGRES_OPENERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from gatedloop.checkpoints import postgres
    except ImportError as exc:
        raise ImportError(f"{name} needs the postgres extra: pip install 'gatedloop[postgres]' ({exc})") from exc
    return getattr(postgres, name)
