"""An OTLP/HTTP receiver on 127.0.0.1 for the telemetry tests: what an OpenTelemetry exporter POSTs to
`/v1/traces` and `/v1/metrics`, decoded from protobuf (`opentelemetry-proto`, installed with the exporter), with
every raw body kept so a test can look for a secret in all of it, and a span tree as text (docs/observability.md
shows one).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    service: str
    scope: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    """(trace id, span id) of each link."""
    start_ns: int
    end_ns: int
    error: bool


@dataclass(frozen=True)
class Point:
    metric: str
    attributes: dict[str, Any]
    value: float
    """A sum's value, or a histogram's count."""


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: value_of(pair.value) for pair in pairs}


class OtlpReceiver:
    """`with OtlpReceiver() as otlp:` ... `otlp.url` is the `OTEL_EXPORTER_OTLP_ENDPOINT` to give exporters."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._traces: list[ExportTraceServiceRequest] = []
        self._metrics: list[ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                reply = receiver._take(self.path, body)
                if reply is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, path: str, body: bytes) -> bytes | None:
        with self._lock:
            self.bodies.append(body)
            if path == "/v1/traces":
                self._traces.append(ExportTraceServiceRequest.FromString(body))
                return ExportTraceServiceResponse().SerializeToString()
            if path == "/v1/metrics":
                self._metrics.append(ExportMetricsServiceRequest.FromString(body))
                return ExportMetricsServiceResponse().SerializeToString()
            return None

    def spans(self) -> list[Span]:
        found = []
        with self._lock:
            requests = list(self._traces)
        for request in requests:
            for resource in request.resource_spans:
                service = str(attributes_of(resource.resource.attributes).get("service.name", ""))
                for scope in resource.scope_spans:
                    for s in scope.spans:
                        found.append(
                            Span(
                                name=s.name,
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_id=s.parent_span_id.hex(),
                                service=service,
                                scope=scope.scope.name,
                                attributes=attributes_of(s.attributes),
                                links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                error=s.status.code == 2,
                            )
                        )
        return found

    def points(self) -> list[Point]:
        found = []
        with self._lock:
            requests = list(self._metrics)
        for request in requests:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        for p in getattr(metric, kind).data_points:
                            value = p.count if kind == "histogram" else (p.as_int or p.as_double)
                            found.append(Point(metric.name, attributes_of(p.attributes), float(value)))
        return found

    def wait_for(self, done: Callable[[list[Span]], bool], timeout_s: float = 15.0) -> list[Span]:
        """The spans received once `done(spans)`; AssertionError with the span tree if that never happens."""
        deadline = time.monotonic() + timeout_s
        while not done(spans := self.spans()):
            if time.monotonic() > deadline:
                raise AssertionError(f"the spans never arrived; received:\n{tree(spans)}")
            time.sleep(0.05)
        return spans


SHOWN = ("gen_ai.", "gatedloop.")


def tree(spans: list[Span], shown: tuple[str, ...] = SHOWN) -> str:
    """The spans as indented text, one trace after another (oldest first): name, service, duration, the
    attributes whose names start with `shown`, and each link (`-> trace/span`, by their first 8 hex digits; the
    span linked to shows its id as `#span`)."""
    children: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    targets = {target for s in spans for _, target in s.links}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def show(span: Span, depth: int) -> None:
        took = (span.end_ns - span.start_ns) / 1e9
        attrs = ", ".join(f"{k}={v!r}" for k, v in span.attributes.items() if k.startswith(shown))
        links = "".join(f" -> {t[:8]}/{s[:8]}" for t, s in span.links)
        label = f"{span.name} #{span.span_id[:8]}" if span.span_id in targets else span.name
        lines.append(f"{'  ' * depth}{label} [{span.service}, {took:.3f} s{', ERROR' if span.error else ''}]{links}")
        if attrs:
            lines.append(f"{'  ' * depth}    {attrs}")
        for child in sorted(children.get(span.span_id, []), key=lambda c: c.start_ns):
            show(child, depth + 1)

    for root in sorted(children.get("", []), key=lambda r: r.start_ns):
        lines.append(f"trace {root.trace_id[:8]} span {root.span_id[:8]}")
        show(root, 1)
    return "\n".join(lines)
