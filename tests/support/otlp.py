"""An OTLP/HTTP receiver for the tests: what an OpenTelemetry collector listens for at
`POST /v1/traces` (protobuf), decoded with the real `opentelemetry-proto` messages into
plain `Span` records that a test can assert on.

Run it around a `gateway serve` whose OTEL_EXPORTER_OTLP_ENDPOINT is its `endpoint`
(`Receiver.env()` gives the variables, with a short batch delay so spans arrive within
a fraction of a second).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from tests.support.net import free_port
from tests.support.waiting import wait_until

# Span kinds by their OTLP number, named as the SDK names them.
KINDS = {
    ProtoSpan.SPAN_KIND_INTERNAL: "INTERNAL",
    ProtoSpan.SPAN_KIND_SERVER: "SERVER",
    ProtoSpan.SPAN_KIND_CLIENT: "CLIENT",
    ProtoSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    ProtoSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str


@dataclass(frozen=True)
class Span:
    """One received span, ids as lower-case hex (parent_id "" for a root)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[Link] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    error: bool = False
    ok: bool = False  # its status set OK (neither is: unset)
    start_ns: int = 0  # since the Unix epoch
    end_ns: int = 0

    @property
    def traceparent(self) -> str:
        """The W3C traceparent naming this span (sampled)."""
        return f"00-{self.trace_id}-{self.span_id}-01"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[Span]:
    """The spans of one ExportTraceServiceRequest."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Span(
                        name=span.name,
                        kind=KINDS[span.kind],
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        attributes=_attributes(span.attributes),
                        resource=resource,
                        links=[Link(lk.trace_id.hex(), lk.span_id.hex()) for lk in span.links],
                        events=[event.name for event in span.events],
                        error=span.status.code == span.status.STATUS_CODE_ERROR,
                        ok=span.status.code == span.status.STATUS_CODE_OK,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


class Receiver:
    """The spans received so far, in order of arrival. Used on the test's event loop."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.spans: list[Span] = []
        self.requests = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **variables: str) -> dict[str, str]:
        """The OTEL_* variables of a gateway that exports to this receiver."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans arrive soon after they end
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            **variables,
        }

    async def _traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        self.spans.extend(decode(await request.read()))
        self.requests += 1
        answer = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    def where(self, test: Callable[[Span], bool]) -> list[Span]:
        return [s for s in self.spans if test(s)]

    async def wait_for(
        self, test: Callable[[Span], bool], count: int = 1, within: float = 10
    ) -> list[Span]:
        """The spans that pass `test`, once there are at least `count` of them."""
        await wait_until(lambda: len(self.where(test)) >= count, within, f"{count} span(s)")
        return self.where(test)


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """A Receiver listening on a free loopback port while the block runs."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    got = Receiver(free_port())
    app.router.add_post("/v1/traces", got._traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", got.port)
    await site.start()
    try:
        yield got
    finally:
        await runner.cleanup()
        await asyncio.sleep(0)
