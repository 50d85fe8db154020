"""The worker loop's consumer spans, recorded by the real OpenTelemetry SDK (into its
InMemorySpanExporter) against the in-memory gateway: the parent on a first attempt and
a link on a retry, the attributes, the outcome, heartbeats and a cancel as events, a
handler's own spans as children, and a command's TRACEPARENT naming the consumer span,
which a Python command under the SDK continues."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from gateway_client import Task, TaskFailed, TraceContext, Worker
from gateway_client.command import CommandHandler
from gateway_client.runs import Outcome
from tests.support.ci import unavailable
from tests.support.fake_gateway import FakeGateway, make_task, run_until, worker

REPO_ROOT = Path(__file__).resolve().parents[3]  # for `tests.support` in a subprocess
TASKS = 100
STORED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STORED_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
STORED_SPAN_ID = 0x00F067AA0BA902B7


@dataclass
class Recorded:
    """A tracer provider of the SDK's own (the global one is left alone) and the spans
    it has ended."""

    provider: Any
    exporter: Any

    def spans(self, name: str | None = None) -> list[Any]:
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]

    def consumer(self, task_id: str) -> Any:
        [span] = [
            s for s in self.spans("process rt") if s.attributes["messaging.message.id"] == task_id
        ]
        return span


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        unavailable(
            "the OpenTelemetry SDK is not installed",
            "it is in the dev extra: pip install -e '.[dev]'",
        )
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield Recorded(provider, exporter)
    provider.shutdown()


def traced(payload: Any = None, parent: str = STORED, attempts: int = 0) -> Task:
    """A queued task with a stored context; `attempts` claims before (0: never)."""
    return replace(make_task(payload), trace=TraceContext(parent, "k=v"), attempts=attempts)


def parent_of(n: int) -> str:
    return f"00-{n + 1:032x}-{n + 1:016x}-01"


async def test_a_first_attempt_is_a_child_of_the_task_s_context_and_so_are_its_handler_s_spans(
    recorded: Recorded,
):
    fake = FakeGateway()
    task = traced({"n": 1})
    fake.queue.append(task)
    tracer = recorded.provider.get_tracer("handler")

    async def handler(task: Task) -> str:
        with tracer.start_as_current_span("inner"):
            return "ok"

    w = worker(fake, handler, tracer_provider=recorded.provider)
    await run_until(w, lambda: len(fake.named("complete")) == 1)

    from opentelemetry.trace import SpanKind, StatusCode

    span = recorded.consumer(task.id)
    assert span.kind is SpanKind.CONSUMER
    assert span.context.trace_id == STORED_TRACE_ID
    assert span.parent is not None and span.parent.span_id == STORED_SPAN_ID
    assert span.parent.is_remote and not span.links
    assert dict(span.attributes) == {
        "messaging.system": "claim-gateway",
        "messaging.operation.type": "process",
        "messaging.destination.name": "rt",
        "messaging.message.id": task.id,
        "messaging.client.id": "w",
        "messaging.claim_gateway.attempt": 1,
        "messaging.claim_gateway.outcome": "completed",
        "messaging.claim_gateway.status": "completed",
    }
    assert span.status.status_code is StatusCode.OK
    [inner] = recorded.spans("inner")
    assert inner.parent.span_id == span.context.span_id
    assert inner.context.trace_id == STORED_TRACE_ID
    # It ends once the report is answered, after the handler's own span.
    assert span.end_time >= inner.end_time


async def test_a_retry_starts_a_trace_of_its_own_linked_to_the_task_s_context(
    recorded: Recorded,
):
    fake = FakeGateway()
    task = traced(attempts=2)
    fake.queue.append(task)

    async def handler(task: Task) -> None:
        return None

    w = worker(fake, handler, tracer_provider=recorded.provider)
    await run_until(w, lambda: len(fake.named("complete")) == 1)

    span = recorded.consumer(task.id)
    assert span.parent is None
    assert span.context.trace_id != STORED_TRACE_ID
    [link] = span.links
    assert (link.context.trace_id, link.context.span_id) == (STORED_TRACE_ID, STORED_SPAN_ID)
    assert span.attributes["messaging.claim_gateway.attempt"] == 3


async def test_a_task_without_a_context_is_a_root_even_inside_the_worker_s_own_span(
    recorded: Recorded,
):
    fake = FakeGateway()
    [task] = fake.add(1)

    async def handler(task: Task) -> None:
        return None

    w = worker(fake, handler, tracer_provider=recorded.provider)
    with recorded.provider.get_tracer("app").start_as_current_span("the worker's own"):
        await run_until(w, lambda: len(fake.named("complete")) == 1)
    span = recorded.consumer(task.id)
    assert span.parent is None and not span.links


async def test_a_failed_handler_ends_its_span_in_error_with_the_exception(recorded: Recorded):
    from opentelemetry.trace import StatusCode

    fake = FakeGateway()
    crash, refusal, silent = fake.add("crash", "refuse", "silent")

    async def handler(task: Task) -> None:
        if task.payload == "crash":
            raise ValueError("the disk is full")
        raise TaskFailed("bad input" if task.payload == "refuse" else "", retry=False)

    w = worker(fake, handler, tracer_provider=recorded.provider)
    await run_until(w, lambda: len(fake.named("fail")) == 3)

    crashed = recorded.consumer(crash.id)
    assert crashed.status.status_code is StatusCode.ERROR
    assert "the disk is full" in (crashed.status.description or "")
    [exception] = [e for e in crashed.events if e.name == "exception"]
    assert exception.attributes["exception.type"] == "ValueError"
    assert crashed.attributes["messaging.claim_gateway.outcome"] == "failed"
    assert crashed.attributes["messaging.claim_gateway.status"] == "queued"
    refused = recorded.consumer(refusal.id)
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description == "bad input"
    assert refused.attributes["messaging.claim_gateway.status"] == "dead"
    assert recorded.consumer(silent.id).status.description == "failed"  # an empty error


@pytest.mark.parametrize("concurrency", [1, 2])  # a heartbeat each, or all in one request
async def test_heartbeats_and_a_cancel_are_events_and_a_cancelled_task_is_no_error(
    recorded: Recorded, concurrency: int
):
    from opentelemetry.trace import StatusCode

    fake = FakeGateway()
    task = traced("long")
    fake.queue.append(task)
    stopped = asyncio.Event()

    async def handler(task: Task) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    w = worker(
        fake, handler, lease_seconds=1, concurrency=concurrency, tracer_provider=recorded.provider
    )
    job = asyncio.create_task(w.run())
    await asyncio.sleep(0.4)  # a heartbeat each third of a second
    fake.cancelled.add(task.id)
    await asyncio.wait_for(stopped.wait(), 2)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert w.outcomes == {Outcome.CANCELLED: 1}

    span = recorded.consumer(task.id)
    names = [e.name for e in span.events]
    assert names[0] == "heartbeat" and "cancel_requested" in names
    assert span.events[0].attributes["messaging.claim_gateway.lease_seconds"] == 1
    assert span.attributes["messaging.claim_gateway.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET


async def test_a_hundred_tasks_of_a_hundred_traces_claimed_at_once_each_get_their_own_span(
    recorded: Recorded,
):
    """Each consumer span's parent is its own task's context, and each command's
    TRACEPARENT is its own consumer span, never a neighbour's."""
    fake = FakeGateway()
    tasks = [traced(n, parent_of(n)) for n in range(TASKS)]
    fake.queue.extend(tasks)
    handler = CommandHandler(["sh", "-c", 'printf "%s|%s" "$TRACEPARENT" "$TRACESTATE"'])
    w = worker(
        fake,
        handler,
        concurrency=TASKS,
        max_tasks_per_poll=TASKS,
        tracer_provider=recorded.provider,
    )
    await run_until(w, lambda: len(fake.named("complete")) == TASKS, within=20)

    assert fake.named("claim")[0].args["max_tasks"] == TASKS
    printed = {c.args["task_id"]: c.args["result"]["stdout"] for c in fake.named("complete")}
    for n, task in enumerate(tasks):
        span = recorded.consumer(task.id)
        assert span.parent.span_id == n + 1 and span.context.trace_id == n + 1
        ctx = span.context
        assert printed[task.id] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01|k=v"


