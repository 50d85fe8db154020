"""One trace from a producer to a daemon's command, with every part real: a producer
traced with the OpenTelemetry SDK enqueues through the Python client (which carries
its span's context); a `gateway serve` exports its own spans over OTLP/HTTP; `gateway
work` runs the task, exporting its consumer span; and the command, a Python program
using the SDK, reads TRACEPARENT and makes a child span. A receiver decodes what the
two processes and the command send (tests/support/otlp.py), and the test follows one
trace id through all of it, parent by parent: the gateway's spans of the task's wait,
its lease with the worker's heartbeats, and the producer's wait for the result too.
The picture of that trace in docs/guides/tracing.md is drawn from this run
(tests/support/trace_picture.py): `DOCS_PICTURES=write` writes it again."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway_client import AsyncClient
from tests.support import trace_picture
from tests.support.gateways import TOKEN, serve_env, serve_process, work
from tests.support.otlp import receiver

PICTURE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "task-trace.svg"

pytestmark = pytest.mark.integration


@pytest.mark.timeout(90)
async def test_one_trace_runs_from_the_producer_through_the_gateway_to_the_command(
    database_url, redis_url, redis_prefix, runtime_id
):
    rt = runtime_id
    produced = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "a-producer"}))
    provider.add_span_processor(SimpleSpanProcessor(produced))
    async with receiver() as spans:
        # Batched: its exporter posts from a thread of its own. A simple processor would
        # post from this event loop's thread, which serves the receiver too, and wait
        # out the exporter's timeout (10 s) for an answer that loop cannot give.
        exporter = OTLPSpanExporter(endpoint=f"{spans.endpoint}/v1/traces")
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
        env = serve_env(database_url, redis_url, redis_prefix, **spans.env())
        async with serve_process(env=env) as (_, base), AsyncClient(base, TOKEN) as client:
            tracer = provider.get_tracer("a-producer")
            with tracer.start_as_current_span("produce", kind=SpanKind.PRODUCER):
                # It runs 2.2 s on a 3 s lease: the worker heartbeats it twice.
                task = await client.enqueue(rt, {"n": 1, "trace_child": True, "sleep": 2.2})
            environ = spans.env(OTEL_SERVICE_NAME="gateway-work")
            async with work(base, rt, "--lease-seconds", "3", environ=environ) as proc:
                assert (await client.wait(task.id, timeout_seconds=30)).status == "completed"
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 15) == 0
            command = await spans.wait_for(lambda s: s.name == "command work")
            await spans.wait_for(lambda s: s.name == "produce")
            # Written after their answers: the result wait's, and the lease's.
            await spans.wait_for(lambda s: s.name in (f"result wait {rt}", f"lease {rt}"), 2)
    [produce] = produced.get_finished_spans()
    trace_id = f"{produce.context.trace_id:032x}"
    producer_id = f"{produce.context.span_id:016x}"
    ours = {s.span_id: s for s in spans.where(lambda s: s.trace_id == trace_id)}

    def only(name: str, kind: str) -> object:
        found = [s for s in ours.values() if s.name == name and s.kind == kind]
        assert len(found) == 1, (name, kind, sorted((s.name, s.kind) for s in ours.values()))
        return found[0]

    server = only("POST /v1/runtimes/{rt}/tasks", "SERVER")
    send = only(f"send {rt}", "PRODUCER")
    consume = only(f"process {rt}", "CONSUMER")
    [run] = command
    assert server.parent_id == producer_id  # the producer's span, in another process
    assert send.parent_id == server.span_id
    # The task stores the gateway's producer span (the flags aside: the SDK sets its
    # random-trace bit).
    assert task.trace is not None
    assert task.trace.traceparent.split("-")[1:3] == [trace_id, send.span_id]
    assert consume.parent_id == send.span_id
    assert consume.resource["service.name"] == "gateway-work"
    assert consume.attributes["messaging.message.id"] == task.id
    assert run.trace_id == trace_id and run.parent_id == consume.span_id
    assert run.resource["service.name"] == "the-command"
    # The claim that handed it out is a trace of its own, linked to the task's span.
    [receive] = spans.where(lambda s: s.name == f"receive {rt}")
    assert (trace_id, send.span_id) in {(lk.trace_id, lk.span_id) for lk in receive.links}
    # The gateway's own spans of the task's life, all in the producer's trace.
    queued = only(f"queued {rt}", "INTERNAL")
    lease = only(f"lease {rt}", "CONSUMER")
    waited = only(f"result wait {rt}", "INTERNAL")
    assert queued.parent_id == lease.parent_id == waited.parent_id == send.span_id
    assert lease.attributes["claim_gateway.outcome"] == "completed"
    beats = [s for s in ours.values() if s.name == f"heartbeat {rt}"]
    assert beats and all(b.parent_id == lease.span_id for b in beats), beats
    assert queued.end_ns <= consume.start_ns and consume.end_ns >= lease.end_ns

    picture = trace_picture.render(
        list(ours.values()), "One task's trace: producer, gateway, worker and command"
    )
    assert all(s.name in picture for s in ours.values())
    if os.environ.get("DOCS_PICTURES") == "write":
        PICTURE.write_text(picture)
