"""Threads in a checkpoint file: their ids, where each one stands, and its history."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.graph.state import CompiledStateGraph

from gatedloop.checkpoints.ledger import Ledger

THREAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")


class InvalidThreadId(ValueError):
    pass


class UnknownThread(LookupError):
    """No checkpoint exists for this thread id in this database."""

    def __init__(self, thread_id: str, where: str):
        super().__init__(f"unknown thread {thread_id!r} in {where}; list threads with: gatedloop threads")
        self.thread_id = thread_id


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
    request_id: str | None = None
    """The pending question's request id, which an answer names (`--request`); None when nothing is asked."""


def thread_exists(graph: CompiledStateGraph, thread_id: str) -> bool:
    saver = graph.checkpointer
    if saver is None or isinstance(saver, bool):
        return False
    return saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}) is not None


def unsettled_writes(ledger: Ledger | None, thread_id: str) -> list[str]:
    """Why a thread has writes of unknown outcome, one sentence per write claimed and never finished."""
    if ledger is None:
        return []
    sentences = []
    for entry in ledger.entries(thread_id):
        if entry.state != "claimed":
            continue
        if ledger.claimant_alive(entry.claimant):  # the backend's check: a Postgres worker lock, a local pid
            sentences.append(f"a write to {entry.tool} is running now (process {entry.claimant})")
        else:
            sentences.append(f"a write to {entry.tool} was running when the process stopped; resume settles it")
    return sentences


def describe_thread(
    graph: CompiledStateGraph,
    thread_id: str,
    ledger: Ledger | None = None,
    waiting: Callable[[Mapping[str, Any]], str] | None = None,
) -> ThreadSummary:
    """Where a thread stands: waiting for a person, cancelled, finished with a status, or stopped mid-run.

    With the ledger it also says when a cancel closed a pending request and when a write was in flight at a
    crash. `waiting` says what a pending approval request waits for, from its interrupt value (the operator
    layer reads requests: `gatedloop.graph.display.describe_thread` passes it); without it, "waiting for
    approval"."""
    snapshot = graph.get_state({"configurable": {"thread_id": thread_id}})
    values: dict[str, Any] = snapshot.values or {}
    count = len(values.get("messages", []))
    crashed = unsettled_writes(ledger, thread_id)
    if snapshot.interrupts:
        value = snapshot.interrupts[0].value
        kind = value.get("kind", "approval") if isinstance(value, dict) else "approval"
        request_id = value.get("request_id") if isinstance(value, dict) else None
        if ledger is not None and kind == "approval" and ledger.cancel_requested(thread_id):
            detail = "cancelled while waiting for approval; its request can no longer be answered"
            return ThreadSummary(thread_id, "cancelled", detail, count)
        if kind != "approval":  # the claimed write is the one a person is asked about: no crash to settle first
            detail = "waiting: a write's outcome is unknown; a person answers done, not_done or abandon"
            return ThreadSummary(thread_id, "waiting", detail, count, request_id)
        wait = waiting(value) if waiting is not None and isinstance(value, Mapping) else "waiting for approval"
        detail = "; ".join([wait, *crashed])
        return ThreadSummary(thread_id, "waiting", detail, count, request_id)
    if snapshot.next or (count and not values.get("status")) or crashed:
        # No status yet: a process stopped mid-run (if it died after a step's writes but before the step's
        # checkpoint, LangGraph shows no next node, yet the thread resumes from those writes).
        where = f"stopped before {', '.join(snapshot.next)}" if snapshot.next else "stopped mid-run"
        detail = "; ".join(crashed) if crashed else f"{where}; resume to go on"
        return ThreadSummary(thread_id, "interrupted", detail, count)
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