# A command under the OpenTelemetry SDK that continues the context in its environment,
# as the client's README shows, and prints its span's ids.
COMMAND = """
import json, os
from opentelemetry.propagate import extract
from opentelemetry.sdk.trace import TracerProvider

carrier = {n.lower(): os.environ[n] for n in ("TRACEPARENT", "TRACESTATE") if n in os.environ}
tracer = TracerProvider().get_tracer("command")
with tracer.start_as_current_span("step", context=extract(carrier)) as span:
    print(json.dumps({
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent_id": span.parent.span_id if span.parent else None,
    }))
"""


async def test_a_python_command_under_the_sdk_makes_a_child_of_the_consumer_span(
    recorded: Recorded,
):
    fake = FakeGateway()
    task = traced()
    fake.queue.append(task)
    w = worker(
        fake, CommandHandler([sys.executable, "-c", COMMAND]), tracer_provider=recorded.provider
    )
    await run_until(w, lambda: len(fake.named("complete")) == 1, within=20)

    [completed] = fake.named("complete")
    span = recorded.consumer(task.id)
    assert completed.args["result"]["parent_id"] == span.context.span_id
    assert completed.args["result"]["trace_id"] == STORED_TRACE_ID


def test_without_a_tracer_provider_the_command_gets_the_task_s_own_context():
    """OpenTelemetry installed, but the application set no provider: no span is made,
    and a command gets its task's stored context, as without OpenTelemetry."""
    check = f"""
import asyncio
from dataclasses import replace
from gateway_client import TraceContext
from gateway_client.tracing import spans
from gateway_client.command import CommandHandler
from tests.support.fake_gateway import FakeGateway, make_task, run_until, worker
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

async def main():
    fake = FakeGateway()
    task = replace(make_task(), trace=TraceContext("{STORED}"))
    fake.queue.append(task)
    assert spans.start_consumer_span(task, "w") is None
    handler = CommandHandler(["sh", "-c", 'printf "%s" "$TRACEPARENT"'])
    await run_until(worker(fake, handler), lambda: fake.named("complete"))
    print(fake.named("complete")[0].args["result"]["stdout"])
    trace.set_tracer_provider(TracerProvider())
    assert spans.start_consumer_span(task, "w") is not None

asyncio.run(main())
"""
    ran = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == STORED


async def test_without_opentelemetry_no_span_is_made_and_the_command_gets_the_stored_context(
    recorded: Recorded, monkeypatch: pytest.MonkeyPatch
):
    """As where the package is not installed: its import fails, and even a provider
    handed to the worker records nothing."""
    from gateway_client.tracing import spans

    spans._otel.cache_clear()
    for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.context"):
        monkeypatch.setitem(sys.modules, name, None)
    try:
        fake = FakeGateway()
        task = traced()
        fake.queue.append(task)
        handler = CommandHandler(["sh", "-c", 'printf "%s" "$TRACEPARENT"'])
        w: Worker = worker(fake, handler, tracer_provider=recorded.provider)
        await run_until(w, lambda: len(fake.named("complete")) == 1)
    finally:
        spans._otel.cache_clear()
    assert fake.named("complete")[0].args["result"] == {"stdout": STORED}
    assert recorded.spans() == []
