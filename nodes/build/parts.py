"""What every node needs, built once by `build_graph` and closed over by the node functions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.runnables import Runnable
from langgraph._internal._runnable import RunnableCallable  # as langgraph.prebuilt.ToolNode: sync + async twins

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.nodes.gate.checked_histories import CheckedHistories
from gatedloop.nodes.limits import Limits
from gatedloop.nodes.provider.answer_format import AnswerFormat
from gatedloop.nodes.state import RequestCounters, Status
from gatedloop.tools.policy import CallContext
from gatedloop.tools.registry import ToolRegistry

if TYPE_CHECKING:  # langchain (for middleware) is imported only when a graph is built with middleware
    from gatedloop.nodes.build.middleware import Middlewares, ModelCall

SystemPrompt = str | Callable[[Any, Any], "str | SystemMessage | None"]

P = ParamSpec("P")
R = TypeVar("R")

Question = Literal["approval", "unknown_outcome"]
"""What a person is asked: to decide gated calls, or whether a write whose outcome is unknown happened."""


@dataclass(frozen=True)
class AnsweredCall:
    """One call a person's answer decided, as telemetry reports it: who asked, when, under which rule, what was
    decided. Never its arguments."""

    call_id: str
    tool: str
    requester: str | None
    asked_at: float
    approvers: tuple[str, ...] | None
    approvals_required: int
    approvals: int
    """Approvals of these arguments counted toward `approvals_required` once this answer is counted."""
    decision: str
    waiting: bool
    """The request still waits (for more approvals, or for another call of it to be decided)."""


class Telemetry(Protocol):
    """The moments only the gate sees, for traces and metrics beside the spans its callback `handler` makes of
    runs, nodes, model calls and tool runs (gatedloop.graph.telemetry). None on `LoopParts` unless telemetry is on,
    so a graph without it never builds these reports."""

    handler: Any
    """A LangChain callback handler, compiled into the graph's config."""

    def trace_context(self) -> dict[str, str]:
        """The running trace (W3C `traceparent`), kept with a question so its answer links back to it."""

    def asked(self, question: Question, tools: Sequence[str]) -> None:
        """A question newly put to a person, about a call of each of `tools`."""

    def answered(
        self,
        question: Question,
        request_id: str,
        decider: CallContext | None,
        calls: Sequence[AnsweredCall],
        asked_in: Mapping[str, str] | None,
        at: float,
    ) -> None:
        """A person's answer decided `calls` at `at`; `asked_in` is the `trace_context` kept when it was asked.
        No `decider`: nobody did, the request expired at `at` (the calls' decision is `expired`)."""


@dataclass
class LoopParts:
    model: Runnable[LanguageModelInput, BaseMessage]
    registry: ToolRegistry
    limits: Limits
    ledger: Ledger
    clock: Callable[[], float] = field(default=time.time)
    system_prompt: SystemPrompt | None = None
    answer_format: AnswerFormat | None = None
    context_schema: type[Any] = CallContext
    histories: CheckedHistories = field(default_factory=CheckedHistories)
    middleware: Middlewares | None = None
    model_call: ModelCall | None = None  # the model through the middleware's wrap_model_call (None: no middleware)
    telemetry: Telemetry | None = None  # traces and metrics (None: off, nothing of OpenTelemetry is loaded)

    @contextmanager
    def one_commit(self) -> Iterator[LoopParts]:
        """These parts with a `one_commit` view of the ledger: everything one decision writes through them (its
        evidence, audit rows, answers and notices) is committed once, when the block ends (issue 52)."""
        with self.ledger.one_commit() as ledger:
            yield replace(self, ledger=ledger)

    async def ledger_call(self, work: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`work`, which uses this parts' ledger, run from an async node where the ledger may wait (`ledger_call`)."""
        return await ledger_call(self.ledger, work, *args, **kwargs)

    def prompt(self, state: Any, context: Any) -> list[BaseMessage]:
        """The system message every model call starts with; built per call, never stored in the state."""
        prompt = self.system_prompt
        if prompt is None:
            return []
        text = prompt if isinstance(prompt, str) else prompt(state, context)
        if text is None or isinstance(text, SystemMessage):
            return [text] if text is not None else []
        if not isinstance(text, str):
            raise TypeError(f"system_prompt returned {type(text).__name__}; it must return a str or SystemMessage")
        return [SystemMessage(text)] if text else []

    def stop_before_work(
        self, thread_id: str, counters: RequestCounters, *, tokens: bool = True
    ) -> tuple[Status, str] | None:
        """The node-boundary checks: cancelled, past the deadline, out of tokens. None means go on."""
        if self.ledger.cancel_requested(thread_id):
            return "cancelled", "cancelled on request"
        if (late := self.past_deadline(counters)) is not None:
            return late
        if tokens and counters["tokens"] >= self.limits.max_tokens:
            return "budget_exhausted", f"the token budget ({self.limits.max_tokens}) is used up"
        return None

    def clear_cancel(self, thread_id: str) -> None:
        """A new request starts with no cancel pending (a cancel asked for the previous one is spent)."""
        self.ledger.clear_cancel(thread_id)

    def past_deadline(self, counters: RequestCounters, waited_s: float = 0.0) -> tuple[Status, str] | None:
        """The deadline alone, on the request's active time: wall clock since it started, minus time spent waiting
        for a person (`counters["waited_s"]`, plus `waited_s` a node has waited and not stored yet)."""
        active = self.clock() - counters["started_at"] - counters["waited_s"] - waited_s
        if active > self.limits.deadline_s:
            return "deadline", f"the {self.limits.deadline_s:g} s deadline passed"
        return None


def fresh_counters(now: float) -> RequestCounters:
    return {
        "started_at": now,
        "waited_s": 0.0,
        "paused_at": None,
        "model_calls": 0,
        "tool_calls": 0,
        "tokens": 0,
        "per_tool": {},
        "retries": 0,
    }


async def ledger_call(ledger: Ledger | None, work: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`work`, which uses `ledger`, run from async code where the ledger may wait: where the ledger says
    (`Ledger.run_from_async`: in place, its statements awaited, or on a worker thread); with no ledger, on a
    worker thread."""
    if ledger is None:
        return await asyncio.to_thread(work, *args, **kwargs)
    return await ledger.run_from_async(work, *args, **kwargs)


def gate_node(parts: LoopParts, node: Callable[[Any, Any], dict[str, Any]]) -> RunnableCallable:
    """A gate node (`validate`, `approve`, `finalize`: the gate's checks and ledger work, no user I/O) with an async
    twin that runs it through `ledger_call`, so under `ainvoke` it runs where its ledger says (in place on an on-loop
    ledger, on the loop with each statement awaited on Postgres) rather than on LangGraph's executor, where a sync
    node goes by default."""

    async def where_the_ledger_says(state: Any, runtime: Any) -> dict[str, Any]:
        return await parts.ledger_call(node, state, runtime)

    # trace=False (here, in `model` and in `execute`): LangGraph's task already traces the node under its name, the
    # run callbacks and LangSmith see; a traced RunnableCallable would add a nested run of the same name, with its
    # own callback manager, for nothing. create_agent's nodes do the same (docs/performance.md measures it).
    return RunnableCallable(node, where_the_ledger_says, name=node.__name__, trace=False)
