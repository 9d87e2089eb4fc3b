"""Running a thread from Python the way the CLI does: one resumer at a time, every step checkpointed.

`start` and `resume` hold the thread's lease (`ThreadBusy` if another process is running it), run with
`durability="sync"` so each step is on disk before the next begins, and `resume` checks a reviewer's
answer against the pending request before it reaches the graph (`InvalidDecision`, nothing changed). Standing grants
and limits across threads (`grant`, `confirm_grant`, `revoke`, `grants`, `limit_usage`) are graph/grants.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, TypedDict, Unpack, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt, StateSnapshot, StreamMode

from gatedloop.checkpoints.contract import GatedSaver
from gatedloop.checkpoints.ledger import Audit, CancelFlags
from gatedloop.checkpoints.threads import UnknownThread, validate_thread_id
from gatedloop.graph.grants import GrantView as GrantView
from gatedloop.graph.grants import check_grant as check_grant
from gatedloop.graph.grants import confirm_grant as confirm_grant
from gatedloop.graph.grants import grant as grant
from gatedloop.graph.grants import grants as grants
from gatedloop.graph.grants import limit_usage as limit_usage
from gatedloop.graph.grants import revoke as revoke
from gatedloop.graph.late_answers import AlreadyDecided as AlreadyDecided
from gatedloop.graph.late_answers import bound_to, positional, too_late
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.thread_graph import claim_thread, ledger_of
from gatedloop.nodes.gate.extension import Extended, extend_request
from gatedloop.nodes.wire.hitl import InvalidDecision
from gatedloop.nodes.wire.resume import check_answer
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


class RunOptions(TypedDict, total=False):
    """How `start`, `resume` and their streaming and async forms run a thread."""

    context: Any
    """Who runs it: the runtime context, a `CallContext` or the graph's `context_schema` (an object or a dict); its
    `user_id` and `roles` are the requester's, or the answer's sender's, or the upgrading operator's."""
    wait_s: float
    """How long to wait for the thread's lease while another process runs it (0: `ThreadBusy` at once)."""
    upgrade: bool
    """Run the thread with this graph although another graph (or this one with other tools or policies) made it,
    recording the change in the audit trail: an operator's explicit act (CLI: `--upgrade-graph`)."""


@dataclass(frozen=True)
class _Run:
    """One run of a thread, the schedule both drivers keep: under the thread's lease, the input (a message, or an
    answer checked against the pending request, which needs the thread's state), the thread moved to this graph if
    asked, then the graph's stream with every step on disk before the next (`durability="sync"`)."""

    graph: CompiledStateGraph[Any, Any, Any, Any]
    thread_id: str
    options: RunOptions
    message: str | None = None  # a new request's text; None: a resume, with `answer`
    answer: Any = None

    @property
    def config(self) -> RunnableConfig:
        return config_for(self.thread_id)

    @property
    def resumes(self) -> bool:
        return self.message is None

    @property
    def upgrade(self) -> bool:
        return self.options.get("upgrade", False)

    def lease(self) -> AbstractContextManager[None]:
        return lease_for(self.graph, self.thread_id, self.options.get("wait_s", 0.0))

    @property
    def binds(self) -> bool:
        """A positional answer that may wait for the thread: bound first to the request pending as it is sent."""
        return self.resumes and self.options.get("wait_s", 0.0) > 0 and positional(self.answer)

    def sent(self, snapshot: StateSnapshot) -> _Run:
        return replace(self, answer=bound_to(self.answer, _request_of(snapshot.interrupts)))

    def prepared(self, snapshot: StateSnapshot | None) -> Any:
        """The graph's input; with `upgrade`, the thread claimed for this graph first (a ledger write: blocking).
        Without it the graph's own entry checks the thread's graph (graph/gated.py)."""
        if snapshot is None:
            payload: Any = {"messages": [("user", self.message)]}
        else:
            payload = _resume_payload(self.thread_id, snapshot, self.answer, ledger_of(self.graph))
        if self.upgrade:
            claim_thread(self.graph, self.thread_id, upgrade=True, context=self.options.get("context"))
        return payload

    def stream_options(self) -> dict[str, Any]:
        return {"context": self.options.get("context"), "stream_mode": STREAM_MODES, "durability": "sync"}


def _stream(run: _Run) -> Iterator[tuple[str, Any]]:
    """The sync driver of `_Run`."""
    if run.binds:
        run = run.sent(run.graph.get_state(run.config))
    with run.lease():
        snapshot = run.graph.get_state(run.config) if run.resumes else None  # one load: a long thread's costly part
        events = run.graph.stream(run.prepared(snapshot), run.config, **run.stream_options())
        yield from cast(Iterator[tuple[str, Any]], events)


