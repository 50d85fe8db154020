"""Span export for `gateway work`: a tracer provider of the OpenTelemetry SDK, sending
the worker's consumer spans over OTLP/HTTP, set up from the standard `OTEL_*`
environment variables (`exporting_provider`).

The library never configures the SDK (an application that uses `Worker` sets its own
provider); `gateway work` is an application, so it does, for its own process only:

- Export is on when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`
  is set, or `OTEL_TRACES_EXPORTER` names `otlp` (then to the exporter's default,
  http://localhost:4318). It is off with `OTEL_SDK_DISABLED=true`, or when
  `OTEL_TRACES_EXPORTER` names no `otlp` (`none`, say).
- The exporter speaks OTLP over HTTP with protobuf. A `grpc` protocol asked for in
  `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` is refused with a warning, rather than sent
  to a gRPC port in a form it cannot read.
- The SDK reads the rest itself: `OTEL_SERVICE_NAME` (`gateway-work` when neither it
  nor `OTEL_RESOURCE_ATTRIBUTES` names one), `OTEL_TRACES_SAMPLER`, the exporter's
  headers, timeout and compression, the batch processor's delays.
- A provider the process already has (one set by `opentelemetry-instrument`, say) is
  left to do the work: nothing is set up beside it.
- Without the SDK or the exporter (`claim-gateway-client[otel]` installs both), a
  warning says what to install, and the worker runs without spans.

The caller owns the provider it is given and shuts it down (which sends what is left)
before the process exits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("gateway_client")

DEFAULT_SERVICE_NAME = "gateway-work"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
HTTP_PROTOCOL = "http/protobuf"


def export_asked(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for spans to be exported over OTLP."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER")
    if exporters is not None:
        return "otlp" in [e.strip().lower() for e in exporters.split(",")]
    return any(env.get(name, "").strip() for name in ENDPOINTS)


def exporting_provider(env: Mapping[str, str] | None = None) -> Any:
    """A TracerProvider that exports over OTLP/HTTP, when `env` (the process's own by
    default) asks for export and the process has no provider yet; else None. The
    exporter and the SDK read their settings from the process's environment."""
    env = os.environ if env is None else env
    if not export_asked(env):
        return None
    protocol = next((env[n] for n in PROTOCOLS if env.get(n, "").strip()), HTTP_PROTOCOL)
    if protocol.strip().lower() != HTTP_PROTOCOL:
        log.warning(
            "spans not exported: this worker sends OTLP over HTTP (%s) only, and %s asks for %s",
            HTTP_PROTOCOL,
            next(n for n in PROTOCOLS if env.get(n, "").strip()),
            protocol,
        )
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "spans not exported: %s (pip install 'claim-gateway-client[otel]' installs "
            "the OpenTelemetry SDK and its OTLP/HTTP exporter)",
            exc,
        )
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # the process has one already, which the worker uses
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
