"""Whether tracing is on, and the tracer provider's life (started and stopped by the
app's lifespan, gateway/http/app.py).

The variables are OpenTelemetry's own, read by its SDK as every OpenTelemetry program
reads them: `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` turns
tracing on; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keeps it off
whatever the endpoint. `OTEL_SERVICE_NAME` (default `claim-gateway`), the sampler
(`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the batch processor's timing
(`OTEL_BSP_*`) and the exporter's headers and timeout are left to the SDK.

Spans go over OTLP/HTTP (protobuf), through a BatchSpanProcessor: a request never
waits for the collector, and a collector that is down costs the spans, never a
request.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

log = logging.getLogger("gateway.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_SERVICE_NAME = "claim-gateway"
# What `pip install 'claim-gateway[otel]'` brings, by the module each one provides.
SDK_MODULES = {
    "opentelemetry.sdk.trace": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter": (
        "opentelemetry-exporter-otlp-proto-http"
    ),
}
INSTALL_HINT = "pip install 'claim-gateway[otel]'"

# The provider the lifespan started, for stop(): one per process.
_provider: Any = None


def requested(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces to be exported (module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def missing_packages() -> list[str]:
    """The distributions tracing needs that cannot be imported here, by name."""
    missing = []
    for module, package in SDK_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(package)
    return missing


def check(env: Mapping[str, str]) -> None:
    """Raise ConfigError, told in one line, when the environment asks for tracing and
    the SDK is not installed: `gateway serve` refuses to start rather than run without
    the traces it was asked for."""
    if not requested(env):
        return
    missing = missing_packages()
    if missing:
        asking = next(name for name in ENDPOINT_VARIABLES if env.get(name, "").strip())
        raise ConfigError(
            f"{asking} asks for traces, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}, "
            "or unset it"
        )


def start(env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the environment asks for it (and the SDK is there: `check`
    ran at start-up; without it, one warning and tracing stays off). Returns whether it
    is on. Each call that returns True is matched by one `stop()`."""
    global _provider
    from .. import tracing

    env = os.environ if env is None else env
    if not requested(env) or _provider is not None:
        return _provider is not None
    if missing_packages():
        log.warning("tracing asked for, but the SDK is not installed: %s", INSTALL_HINT)
        return False
    # Imported here only: with tracing off, no module of OpenTelemetry is loaded.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from .spans import ChosenIds, Spans

    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without a
    # name from either it makes up `unknown_service:python`, which ours replaces.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    ids = ChosenIds()  # a lease's span takes its id from the lease's (spans.py)
    # The sampler: OTEL_TRACES_SAMPLER, read by the provider.
    provider = TracerProvider(resource=resource, id_generator=ids)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider = provider
    tracing.active = Spans(provider.get_tracer("claim-gateway"), ids)
    log.info("tracing on: spans exported over OTLP/HTTP")
    return True


def stop() -> None:
    """Turn tracing off and send the spans still queued (the provider's shutdown waits
    for its exporter, within the SDK's OTEL_BSP_EXPORT_TIMEOUT). Idempotent."""
    global _provider
    from .. import tracing

    provider, _provider = _provider, None
    tracing.active = None
    if provider is not None:
        provider.shutdown()
