"""Whether a graph reports OpenTelemetry traces and metrics, decided once when `build_graph` compiles it.

On when the app passes a provider (`build_graph(..., tracer_provider=..., meter_provider=...)`), or when the
standard variables ask for an export: `OTEL_EXPORTER_OTLP_ENDPOINT` (or its per-signal `..._TRACES_ENDPOINT`,
`..._METRICS_ENDPOINT`), or `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER` set to anything but `none`;
`OTEL_SDK_DISABLED=true` turns the variables off. Off otherwise, and then this module is all gatedloop loads of it:
the graph has no callback handler and the gate makes no report (`LoopParts.telemetry` is None). The OpenTelemetry
modules (graph/otel_*.py, the `otel` extra) are imported only when it is on; variables that ask for an export
without the extra installed are logged as a warning, and the graph runs without telemetry.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from gatedloop.nodes.build.parts import Telemetry

log = logging.getLogger("gatedloop.telemetry")

Signal = Literal["TRACES", "METRICS"]
NOT_INSTALLED = (
    "OTEL_* variables ask for OpenTelemetry, but gatedloop's otel extra is not installed "
    "(pip install 'gatedloop[otel]'): no spans or metrics"
)


def asked_by_env(signal: Signal) -> bool:
    """Whether the standard `OTEL_*` variables ask for this signal to be exported."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = os.environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    return bool(exporter) or any(os.environ.get(name) for name in endpoints)


def telemetry_for(graph_name: str, tracer_provider: Any = None, meter_provider: Any = None) -> Telemetry | None:
    """The graph's telemetry, or None when it is off (see the module docstring)."""
    traces = tracer_provider is not None or asked_by_env("TRACES")
    metrics = meter_provider is not None or asked_by_env("METRICS")
    if not (traces or metrics):
        return None
    try:
        from gatedloop.graph.otel_gate import OtelTelemetry
    except ImportError:
        if tracer_provider is not None or meter_provider is not None:
            raise
        log.warning(NOT_INSTALLED)
        return None
    return OtelTelemetry.create(graph_name, tracer_provider, meter_provider)
