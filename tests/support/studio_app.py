"""A graph for `langgraph dev` whose one write times out, so its outcome is unknown (tests/test_studio.py).

Loaded by the dev server from its file path (`/abs/tests/support/studio_app.py:graph`). The model is scripted:
"book SLOT" -> one `book_slot` call with a deterministic id -> a summary of what came back. `book_slot` is a
write with `timeout_s=0.3`, no approval and no `reconcile`, so a timeout goes to a person as an
`unknown_outcome` interrupt.

The test steers the tool through files in `STUDIO_APP_DIR`: a call's first attempt blocks until
`release-<slot>` (or `release-all`) exists, so "still running" and "finished late" are states the test
sets, not races it hopes to win. Then it records its side effect in `effects.sqlite`, except for slots
named `lost-*`, whose first attempt fails without one (the request never reached the system). Later
attempts run at once. The ledger lives in `GATEDLOOP_DB`, the file the dev-server checkpointer uses.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolArg, tool

from gatedloop.checkpoints.devserver import studio_db_path
from gatedloop.checkpoints.ledger import SqliteLedger
from gatedloop.graph import build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

WRITE_TIMEOUT_S = 0.3
MAX_BLOCK_S = 120.0


class Lab:
    """The control files and the record of real side effects, in one folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.db = self.folder / "effects.sqlite"
        with closing(self._connect()) as conn, conn:
            conn.execute("CREATE TABLE IF NOT EXISTS attempts (seq INTEGER PRIMARY KEY, slot TEXT, key TEXT)")
            conn.execute("CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY, slot TEXT, key TEXT)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db, timeout=30)

    def start(self, slot: str, key: str) -> int:
        """Count this attempt; returns 1 for the first attempt of the key."""
        with closing(self._connect()) as conn, conn:
            conn.execute("INSERT INTO attempts (slot, key) VALUES (?, ?)", (slot, key))
            return int(conn.execute("SELECT count(*) FROM attempts WHERE key=?", (key,)).fetchone()[0])

    def released(self, slot: str) -> bool:
        return (self.folder / f"release-{slot}").exists() or (self.folder / "release-all").exists()

    def block_until_released(self, slot: str) -> None:
        deadline = time.monotonic() + MAX_BLOCK_S
        while not self.released(slot) and time.monotonic() < deadline:
            time.sleep(0.02)

    def add_effect(self, slot: str, key: str) -> int:
        with closing(self._connect()) as conn, conn:
            return int(conn.execute("INSERT INTO effects (slot, key) VALUES (?, ?)", (slot, key)).lastrowid or 0)


def make_tools(lab: Lab) -> list[Any]:
    @tool
    def book_slot(slot: str, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Book a slot (write)."""
        if lab.start(slot, idempotency_key) == 1:
            lab.block_until_released(slot)
            if slot.startswith("lost"):
                raise RuntimeError("the request never reached the booking system")
        return {"booking": lab.add_effect(slot, idempotency_key), "slot": slot}

    return [book_slot]


def responder(messages: list[BaseMessage]) -> AIMessage:
    """'book SLOT' -> one call `call_<turn>_<slot>`; after its result -> '<status>: <content>'."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    start = humans[-1]
    slot = str(messages[start].content).removeprefix("book ").strip()
    results = [m for m in messages[start + 1 :] if isinstance(m, ToolMessage)]
    if results:
        return reply(f"{results[0].status}: {results[0].content}")
    return reply(calls=[call("book_slot", {"slot": slot}, f"call_{len(humans)}_{slot}")])


def make_graph():
    lab = Lab(os.environ["STUDIO_APP_DIR"])
    return build_graph(
        ScriptedChatModel(responder=responder),
        make_tools(lab),
        policies={"book_slot": ToolPolicy(effect="write", approval="never", timeout_s=WRITE_TIMEOUT_S)},
        ledger=SqliteLedger(studio_db_path()),
        name="studio_app",
    )


graph = make_graph()
