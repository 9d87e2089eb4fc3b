"""Running a thread from Python the way the CLI does: one resumer at a time, every step checkpointed.

`start` and `resume` hold the thread's lease (`ThreadBusy` if another process is running it), run with
`durability="sync"` so each step is on disk before the next begins, and `resume` checks a reviewer's
answer against the pending request before it reaches the graph (`InvalidDecision`, nothing changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt, StateSnapshot, StreamMode

from gatedloop.checkpoints.contract import GatedSaver
from gatedloop.checkpoints.ledger import CancelFlags
from gatedloop.checkpoints.threads import UnknownThread, validate_thread_id
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.thread_graph import claim_thread, ledger_of
from gatedloop.nodes.gate.extension import extend_request
from gatedloop.nodes.gate.hitl import InvalidDecision
from gatedloop.nodes.gate.resume import check_answer
from gatedloop.tools.policy import CallContext

STREAM_MODES: list[StreamMode] = ["updates", "custom"]


def config_for(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": validate_thread_id(thread_id)}}


def pending_request(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any] | None:
    """The request a paused thread is waiting on (approval or unknown outcome), or None."""
    return _request_of(graph.get_state(config_for(thread_id)).interrupts)


def _request_of(interrupts: Sequence[Interrupt]) -> dict[str, Any] | None:
    if not interrupts:
        return None
    value = interrupts[0].value
    return value if isinstance(value, dict) else {"value": value}


def lease_for(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, wait_s: float
) -> AbstractContextManager[None]:
    """The thread's lease from a `GatedSaver` (a file lock beside a SQLite file, a Postgres advisory lock);
    none for another checkpointer (an in-memory one lives in one process anyway)."""
    saver = graph.checkpointer
    if isinstance(saver, GatedSaver):
        return saver.lease(thread_id, wait_s=wait_s)
    return nullcontext()


def stream_start(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread_id: str,
    text: str,
    *,
    context: CallContext | None = None,
    wait_s: float = 0.0,
    upgrade: bool = False,
) -> Iterator[tuple[str, Any]]:
    """Start (or continue) a thread with a user message, yielding (mode, chunk) as steps happen."""
    config = config_for(thread_id)
    with lease_for(graph, thread_id, wait_s):
        if upgrade:  # otherwise the graph's own entry checks the thread's graph (graph/gated.py)
            claim_thread(graph, thread_id, upgrade=True, context=context)
        yield from cast(
            Iterator[tuple[str, Any]],
            graph.stream(
                {"messages": [("user", text)]}, config, context=context, stream_mode=STREAM_MODES, durability="sync"
            ),
        )


def stream_resume(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread_id: str,
    answer: Any = None,
    *,
    context: CallContext | None = None,
    wait_s: float = 0.0,
    upgrade: bool = False,
) -> Iterator[tuple[str, Any]]:
    """Resume a paused thread with an answer (or, with None, a thread stopped mid-run by a crash)."""
    config = config_for(thread_id)
    with lease_for(graph, thread_id, wait_s):
        snapshot = graph.get_state(config)  # one load: rebuilding a long thread is the costly part
        payload = _resume_payload(thread_id, snapshot, answer)
        if upgrade:  # otherwise the graph's own entry checks the thread's graph (graph/gated.py)
            claim_thread(graph, thread_id, upgrade=True, context=context)
        events = graph.stream(payload, config, context=context, stream_mode=STREAM_MODES, durability="sync")
        yield from cast(Iterator[tuple[str, Any]], events)


def _resume_payload(thread_id: str, snapshot: StateSnapshot, answer: Any) -> Command | None:
    """The answer addressed to the pending interrupt, checked first (InvalidDecision, nothing changed). A thread
    with no checkpoint is UnknownThread, not "not waiting": a typo in a thread id must not read as a finished one."""
    if snapshot.created_at is None:
        raise UnknownThread(thread_id, "this graph's checkpointer")
    pending = snapshot.interrupts
    request = _request_of(pending)
    if request is not None:
        if answer is None:
            raise InvalidDecision("the thread is waiting for an answer; none was given")
        check_answer(request, answer)
        # Keyed by interrupt id, so the answer reaches exactly the question it answers, even when a crash
        # left another interrupt of the same node answered but unfinished.
        return Command(resume={pending[0].id: answer})
    if answer is not None:
        raise InvalidDecision(f"thread {thread_id!r} is not waiting for an answer")
    return None


def start(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **kwargs: Any) -> dict[str, Any]:
    """Run until the thread pauses or ends; returns the thread's values plus `__interrupt__` if paused."""
    for _ in stream_start(graph, thread_id, text, **kwargs):
        pass
    return output(graph, thread_id)


def resume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **kwargs: Any
) -> dict[str, Any]:
    for _ in stream_resume(graph, thread_id, answer, **kwargs):
        pass
    return _raise_if_refused(output(graph, thread_id))


