"""A small app for tests and their child processes: tools whose side effects land in a real SQLite file.

`effects.sqlite` beside the checkpoint file counts every write that really happened, so tests can
check "exactly once" across processes, crashes and resumes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolArg, tool

from gatedloop.graph import Limits, build_graph
from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolFailure, ToolPolicy


class Effects:
    """Side effects recorded in SQLite: one row per real execution of a write."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        with sqlite3.connect(self.path) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS effects (seq INTEGER PRIMARY KEY, tool TEXT, args TEXT, key TEXT, pid INT)"
            )

    def add(self, tool: str, args: dict[str, Any], key: str | None) -> int:
        with sqlite3.connect(self.path, timeout=30) as conn:
            cur = conn.execute(
                "INSERT INTO effects (tool, args, key, pid) VALUES (?, ?, ?, ?)",
                (tool, json.dumps(args, sort_keys=True, ensure_ascii=False), key, os.getpid()),
            )
            return int(cur.lastrowid or 0)

    def rows(self, tool: str | None = None) -> list[tuple[str, dict[str, Any], str | None]]:
        with sqlite3.connect(self.path, timeout=30) as conn:
            rows = conn.execute("SELECT tool, args, key FROM effects ORDER BY seq").fetchall()
        return [(t, json.loads(a), k) for t, a, k in rows if tool is None or t == tool]

    def find(self, key: str) -> dict[str, Any] | None:
        with sqlite3.connect(self.path, timeout=30) as conn:
            row = conn.execute("SELECT seq, args FROM effects WHERE key=?", (key,)).fetchone()
        return {"booking": row[0], **json.loads(row[1])} if row else None


def make_tools(effects: Effects, *, write_delay_s: float = 0.0, reads: dict[str, int] | None = None) -> list[BaseTool]:
    counts = reads if reads is not None else {}
    lock = threading.Lock()

    @tool
    def lookup(query: str) -> dict[str, Any]:
        """Look a thing up (read)."""
        with lock:
            counts[query] = counts.get(query, 0) + 1
        return {"query": query, "answer": f"answer to {query}"}

    @tool
    def book(item: str, quantity: int, idempotency_key: Annotated[str, InjectedToolArg]) -> dict[str, Any]:
        """Book an item (write)."""
        if item == "forbidden":
            raise ToolFailure("that item cannot be booked", error_type="invalid_arguments")
        if item == "explode":
            raise RuntimeError("secret internal detail /etc/passwd token=abc123")
        if write_delay_s:
            time.sleep(write_delay_s)
        booking = effects.add("book", {"item": item, "quantity": quantity}, idempotency_key)
        return {"booking": booking, "item": item, "quantity": quantity}

    return [lookup, book]


def policies(effects: Effects, **book_overrides: Any) -> dict[str, ToolPolicy]:
    book = ToolPolicy(effect="write", approval="always", reconcile=lambda args, key: effects.find(key), timeout_s=10)
    if book_overrides:
        book = ToolPolicy(**{**book.__dict__, **book_overrides})
    return {"lookup": ToolPolicy(effect="read", approval="never"), "book": book}


def booking_responder(messages: list[BaseMessage]) -> AIMessage:
    """User asks 'book N ITEM[, M ITEM...]' -> one turn proposing those bookings -> a summary."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    start = humans[-1]
    request = str(messages[start].content)
    results = [m for m in messages[start + 1 :] if isinstance(m, ToolMessage)]
    if results:
        return reply("done: " + "; ".join(f"{m.status}" for m in results))
    wanted = [part.split() for part in request.removeprefix("book ").split(",")]
    return reply(
        calls=[call("book", {"item": w[1], "quantity": int(w[0])}, f"c{len(humans)}_{i}") for i, w in enumerate(wanted)]
    )


def build(
    saver: Any,
    effects: Effects,
    responder: Callable[[list[BaseMessage]], AIMessage] = booking_responder,
    *,
    limits: Limits | None = None,
    write_delay_s: float = 0.0,
    middleware: Any = (),
    **book_overrides: Any,
) -> Any:
    model = ScriptedChatModel(responder=responder)
    return build_graph(
        model,
        make_tools(effects, write_delay_s=write_delay_s),
        policies=policies(effects, **book_overrides),
        limits=limits,
        checkpointer=saver,
        middleware=middleware,
    )
