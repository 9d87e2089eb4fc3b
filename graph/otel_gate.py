"""`Telemetry` (nodes/build/parts.py) over OpenTelemetry: the callback handler's spans (graph/otel_spans.py), a span per
call a person decided, and the metrics.

A person's answer becomes one span per call it decided (`approval <tool>`, `unknown_outcome <tool>`), from when
the call was asked to when it was decided, however many processes and days lie between: it is made when the answer
is taken, with that start time, as a child of the run that asked (its trace context was kept with the question's
notice, nodes/run/observed.py) and linked to the step that took the answer, whose run continues the same trace
(graph/resumed_trace.py); with no context kept (telemetry was off where it was asked), it is a child of that
step. Its `gatedloop.*` attributes: the question, request id, tool and call id, requester, approver roles, the
decider and her roles, the decision (`gatedloop.verdict`), seconds waited, the quorum (`required`, `approvals`
counted so far) and whether the request still waits. A request that expires before anyone decides it ends the same
span at its deadline, verdict `expired`, with no decider.

Metrics (meter `gatedloop`): `gatedloop.requests.asked` (calls put to a person), `gatedloop.requests.decided`
(by `gatedloop.verdict`, `expired` included), `gatedloop.requests.wait` (seconds from asked to decided, a histogram),
`gatedloop.writes.run` (write tools started), `gatedloop.writes.unknown` (writes whose outcome was unknown, by
reason); each by `gatedloop.tool.name`, and the question ones by `gatedloop.question` (`approval`,
`unknown_outcome`).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Link

from gatedloop.checkpoints.running_step import step_config
from gatedloop.graph.otel_spans import PROPAGATOR, SpanHandler
from gatedloop.graph.telemetry import asked_by_env
from gatedloop.nodes.build.parts import AnsweredCall, Question
from gatedloop.nodes.wire.hitl import ANONYMOUS
from gatedloop.tools.policy import CallContext

SCOPE = "gatedloop"
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0)
"""Seconds a person takes: from a second to a day."""


class OtelTelemetry:
    """One graph's telemetry: its tracer, its instruments and its callback `handler`."""

    def __init__(self, graph_name: str, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        self._tracer = tracer
        self._asked = meter.create_counter("gatedloop.requests.asked", "{call}", "calls put to a person")
        self._decided = meter.create_counter("gatedloop.requests.decided", "{call}", "calls a person decided")
        self._wait = meter.create_histogram(
            "gatedloop.requests.wait",
            "s",
            "from a call being asked to a person deciding it",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        writes = meter.create_counter("gatedloop.writes.run", "{call}", "write tools started")
        unknown = meter.create_counter("gatedloop.writes.unknown", "{call}", "writes whose outcome was unknown")
        self.handler = SpanHandler(tracer, graph_name, writes, unknown)

    @classmethod
    def create(cls, graph_name: str, tracer_provider: Any = None, meter_provider: Any = None) -> OtelTelemetry:
        """With the providers passed, else those the `OTEL_*` variables ask for, else the global ones."""
        if tracer_provider is None and asked_by_env("TRACES"):
            from gatedloop.graph.otel_export import tracer_provider as from_env

            tracer_provider = from_env()
        if meter_provider is None and asked_by_env("METRICS"):
            from gatedloop.graph.otel_export import meter_provider as from_env_meters

            meter_provider = from_env_meters()
        version = importlib.metadata.version("gatedloop")
        tracer = trace.get_tracer(SCOPE, version, tracer_provider=tracer_provider)
        return cls(graph_name, tracer, metrics.get_meter(SCOPE, version, meter_provider=meter_provider))

    def trace_context(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        span = self.handler.root_span(step_config())
        if span is not None:
            PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def asked(self, question: Question, tools: Sequence[str]) -> None:
        for tool in tools:
            self._asked.add(1, {"gatedloop.question": question, "gatedloop.tool.name": tool})

    def answered(
        self,
        question: Question,
        request_id: str,
        decider: CallContext | None,
        calls: Sequence[AnsweredCall],
        asked_in: Mapping[str, str] | None,
        at: float,
    ) -> None:
        deciding = self.handler.step_span(step_config())
        asking = PROPAGATOR.extract(asked_in) if asked_in else None
        asked_span = trace.get_current_span(asking).get_span_context() if asking is not None else None
        if asked_span is not None and asked_span.is_valid:
            parent, links = asking, [Link(deciding.get_span_context())] if deciding is not None else []
            if deciding is not None and deciding.get_span_context().trace_id != asked_span.trace_id:
                deciding.add_link(asked_span, {"gatedloop.request.id": request_id})  # a run that was not resumed
        else:
            parent, links = (trace.set_span_in_context(deciding) if deciding is not None else None), []
        for call in calls:
            waited = max(0.0, at - call.asked_at)
            attributes: dict[str, Any] = {
                "gatedloop.question": question,
                "gatedloop.request.id": request_id,
                "gatedloop.tool.name": call.tool,
                "gatedloop.tool.call_id": call.call_id,
                "gatedloop.verdict": call.decision,
                "gatedloop.waited_s": waited,
                "gatedloop.quorum.required": call.approvals_required,
                "gatedloop.quorum.approvals": call.approvals,
                "gatedloop.waiting": call.waiting,
            }
            if decider is not None:  # none for a request that expired
                attributes["gatedloop.decider"] = decider.user_id or ANONYMOUS
                attributes["gatedloop.decider.roles"] = sorted(decider.roles)
            if call.requester is not None:
                attributes["gatedloop.requester"] = call.requester
            if call.approvers is not None:
                attributes["gatedloop.approvers"] = list(call.approvers)
            span = self._tracer.start_span(
                f"{question} {call.tool}", parent, links=links, start_time=_ns(call.asked_at), attributes=attributes
            )
            span.end(end_time=_ns(at))
            labels = {
                "gatedloop.question": question,
                "gatedloop.tool.name": call.tool,
                "gatedloop.verdict": call.decision,
            }
            self._decided.add(1, labels)
            self._wait.record(waited, labels)


def _ns(epoch_s: float) -> int:
    return int(epoch_s * 1_000_000_000)
