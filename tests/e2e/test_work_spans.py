"""`gateway work` as a real process against a real gateway, with OTEL_* asking for
export: its consumer spans reach an OTLP/HTTP receiver (which decodes the real protobuf
with opentelemetry-proto), each a child of its task's stored context, and each command's
TRACEPARENT names its own consumer span. With the SDK disabled, nothing is sent."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gateway_client import AsyncClient
from tests.support.ci import unavailable
from tests.support.gateways import TOKEN, make_settings, running_gateway, work


@dataclass
class Receiver:
    """The spans an OTLP/HTTP exporter sent (`POST /v1/traces`), decoded, with the
    service name of the resource each came with."""

    url: str = ""
    spans: list[tuple[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    try:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )
    except ImportError:
        unavailable(
            "opentelemetry-proto is not installed",
            "the OTLP/HTTP exporter in the dev extra brings it: pip install -e '.[dev]'",
        )
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.paths.append(self.path)
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    got.spans.extend((service, s) for s in scope_spans.spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    got.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def attributes(span: Any) -> dict[str, Any]:
    out = {}
    for a in span.attributes:
        value = a.value
        out[a.key] = value.int_value if value.HasField("int_value") else value.string_value
    return out


async def run_tasks(url: str, runtime: str, client: AsyncClient, environ: dict[str, str]) -> None:
    """Runs `gateway work` until every task of `runtime` is completed, then SIGTERM."""
    async with work(url, runtime, "--concurrency", "4", environ=environ) as proc:
        async with asyncio.timeout(30):
            while True:
                stats = await client.stats(runtime)
                if stats.counts.get("completed", 0) == sum(stats.counts.values()):
                    break
                await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


@pytest.mark.timeout(60)
async def test_gateway_work_exports_a_consumer_span_per_task_that_its_command_continues(
    own_database_url, redis_url, redis_prefix, runtime_id, receiver: Receiver
):
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    parents = [f"00-{n + 1:032x}-{n + 1:016x}-01" for n in range(8)]
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        sent = [await client.enqueue(runtime_id, {"n": n}, traceparent=p, tracestate="k=v")
                for n, p in enumerate(parents)]  # fmt: skip
        untraced = await client.enqueue(runtime_id, {"n": 8})
        await run_tasks(gw.url, runtime_id, client, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        results = {t.id: t.result async for t in client.iter_tasks(runtime_id)}

    assert set(receiver.paths) == {"/v1/traces"}
    consumers = {attributes(s)["messaging.message.id"]: (svc, s) for svc, s in receiver.spans}
    assert len(consumers) == len(receiver.spans) == 9
    for n, task in enumerate([*sent, untraced]):
        service, span = consumers[task.id]
        assert service == "gateway-work"
        assert span.name == f"process {runtime_id}"
        assert span.kind == span.SPAN_KIND_CONSUMER
        assert attributes(span) | {"messaging.client.id": "-"} == {
            "messaging.system": "claim-gateway",
            "messaging.operation.type": "process",
            "messaging.destination.name": runtime_id,
            "messaging.message.id": task.id,
            "messaging.client.id": "-",
            "messaging.claim_gateway.attempt": 1,
            "messaging.claim_gateway.outcome": "completed",
            "messaging.claim_gateway.status": "completed",
        }
        assert span.status.code == span.status.STATUS_CODE_OK
        trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
        if task is untraced:
            assert span.parent_span_id == b""  # a trace of its own
        else:
            assert trace_id == f"{n + 1:032x}" and span.parent_span_id.hex() == f"{n + 1:016x}"
        # The command's context is its own consumer span's, never a neighbour's.
        command_saw = results[task.id]
        _, *ids, flags = command_saw["traceparent"].split("-")
        assert ids == [trace_id, span_id] and int(flags, 16) & 1  # sampled
        assert command_saw["tracestate"] == (None if task is untraced else "k=v")


async def test_gateway_work_exports_nothing_when_the_sdk_is_disabled(
    own_database_url, redis_url, redis_prefix, runtime_id, receiver: Receiver
):
    """An endpoint set, but OTEL_SDK_DISABLED=true: no span is sent, and the command
    gets the task's stored context, as without OpenTelemetry."""
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SDK_DISABLED": "true"}
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"n": 1}, traceparent=parent)
        await run_tasks(gw.url, runtime_id, client, environ)
        result = (await client.get(task.id)).result
    assert result["traceparent"] == parent
    assert receiver.spans == [] and receiver.paths == []
