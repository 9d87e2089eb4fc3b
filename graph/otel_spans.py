"""LangChain callbacks as OpenTelemetry spans: one per run of the graph, per node and per tool task, per model call
and per tool run, the model call (`chat`) and the tool run (`execute_tool`) with the GenAI semantic conventions.

Why callbacks: LangGraph reports every run, node and task to them, in whichever thread or pool it runs, with ids
that say which runs inside which; parents are found by those ids, not by the ambient OpenTelemetry context, which
a node's thread and the tool pool do not carry. The run of the graph is a child of the app's current span, if any;
a run that answers a question continues the trace that asked it instead (graph/resumed_trace.py), linked to the
app's span.
Runs that are neither a node, a task, a model call nor a tool (routers, channel writes, a node's inner callable)
get no span: what runs inside them hangs from the nearest run that has one. Hand-written: the LangChain
instrumentations of OpenInference and OpenLLMetry record prompts, messages and tool inputs by default, and
gatedloop must not.

What a span holds: names, ids, the model, token counts, finish reasons, a tool call's id, effect, decision and
reviewer, an outcome's status. Never a prompt, a message, an argument, a result or an exception's text (its type
only): a `secret_args` value, a token or a path in an error cannot reach a span because none of it is read.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Counter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gatedloop.graph.resumed_trace import ASKED_IN

PROPAGATOR = TraceContextTextMapPropagator()


@dataclass(frozen=True)
class _Run:
    span: Span
    parent: UUID | None
    """The nearest enclosing run that has a span (None: the run of the graph)."""
    node: str | None = None
    """The node or task this span is (None for the graph, a model call or a tool run)."""
    tool: str | None = None
    """A tool task's tool."""


class SpanHandler(BaseCallbackHandler):
    """Spans of one graph's runs; the gate asks it for the span of the step running now (`step_span`)."""

    run_inline = True  # called in order, in the step's thread or task: a parent's span exists before its children's

    def __init__(self, tracer: trace.Tracer, agent: str, writes: Counter, unknown: Counter) -> None:
        self._tracer = tracer
        self._agent = agent
        self._writes = writes
        self._unknown = unknown
        self._runs: dict[UUID, _Run] = {}
        self._passed: dict[UUID, UUID | None] = {}  # runs with no span -> their parent run
        self._lock = threading.Lock()

    # --- what the gate asks ------------------------------------------------------------------------------------

    def step_span(self, config: RunnableConfig) -> Span | None:
        """The span of the node or task whose config this is (its callbacks' parent run)."""
        with self._lock:
            found = self._nearest(getattr(config.get("callbacks"), "parent_run_id", None))
            return self._runs[found].span if found is not None else None

    def root_span(self, config: RunnableConfig) -> Span | None:
        """The span of the graph's run that the step whose config this is belongs to."""
        with self._lock:
            root = self._root(self._nearest(getattr(config.get("callbacks"), "parent_run_id", None)))
            return root.span if root is not None else None

    # --- the graph, its nodes and tasks ------------------------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        name = kwargs.get("name") or (serialized or {}).get("name") or "run"
        meta = metadata or {}
        node = meta.get("langgraph_node")
        with self._lock:
            parent = self._nearest(parent_run_id)
            if parent is None:
                thread = meta.get("thread_id")
                attributes = {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": self._agent,
                    "gen_ai.conversation.id": str(thread) if thread is not None else None,
                }
                context, links = _continued(meta.get(ASKED_IN))
                self._start(run_id, None, f"invoke_agent {self._agent}", SpanKind.INTERNAL, attributes, context, links)
            elif node is not None and name == node and self._runs[parent].node != node:
                plan = inputs.get("plan") if isinstance(inputs, Mapping) else None
                tool = str(plan.get("name")) if isinstance(plan, Mapping) else None
                call_id = str(plan.get("id")) if isinstance(plan, Mapping) else None
                attributes = {"gatedloop.node": node, "gatedloop.tool.name": tool, "gatedloop.tool.call_id": call_id}
                self._start(run_id, parent, node, SpanKind.INTERNAL, attributes, node=node, tool=tool)
            else:
                self._passed[run_id] = parent_run_id

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._pop(run_id)
        if run is None:
            return
        if isinstance(outputs, Mapping):
            self._ended_with(run, outputs)
        run.span.end()

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_failed(run_id, error)

    def _ended_with(self, run: _Run, outputs: Mapping[str, Any]) -> None:
        """What a finished run says about itself: the graph's status, a tool task's outcome (an unknown one
        counted), a settle task's outcome and whether it was left to a person."""
        if run.parent is None:
            if isinstance(outputs.get("status"), str):
                run.span.set_attribute("gatedloop.status", outputs["status"])
            return
        if run.tool is None:
            return
        outcome = outputs.get("outcome", outputs)
        status = outcome.get("status") if isinstance(outcome, Mapping) else None
        if not isinstance(status, str):
            return
        run.span.set_attribute("gatedloop.outcome", status)
        if isinstance(outcome.get("error_type"), str):
            run.span.set_attribute("gatedloop.error_type", outcome["error_type"])
        if isinstance(outputs.get("left_open"), bool):
            run.span.set_attribute("gatedloop.left_open", outputs["left_open"])
        elif status == "unknown":
            reason = str(outcome.get("unknown", "unknown"))
            run.span.set_attribute("gatedloop.unknown_reason", reason)
            self._unknown.add(1, {"gatedloop.tool.name": run.tool, "gatedloop.unknown_reason": reason})

    # --- model calls -------------------------------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        model = meta.get("ls_model_name") or params.get("model") or params.get("model_name")
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": meta.get("ls_provider"),
            "gen_ai.request.model": model,
            "gen_ai.request.temperature": meta.get("ls_temperature"),
            "gen_ai.request.max_tokens": meta.get("ls_max_tokens"),
        }
        with self._lock:
            self._start(
                run_id, self._nearest(parent_run_id), f"chat {model}" if model else "chat", SpanKind.CLIENT, attributes
            )

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._pop(run_id)
        if run is None:
            return
        run.span.set_attributes(_response_attributes(response))
        run.span.end()

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_failed(run_id, error)

    # --- tool runs ---------------------------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        meta = metadata or {}
        tool = str(kwargs.get("name") or (serialized or {}).get("name") or "tool")
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": meta.get("gatedloop_tool_call_id"),
            "gatedloop.tool.effect": meta.get("gatedloop_effect"),
            "gatedloop.decision": meta.get("gatedloop_decision"),
            "gatedloop.reviewer": meta.get("gatedloop_reviewer"),
        }
        with self._lock:
            self._start(run_id, self._nearest(parent_run_id), f"execute_tool {tool}", SpanKind.INTERNAL, attributes)
        if meta.get("gatedloop_effect") == "write":
            self._writes.add(1, {"gatedloop.tool.name": tool})

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        run = self._pop(run_id)
        if run is not None:
            run.span.end()

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_failed(run_id, error)

    # --- bookkeeping -------------------------------------------------------------------------------------------

    def _nearest(self, run_id: UUID | None) -> UUID | None:
        """The run itself if it has a span, else its nearest enclosing run that has one; None for a run not of
        this graph (or none). Called under the lock."""
        while run_id is not None and run_id not in self._runs:
            run_id = self._passed.get(run_id)
        return run_id

    def _root(self, run_id: UUID | None) -> _Run | None:
        """The graph's run that a run with a span belongs to. Called under the lock."""
        run = self._runs.get(run_id) if run_id is not None else None
        while run is not None and run.parent is not None and run.parent in self._runs:
            run = self._runs[run.parent]
        return run

    def _start(
        self,
        run_id: UUID,
        parent: UUID | None,
        name: str,
        kind: SpanKind,
        attributes: Mapping[str, Any],
        context: Context | None = None,
        links: Sequence[Link] = (),
        *,
        node: str | None = None,
        tool: str | None = None,
    ) -> None:
        """Called under the lock. A run with no parent span is a child of `context`, else of the app's current
        span, if any."""
        if parent is not None:
            context = trace.set_span_in_context(self._runs[parent].span)
        span = self._tracer.start_span(name, context=context, kind=kind, attributes=_present(attributes), links=links)
        self._runs[run_id] = _Run(span, parent, node, tool)

    def _pop(self, run_id: UUID) -> _Run | None:
        with self._lock:
            self._passed.pop(run_id, None)
            return self._runs.pop(run_id, None)

    def _end_failed(self, run_id: UUID, error: BaseException) -> None:
        """An interrupt (a question put to a person, marked on the run and on the graph's run) or another bubble-up
        of LangGraph's is no failure; anything else is one, named by its type."""
        with self._lock:
            self._passed.pop(run_id, None)
            run = self._runs.pop(run_id, None)
            root = self._root(run.parent) if run is not None else None
        if run is None:
            return
        if isinstance(error, GraphInterrupt):
            for span in (run.span, root.span if root is not None else None):
                if span is not None:
                    span.set_attribute("gatedloop.interrupted", True)
        elif not isinstance(error, GraphBubbleUp):
            run.span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")
            run.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        run.span.end()


