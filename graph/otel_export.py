"""The tracer and meter providers the standard `OTEL_*` variables describe, for graphs whose app passed none;
made once per process (gatedloop.graph.telemetry decides when they are wanted).

An app (or `opentelemetry-instrument`) that already installed an SDK provider as the global one keeps it: its
spans and gatedloop's share one pipeline. Otherwise gatedloop makes its own, and does not install it globally
(which provider is global is the app's choice): the exporters `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`
name (`otlp`, the default, over HTTP/protobuf as the `otel` extra installs it; or `console`), the resource from
`OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` (service name `gatedloop` if neither gives one), batching,
export interval and sampling from the SDK's own variables. The SDK shuts them down, flushing, when the process
exits.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Literal

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger("gatedloop.telemetry")

DEFAULT_SERVICE = "gatedloop"
HTTP = "http/protobuf"


@functools.cache
def tracer_provider() -> trace.TracerProvider:
    installed = trace.get_tracer_provider()
    if isinstance(installed, TracerProvider):
        return installed
    provider = TracerProvider(resource=_resource())
    for exporter in _span_exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


@functools.cache
def meter_provider() -> metrics.MeterProvider:
    installed = metrics.get_meter_provider()
    if isinstance(installed, MeterProvider):
        return installed
    readers = [PeriodicExportingMetricReader(exporter) for exporter in _metric_exporters()]
    return MeterProvider(resource=_resource(), metric_readers=readers)


def _span_exporters() -> list[SpanExporter]:
    made: dict[str, type[SpanExporter]] = {"otlp": OTLPSpanExporter, "console": ConsoleSpanExporter}
    return [made[name]() for name in _exporter_names("TRACES")]


def _metric_exporters() -> list[MetricExporter]:
    made: dict[str, type[MetricExporter]] = {"otlp": OTLPMetricExporter, "console": ConsoleMetricExporter}
    return [made[name]() for name in _exporter_names("METRICS")]


def _exporter_names(signal: Literal["TRACES", "METRICS"]) -> list[str]:
    """`otlp` and `console` from `OTEL_<signal>_EXPORTER` (default `otlp`); another name, or OTLP over a protocol
    other than HTTP/protobuf, is logged and skipped (pass a provider with that exporter instead)."""
    variable = f"OTEL_{signal}_EXPORTER"
    protocol = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    names = []
    for name in (part.strip().lower() for part in (os.environ.get(variable) or "otlp").split(",")):
        if name == "otlp" and protocol not in (None, HTTP):
            log.warning(
                "OTLP over %s: gatedloop exports OTLP over %s only; pass a provider to build_graph", protocol, HTTP
            )
        elif name in ("otlp", "console"):
            names.append(name)
        elif name not in ("", "none"):
            log.warning("%s=%s: gatedloop exports to otlp or console; pass a provider to build_graph", variable, name)
    return names


def _resource() -> Resource:
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE}))
    return resource
