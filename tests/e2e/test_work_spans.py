"""`gateway work` as a real process against a real gateway, with OTEL_* asking for
export: its consumer spans reach an OTLP/HTTP receiver (which decodes the real protobuf
with opentelemetry-proto), each a child of its task's stored context, and each command's
TRACEPARENT names its own consumer span. With the SDK disabled, nothing is sent."""

from __future__ import annotations

import asyncio
import signal

import pytest

from gateway_client import AsyncClient
from tests.support.gateways import TOKEN, make_settings, running_gateway, work
from tests.support.otlp import receiver


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
    own_database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    parents = [f"00-{n + 1:032x}-{n + 1:016x}-01" for n in range(8)]
    async with (
        receiver() as got,
        running_gateway(settings) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        sent = [await client.enqueue(runtime_id, {"n": n}, traceparent=p, tracestate="k=v")
                for n, p in enumerate(parents)]  # fmt: skip
        untraced = await client.enqueue(runtime_id, {"n": 8})
        await run_tasks(gw.url, runtime_id, client, {"OTEL_EXPORTER_OTLP_ENDPOINT": got.endpoint})
        results = {t.id: t.result async for t in client.iter_tasks(runtime_id)}
        await got.wait_for(lambda s: True, 9)

    consumers = {s.attributes["messaging.message.id"]: s for s in got.spans}
    assert len(consumers) == len(got.spans) == 9
    for n, task in enumerate([*sent, untraced]):
        span = consumers[task.id]
        assert span.resource["service.name"] == "gateway-work"
        assert span.name == f"process {runtime_id}"
        assert span.kind == "CONSUMER"
        assert span.attributes | {"messaging.client.id": "-"} == {
            "messaging.system": "claim-gateway",
            "messaging.operation.type": "process",
            "messaging.destination.name": runtime_id,
            "messaging.message.id": task.id,
            "messaging.client.id": "-",
            "messaging.claim_gateway.attempt": 1,
            "messaging.claim_gateway.outcome": "completed",
            "messaging.claim_gateway.status": "completed",
        }
        assert span.ok
        if task is untraced:
            assert span.parent_id == ""  # a trace of its own
        else:
            assert span.trace_id == f"{n + 1:032x}" and span.parent_id == f"{n + 1:016x}"
        # The command's context is its own consumer span's, never a neighbour's.
        command_saw = results[task.id]
        _, *ids, flags = command_saw["traceparent"].split("-")
        assert ids == [span.trace_id, span.span_id] and int(flags, 16) & 1  # sampled
        assert command_saw["tracestate"] == (None if task is untraced else "k=v")


async def test_gateway_work_exports_nothing_when_the_sdk_is_disabled(
    own_database_url, redis_url, redis_prefix, runtime_id
):
    """An endpoint set, but OTEL_SDK_DISABLED=true: no span is sent, and the command
    gets the task's stored context, as without OpenTelemetry."""
    settings = make_settings(own_database_url, redis_url, redis_prefix)
    parent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    async with (
        receiver() as got,
        running_gateway(settings) as gw,
        AsyncClient(gw.url, TOKEN) as client,
    ):
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": got.endpoint, "OTEL_SDK_DISABLED": "true"}
        task = await client.enqueue(runtime_id, {"n": 1}, traceparent=parent)
        await run_tasks(gw.url, runtime_id, client, environ)
        result = (await client.get(task.id)).result
    assert result["traceparent"] == parent
    assert got.spans == [] and got.requests == 0
