"""Everything the spans an in-memory exporter got say, as text (names, attributes, events, links, status, resource:
the SDK's own JSON of each), for tests that look for what must never be in one: a secret, a forged identity."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider for `build_graph(tracer_provider=...)` and the exporter its spans end in."""
    spans_out = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans_out))
    return provider, spans_out


def span_text(spans_out: InMemorySpanExporter) -> str:
    return "\n".join(span.to_json() for span in spans_out.get_finished_spans())