def stream_start(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **options: Unpack[RunOptions]
) -> Iterator[tuple[str, Any]]:
    """Start (or continue) a thread with a user message, yielding (mode, chunk) as steps happen."""
    return _stream(_Run(graph, thread_id, options, message=text))


def stream_resume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **options: Unpack[RunOptions]
) -> Iterator[tuple[str, Any]]:
    """Resume a paused thread with an answer (or, with None, a thread stopped mid-run by a crash)."""
    return _stream(_Run(graph, thread_id, options, answer=answer))


def _resume_payload(thread_id: str, snapshot: StateSnapshot, answer: Any, ledger: Audit | None) -> Command | None:
    """The answer addressed to the pending interrupt, checked first (InvalidDecision, nothing changed; AlreadyDecided
    when another answer decided what it names). A thread with no checkpoint is UnknownThread, not "not waiting": a
    typo in a thread id must not read as a finished one."""
    if snapshot.created_at is None:
        raise UnknownThread(thread_id, "this graph's checkpointer")
    pending = snapshot.interrupts
    request = _request_of(pending)
    late = too_late(ledger, thread_id, answer, request)
    if late is not None:
        raise late
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


def start(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **options: Unpack[RunOptions]
) -> dict[str, Any]:
    """Run until the thread pauses or ends; returns the thread's values plus `__interrupt__` if paused."""
    for _ in stream_start(graph, thread_id, text, **options):
        pass
    return output(graph, thread_id)


def resume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **options: Unpack[RunOptions]
) -> dict[str, Any]:
    """Answer a paused thread and run it until it pauses or ends; its values, as `start`. What became of the answer
    is told every time: it decided (this returns), another answer had decided what it names (`AlreadyDecided`,
    naming who), it was refused (`InvalidDecision`, why), or another process runs the thread (`ThreadBusy`, after
    `wait_s`; nothing tried)."""
    for _ in stream_resume(graph, thread_id, answer, **options):
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
) -> Extended:
    """An approver (`context`) gives the calls of the pending approval request `request_id` that she may decide their
    time to live again, from now: `until` (their new deadline), `extended` and `kept` (each call that keeps its
    deadline, with why: another reviewer's, or one she extended already). Nothing is decided and the request keeps
    waiting; the extension is a record in the ledger (nodes/gate/extension.py). InvalidDecision, nothing recorded,
    when she may extend none of its calls."""
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
async def _alease(lease: AbstractContextManager[None]) -> AsyncIterator[None]:
    """`lease` held; taking and releasing it may block (file lock, Postgres), so not on the event loop."""
    await asyncio.to_thread(lease.__enter__)
    try:
        yield
    finally:
        await asyncio.to_thread(lease.__exit__, None, None, None)


async def apending_request(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any] | None:
    """Async twin of `pending_request`."""
    return _request_of((await graph.aget_state(config_for(thread_id))).interrupts)


async def _astream(run: _Run) -> AsyncIterator[tuple[str, Any]]:
    """The async driver of `_Run`: the lease and an upgrade's claim, which block, off the event loop."""
    if run.binds:
        run = run.sent(await run.graph.aget_state(run.config))
    async with _alease(run.lease()):
        snapshot = await run.graph.aget_state(run.config) if run.resumes else None
        payload = await asyncio.to_thread(run.prepared, snapshot) if run.upgrade else run.prepared(snapshot)
        events = run.graph.astream(payload, run.config, **run.stream_options())
        async for event in cast(AsyncIterator[tuple[str, Any]], events):
            yield event


def astream_start(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **options: Unpack[RunOptions]
) -> AsyncIterator[tuple[str, Any]]:
    """Async twin of `stream_start`."""
    return _astream(_Run(graph, thread_id, options, message=text))


def astream_resume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **options: Unpack[RunOptions]
) -> AsyncIterator[tuple[str, Any]]:
    """Async twin of `stream_resume`."""
    return _astream(_Run(graph, thread_id, options, answer=answer))


async def astart(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, text: str, **options: Unpack[RunOptions]
) -> dict[str, Any]:
    """Async twin of `start`."""
    async for _ in astream_start(graph, thread_id, text, **options):
        pass
    return await aoutput(graph, thread_id)


async def aresume(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str, answer: Any = None, **options: Unpack[RunOptions]
) -> dict[str, Any]:
    """Async twin of `resume`."""
    async for _ in astream_resume(graph, thread_id, answer, **options):
        pass
    return _raise_if_refused(await aoutput(graph, thread_id))


async def aoutput(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str) -> dict[str, Any]:
    return _values(await graph.aget_state(config_for(thread_id)))


async def acancel(thread_id: str, *, ledger: CancelFlags) -> None:
    """Async twin of `cancel` (the ledger is blocking storage: written off the event loop)."""
    await asyncio.to_thread(cancel, thread_id, ledger=ledger)