def _raise_if_refused(result: dict[str, Any]) -> dict[str, Any]:
    pending = result.get("__interrupt__")
    if pending and isinstance(pending[0].value, dict) and pending[0].value.get("error"):
        raise InvalidDecision(pending[0].value["error"])
    return result


def output(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any]:
    """What the thread's last run returned (as `invoke` does): its values, plus `__interrupt__` if paused."""
    return _values(graph.get_state(config_for(thread_id)))


def _values(snapshot: StateSnapshot) -> dict[str, Any]:
    values = dict(snapshot.values or {})
    if snapshot.interrupts:
        values["__interrupt__"] = list(snapshot.interrupts)
    return values


def extend(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, *, context: CallContext, request_id: str
) -> float:
    """An approver (`context`, who may decide every call of it) gives the pending approval request `request_id`
    its time to live again, from now; the new deadline. Nothing is decided and the request keeps waiting; the
    extension is a record in the ledger (nodes/gate/extension.py). InvalidDecision, nothing recorded, otherwise."""
    parts, ledger = parts_of(graph), ledger_of(graph)
    if parts is None or ledger is None:
        raise TypeError(f"{type(graph).__name__} is not a graph from gatedloop.graph.build_graph")
    request = pending_request(graph, validate_thread_id(thread_id))
    if request is None or request.get("kind") == "unknown_outcome":
        raise InvalidDecision(f"thread {thread_id!r} has no approval request waiting; nothing to extend")
    if request.get("request_id") != request_id:
        raise InvalidDecision(
            f"request {request_id!r} is not the pending one; pending now is {request.get('request_id')!r}"
        )
    return extend_request(ledger, parts.registry.policy, thread_id, request, context, parts.clock())


def cancel(thread_id: str, *, ledger: CancelFlags) -> None:
    """Ask a thread to stop at its next node boundary (status `cancelled`); a running write finishes first."""
    ledger.request_cancel(validate_thread_id(thread_id))


# Async twins, for graphs run on an async checkpointer (`open_async_sqlite`, `open_async_postgres`) under
# asyncio: the same checks, lease and durability; the model and tools are awaited on the caller's event loop.


@asynccontextmanager
async def _alease(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, wait_s: float) -> AsyncIterator[None]:
    """The same lease as `lease_for`; taking and releasing it may block (file lock, Postgres), so not on the loop."""
    lease = lease_for(graph, thread_id, wait_s)
    await asyncio.to_thread(lease.__enter__)
    try:
        yield
    finally:
        await asyncio.to_thread(lease.__exit__, None, None, None)


async def apending_request(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any] | None:
    """Async twin of `pending_request`."""
    return _request_of((await graph.aget_state(config_for(thread_id))).interrupts)


async def astream_start(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread_id: str,
    text: str,
    *,
    context: CallContext | None = None,
    wait_s: float = 0.0,
    upgrade: bool = False,
) -> AsyncIterator[tuple[str, Any]]:
    """Async twin of `stream_start`."""
    config = config_for(thread_id)
    async with _alease(graph, thread_id, wait_s):
        if upgrade:
            await asyncio.to_thread(claim_thread, graph, thread_id, upgrade=True, context=context)
        events = graph.astream(
            {"messages": [("user", text)]}, config, context=context, stream_mode=STREAM_MODES, durability="sync"
        )
        async for event in cast(AsyncIterator[tuple[str, Any]], events):
            yield event


async def astream_resume(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    thread_id: str,
    answer: Any = None,
    *,
    context: CallContext | None = None,
    wait_s: float = 0.0,
    upgrade: bool = False,
) -> AsyncIterator[tuple[str, Any]]:
    """Async twin of `stream_resume`."""
    config = config_for(thread_id)
    async with _alease(graph, thread_id, wait_s):
        payload = _resume_payload(thread_id, await graph.aget_state(config), answer)
        if upgrade:
            await asyncio.to_thread(claim_thread, graph, thread_id, upgrade=True, context=context)
        events = graph.astream(payload, config, context=context, stream_mode=STREAM_MODES, durability="sync")
        async for event in cast(AsyncIterator[tuple[str, Any]], events):
            yield event


async def astart(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **kwargs: Any
) -> dict[str, Any]:
    """Async twin of `start`."""
    async for _ in astream_start(graph, thread_id, text, **kwargs):
        pass
    return await aoutput(graph, thread_id)


async def aresume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """Async twin of `resume`."""
    async for _ in astream_resume(graph, thread_id, answer, **kwargs):
        pass
    return _raise_if_refused(await aoutput(graph, thread_id))


async def aoutput(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any]:
    return _values(await graph.aget_state(config_for(thread_id)))


async def acancel(thread_id: str, *, ledger: CancelFlags) -> None:
    """Async twin of `cancel` (the ledger is blocking storage: written off the event loop)."""
    await asyncio.to_thread(cancel, thread_id, ledger=ledger)
