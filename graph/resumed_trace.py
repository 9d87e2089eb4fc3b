"""A run that answers a question continues the trace that asked it, so an approval turn is one trace, whichever
process (or server) takes the answer, days later or not.

The asking run kept its trace context (W3C `traceparent`) in the question's notice (nodes/run/notices.py, `trace`);
the graph's entry (`GatedGraph.stream` / `astream`) reads it back for a `Command(resume=...)` on a thread paused on
a question, before the run starts, and hands it to the span handler as the run's metadata `ASKED_IN`
(graph/otel_spans.py makes the run's root span its child). Only with telemetry on; nothing is read otherwise. A
question asked with telemetry off, or by a version that kept no context, leaves the run a trace of its own. A
client's own `ASKED_IN` (a served run's metadata) is always dropped: only the ledger's notice says where a run
belongs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt

from gatedloop.checkpoints.ledger import Ledger
from gatedloop.graph.parts_of import parts_of
from gatedloop.graph.thread_graph import ledger_of
from gatedloop.nodes.run.notices import unknown_request_id
from gatedloop.nodes.run.observed import kept_trace
from gatedloop.nodes.wire.hitl import UnknownOutcomeRequest

ASKED_IN = "__gatedloop_asked_in"
"""Run metadata: the kept trace context of the question this run answers (`__`: never copied into checkpoints)."""


def resumed_config(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str | None, input: Any, config: RunnableConfig | None
) -> RunnableConfig | None:
    """`config` for a run of `graph` on `thread_id`, with the asking trace context if the run answers a question
    whose context was kept."""
    config = _without_asked_in(config)
    ledger = _answering(graph, thread_id, input)
    if ledger is None or thread_id is None:
        return config
    return _with_asked_in(config, _kept_for(ledger, thread_id, graph.get_state(config or {}).interrupts))


async def aresumed_config(
    graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str | None, input: Any, config: RunnableConfig | None
) -> RunnableConfig | None:
    config = _without_asked_in(config)
    ledger = _answering(graph, thread_id, input)
    if ledger is None or thread_id is None:
        return config
    interrupts = (await graph.aget_state(config or {})).interrupts
    return _with_asked_in(config, await asyncio.to_thread(_kept_for, ledger, thread_id, interrupts))


def _answering(graph: CompiledStateGraph[Any, Any, Any, Any], thread_id: str | None, input: Any) -> Ledger | None:
    """The ledger to read the kept context from, when this run is an answer on a thread of a graph with telemetry."""
    parts = parts_of(graph)
    if parts is None or parts.telemetry is None or thread_id is None:
        return None
    if not (isinstance(input, Command) and input.resume is not None):
        return None
    return ledger_of(graph)


def _kept_for(ledger: Ledger, thread_id: str, interrupts: Sequence[Interrupt]) -> dict[str, str] | None:
    """The first kept context of the questions the thread waits on (an approval request, an unknown outcome)."""
    for interrupt in interrupts:
        value = interrupt.value
        if not isinstance(value, Mapping):
            continue
        if value.get("kind") == "approval" and isinstance(value.get("request_id"), str):
            kept = kept_trace(ledger, thread_id, value["request_id"], "request")
        elif value.get("kind") == "unknown_outcome" and isinstance(value.get("calls"), list):
            kept = kept_trace(ledger, thread_id, unknown_request_id(cast(UnknownOutcomeRequest, value)), "unknown")
        else:
            continue
        if kept:
            return kept
    return None


def _without_asked_in(config: RunnableConfig | None) -> RunnableConfig | None:
    metadata = (config or {}).get("metadata") or {}
    if config is None or ASKED_IN not in metadata:
        return config
    return {**config, "metadata": {k: v for k, v in metadata.items() if k != ASKED_IN}}


def _with_asked_in(config: RunnableConfig | None, kept: dict[str, str] | None) -> RunnableConfig | None:
    if not kept:
        return config
    config = config or {}
    return {**config, "metadata": {**(config.get("metadata") or {}), ASKED_IN: kept}}