def _response_attributes(response: LLMResult) -> dict[str, AttributeValue]:
    """The GenAI response attributes of a model call: the model that answered, its tokens, why it stopped."""
    first = response.generations[0][0] if response.generations and response.generations[0] else None
    message = getattr(first, "message", None)
    usage = getattr(message, "usage_metadata", None) or {}
    meta = getattr(message, "response_metadata", None) or {}
    totals = (response.llm_output or {}).get("token_usage") or {}
    finish = meta.get("finish_reason") or meta.get("stop_reason")
    return _present(
        {
            "gen_ai.response.model": meta.get("model_name") or meta.get("model"),
            "gen_ai.response.id": meta.get("id"),
            "gen_ai.response.finish_reasons": [str(finish)] if finish else None,
            "gen_ai.usage.input_tokens": usage.get("input_tokens", totals.get("prompt_tokens")),
            "gen_ai.usage.output_tokens": usage.get("output_tokens", totals.get("completion_tokens")),
        }
    )


def _continued(asked_in: Any) -> tuple[Context | None, list[Link]]:
    """Where a run of the graph starts its trace: in the asking run's trace when it answers a question whose
    context was kept (`asked_in`, graph/resumed_trace.py), linked to the app's own current span if it has one (a
    served request's incoming trace); else nowhere given (the app's current span, if any, is its parent)."""
    asking = PROPAGATOR.extract(asked_in) if isinstance(asked_in, Mapping) else None
    if asking is None or not trace.get_current_span(asking).get_span_context().is_valid:
        return None, []
    own = trace.get_current_span().get_span_context()
    return asking, [Link(own)] if own.is_valid else []


def _present(attributes: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """The attributes that have a value (OpenTelemetry refuses None)."""
    return {key: value for key, value in attributes.items() if value is not None}
