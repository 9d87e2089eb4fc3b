"""The shared workload: one scripted model, three tools, and the turn drivers used by every benchmark.

A "turn" is one user message -> the model proposes the turn's tool call(s) -> they run (after an approval
when the tool is gated) -> the model answers in text. The model's reply is a function of the conversation
(the kind of turn is written in the user message; call ids are derived from the turn number), so a thread
resumed in a fresh process gets the same replies and both systems see byte-identical conversations.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.types import Command

from gatedloop.graph.scripted import ScriptedChatModel, call, reply
from gatedloop.tools import ToolPolicy

Kind = Literal["read", "write", "slow8"]
System = Literal["gatedloop", "anchor"]
SYSTEMS: tuple[System, ...] = ("gatedloop", "anchor")

SLOW_READ_S = 0.2
SLOW_READS = 8
APPROVE = {"decisions": [{"type": "approve"}]}
_TURN = re.compile(r"^turn (\d+) \[(read|write|slow8)\]")


@tool
def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by id (a read: never gated)."""
    return {"order_id": order_id, "status": "shipped", "carrier": "SF Express", "eta": "2025-06-03", "items": 2}


@tool
def add_note(order_id: str, text: str) -> dict[str, Any]:
    """Attach a note to an order (a write: a person approves every call)."""
    return {"ok": True, "order_id": order_id, "note_chars": len(text)}


@tool
def slow_lookup(order_id: str) -> dict[str, Any]:
    """A read that takes 200 ms, like a remote API."""
    time.sleep(SLOW_READ_S)
    return {"order_id": order_id, "status": "in transit"}


TOOLS: list[BaseTool] = [lookup_order, add_note, slow_lookup]
POLICIES = {
    "lookup_order": ToolPolicy(effect="read", approval="never"),
    "slow_lookup": ToolPolicy(effect="read", approval="never"),
    "add_note": ToolPolicy(effect="write", approval="always"),
}
GATED = ("add_note",)


def user_text(turn: int, kind: Kind) -> str:
    return f"turn {turn} [{kind}] please check order A-{turn:05d} and tell me where it is"


def answer_text(turn: int) -> str:
    return f"Order A-{turn:05d} has shipped with SF Express and should arrive on 2025-06-03."


def responder(messages: list[BaseMessage]) -> AIMessage | None:
    """The model: a tool call for a fresh user message, a text answer once the results are in."""
    last_user = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
    if last_user is None:
        return None
    found = _TURN.match(str(last_user.content))
    if found is None:
        return None
    turn, kind = int(found.group(1)), found.group(2)
    if isinstance(messages[-1], ToolMessage):
        return reply(answer_text(turn))
    if not isinstance(messages[-1], HumanMessage):
        return None
    order = f"A-{turn:05d}"
    if kind == "read":
        return reply(calls=[call("lookup_order", {"order_id": order}, f"call-{turn}-0")])
    if kind == "write":
        note = f"customer asked about {order} on turn {turn}"
        return reply(calls=[call("add_note", {"order_id": order, "text": note}, f"call-{turn}-0")])
    calls = [call("slow_lookup", {"order_id": f"{order}-{i}"}, f"call-{turn}-{i}") for i in range(SLOW_READS)]
    return reply(calls=calls)


class AsyncScriptedModel(ScriptedChatModel):
    """The scripted model, answering `ainvoke` on the event loop as a provider's client does (ChatOpenAI awaits
    its HTTP call). LangChain's default `_agenerate` would hand every async call to a thread, for both systems:
    a cost of this fake, not of the loops measured. The responder is pure and quick, so it cannot block the loop."""

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages, stop, None, **kwargs)


def scripted_model() -> ScriptedChatModel:
    return AsyncScriptedModel(responder=responder)


def connect(path: str | Path) -> sqlite3.Connection:
    """The anchor's connection, with the same pragmas `gatedloop.checkpoints.open_sqlite` sets."""
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=10.0)
    conn.execute("PRAGMA busy_timeout=10000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def final_text(out: dict[str, Any]) -> str:
    messages = out.get("messages") or []
    return str(messages[-1].content) if messages else ""


class TurnFailed(AssertionError):
    """A turn did not end with the scripted answer: the benchmark would be timing the wrong thing."""


def check_done(system: System, out: dict[str, Any], turn: int) -> None:
    if "__interrupt__" in out:
        raise TurnFailed(f"{system} turn {turn} is still paused")
    if system == "gatedloop" and out.get("status") != "completed":
        raise TurnFailed(f"{system} turn {turn} ended {out.get('status')!r}: {out.get('stop_detail')}")
    if final_text(out) != answer_text(turn):
        raise TurnFailed(f"{system} turn {turn} answered {final_text(out)[:80]!r}")


def run_turn(system: System, graph: Any, thread_id: str, turn: int, kind: Kind) -> int:
    """One turn, approving whatever is asked; returns how many approvals it took."""
    cfg = config(thread_id)
    out = graph.invoke({"messages": [("user", user_text(turn, kind))]}, cfg, durability="sync")
    approvals = 0
    while "__interrupt__" in out:
        approvals += 1
        if approvals > 2:
            raise TurnFailed(f"{system} turn {turn} asked for approval {approvals} times")
        out = graph.invoke(Command(resume=APPROVE), cfg, durability="sync")
    check_done(system, out, turn)
    return approvals


async def arun_turn(system: System, graph: Any, thread_id: str, turn: int, kind: Kind) -> int:
    cfg = config(thread_id)
    out = await graph.ainvoke({"messages": [("user", user_text(turn, kind))]}, cfg, durability="sync")
    approvals = 0
    while "__interrupt__" in out:
        approvals += 1
        if approvals > 2:
            raise TurnFailed(f"{system} turn {turn} asked for approval {approvals} times")
        out = await graph.ainvoke(Command(resume=APPROVE), cfg, durability="sync")
    check_done(system, out, turn)
    return approvals


def start_paused(system: System, graph: Any, thread_id: str, turn: int) -> None:
    """Send a write turn and stop at its approval (for the resume benchmark)."""
    out = graph.invoke({"messages": [("user", user_text(turn, "write"))]}, config(thread_id), durability="sync")
    if "__interrupt__" not in out:
        raise TurnFailed(f"{system} turn {turn} did not pause for approval")


@dataclass
class Stored:
    """What a checkpoint file holds: blob bytes per table, and the file size once the WAL is folded in."""

    checkpoint_blobs: int
    write_blobs: int
    file_bytes: int
    checkpoints: int
    writes: int

    @property
    def blob_bytes(self) -> int:
        return self.checkpoint_blobs + self.write_blobs


def stored_bytes(path: str | Path) -> Stored:
    """Measured on a separate connection between turns (no reader is active, so TRUNCATE succeeds)."""
    conn = sqlite3.connect(str(path), timeout=10.0)
    try:
        ck, n_ck = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0), COUNT(*) FROM checkpoints"
        ).fetchone()
        wr, n_wr = conn.execute("SELECT COALESCE(SUM(LENGTH(value)), 0), COUNT(*) FROM writes").fetchone()
        # A streamed run's last write may still be in LangGraph's background executor when the update is
        # yielded (the long request samples mid-stream), so a blocked TRUNCATE is tried again, briefly: that
        # write cannot be awaited from here.
        for _ in range(100):
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                break
            time.sleep(0.01)
        else:
            raise RuntimeError("wal_checkpoint(TRUNCATE) was blocked by another connection for 1 s")
    finally:
        conn.close()
    return Stored(int(ck), int(wr), Path(path).stat().st_size, int(n_ck), int(n_wr))


Builder = Callable[[Any], Any]
