"""Threads in a checkpoint file: their ids, where each one stands, and its history."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from langgraph.graph.state import CompiledStateGraph

THREAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


class InvalidThreadId(ValueError):
    pass


def validate_thread_id(thread_id: str) -> str:
    """Thread ids from the CLI or the SDK: letters, digits and . _ : @ -, at most 128 characters."""
    if not isinstance(thread_id, str) or not THREAD_ID.match(thread_id):
        raise InvalidThreadId(
            f"invalid thread id {str(thread_id)[:40]!r}: use 1-128 letters, digits or . _ : @ - (not starting with one)"
        )
    return thread_id


@dataclass(frozen=True)
class ThreadSummary:
    thread_id: str
    status: str
    detail: str
    messages: int


def thread_ids(db_path: str) -> list[str]:
    with sqlite3.connect(db_path) as conn:
        try:
            rows = conn.execute(
                "SELECT thread_id, MAX(checkpoint_id) FROM checkpoints WHERE checkpoint_ns='' "
                "GROUP BY thread_id ORDER BY MAX(checkpoint_id)"
            ).fetchall()
        except sqlite3.OperationalError:
            return []
    return [row[0] for row in rows]


def describe_thread(graph: CompiledStateGraph, thread_id: str) -> ThreadSummary:
    """Where a thread stands: waiting for a person, finished with a status, or stopped mid-run."""
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    values: dict[str, Any] = snapshot.values or {}
    count = len(values.get("messages", []))
    if snapshot.interrupts:
        kind = (
            snapshot.interrupts[0].value.get("kind", "approval")
            if isinstance(snapshot.interrupts[0].value, dict)
            else "approval"
        )
        label = "waiting for approval" if kind == "approval" else "waiting: write outcome unknown"
        return ThreadSummary(thread_id, "waiting", label, count)
    if snapshot.next or (count and not values.get("status")):
        # No status yet: a process stopped mid-run (if it died after a step's writes but before the step's
        # checkpoint, LangGraph shows no next node, yet the thread resumes from those writes).
        return ThreadSummary(
            thread_id, "interrupted", f"stopped before {', '.join(snapshot.next)}; resume to go on", count
        )
    status = values.get("status") or "unknown"
    detail = values.get("stop_detail") or (values.get("answer") or "")[:60]
    return ThreadSummary(thread_id, status, detail, count)


def node_path(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> list[str]:
    """The nodes a thread went through, oldest first, read from its checkpoint history ("paused" marks a wait)."""
    history = list(graph.get_state_history({"configurable": {"thread_id": thread_id}}))
    path: list[str] = []
    for snapshot in reversed(history):
        for node in snapshot.next:
            if node != "__start__":
                path.append(f"{node} (paused for a person)" if snapshot.interrupts else node)
    return path


def path_mermaid(path: list[str], status: str) -> str:
    """One thread's path as a Mermaid flowchart: each step numbered, ending in its status."""
    lines = ["graph LR;", "    s0([start])"]
    for index, node in enumerate(path, 1):
        lines.append(f'    s{index}["{index}. {node}"]')
        lines.append(f"    s{index - 1} --> s{index}")
    lines.append(f"    s{len(path)} --> done([{status}])")
    return "\n".join(lines)
