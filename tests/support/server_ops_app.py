"""A graph for `langgraph dev` whose runs can be held mid-step, for rollback, copy and prune (tests/test_server_ops.py).

"book N ITEM and wait GATE" -> a `book` write (no approval; its effect lands in `effects.sqlite` under the
idempotency key), then a `wait_gate` read that blocks until the file `open-GATE` exists in `SERVER_OPS_DIR`
(it first creates `waiting-GATE`, so the test knows the run is held there), then "done". Call ids are
`b<turn>` and `w<turn>`. Checkpoints, ledger and audit go to `GATEDLOOP_DB`, as with the repo's config.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from sample_app import Effects, make_tools

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

MAX_WAIT_S = 120.0


def responder(messages: list[BaseMessage]) -> AIMessage:
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    turn = len(humans)
    order, _, gate = str(messages[humans[-1]].content).partition(" and wait ")
    count, item = order.removeprefix("book ").split()
    answered = {m.tool_call_id for m in messages[humans[-1] + 1 :] if isinstance(m, ToolMessage)}
    if f"b{turn}" not in answered:
        return reply(calls=[call("book", {"item": item, "quantity": int(count)}, f"b{turn}")])
    if f"w{turn}" not in answered:
        return reply(calls=[call("wait_gate", {"gate": gate}, f"w{turn}")])
    return reply("done")


def make_graph() -> Any:
    folder = Path(os.environ["SERVER_OPS_DIR"])
    effects = Effects(folder / "effects.sqlite")

    @tool
    def wait_gate(gate: str) -> str:
        """Wait until the gate opens (read)."""
        (folder / f"waiting-{gate}").touch()
        deadline = time.monotonic() + MAX_WAIT_S
        while not (folder / f"open-{gate}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return f"{gate} is open"

    lookup, book = make_tools(effects)
    return build_graph(
        ScriptedChatModel(responder=responder),
        [book, lookup, wait_gate],
        policies={
            "book": ToolPolicy(effect="write", approval="never", reconcile=lambda args, key: effects.find(key)),
            "lookup": ToolPolicy(effect="read", approval="never"),
            "wait_gate": ToolPolicy(effect="read", approval="never", timeout_s=MAX_WAIT_S),
        },
        ledger=SqliteLedger(studio_db_path()),
        name="server_ops",
    )


graph = make_graph()
