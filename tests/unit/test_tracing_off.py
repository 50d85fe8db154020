"""Tracing is off unless the OTEL_* variables ask for it, and off it costs nothing: no
module of OpenTelemetry is imported, `tracing.active` stays None (the one attribute a
request reads), and an enqueue stores the producer's own context exactly as sent."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gateway import tracing
from gateway.api.requests import EnqueueRequest
from gateway.api.trace import TraceContext
from gateway.http.handlers.sending import Sending
from gateway.metrics import Metrics
from gateway.rows import TaskRow
from gateway.tracing import setup

ENDPOINT = "http://collector:4318"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ENDPOINT + "/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "None"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ],
)
def test_only_an_endpoint_asks_for_traces(env: dict[str, str], on: bool) -> None:
    assert setup.requested(env) is on


def test_without_the_variables_nothing_of_opentelemetry_is_loaded() -> None:
    # A process of its own: this one's other tests may have imported the SDK. It serves
    # an enqueue and a claim through the real app (with no database: their answers are
    # errors, and every request still passes the access log and its tracing check).
    script = """
import asyncio, os, sys
for name in [n for n in os.environ if n.startswith("OTEL_")]:
    del os.environ[name]
from gateway import tracing
from gateway.http.access import RequestLog
from gateway.http.handlers.sending import Sending
from gateway.api.requests import EnqueueRequest
from gateway.metrics import Metrics
from gateway.tracing import setup

assert setup.start() is False and tracing.active is None

async def answer(scope, receive, send):
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})

async def main():
    log = RequestLog(answer, Metrics())
    sent = []
    async def send(message):
        sent.append(message)
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    scope = {"type": "http", "method": "POST", "path": "/v1/runtimes/rt/tasks", "headers": [
        (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]}
    await log(scope, receive, send)
    assert sent[0]["status"] == 204
asyncio.run(main())
Sending("rt", [EnqueueRequest("1", 0, 1, None, None, None, None, "")], None).sent(["id"])
setup.stop()
loaded = sorted(n for n in sys.modules if n.startswith("opentelemetry"))
assert loaded == [], loaded
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_off_an_enqueue_stores_the_producers_own_context() -> None:
    assert tracing.active is None
    headers = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1")
    plain = EnqueueRequest("1", 0, 1, None, None, None, None, "")
    own = plain._replace(trace_parent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    sending = Sending("rt", [plain, own], headers)
    assert [(r.trace_parent, r.trace_state) for r in sending.requests] == [
        (headers.traceparent, headers.tracestate),
        (own.trace_parent, None),
    ]
    assert sending.spans == []


def test_off_a_claim_delay_has_no_exemplar_even_in_openmetrics() -> None:
    assert tracing.active is None
    metrics = Metrics()
    for traceparent in (None, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"):
        metrics.observe_claim_delay(claimed(traceparent), 30.0)
    body, content_type = metrics.render("application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert b"gateway_claim_delay_seconds_count 2.0" in body
    assert b"trace_id" not in body


def claimed(traceparent: str | None) -> TaskRow:
    """A task leased now for 30 s, due a second ago, with this stored context."""
    now = datetime.now(UTC)
    return TaskRow(
        id=uuid.uuid4(), runtime_id="rt", status="claimed", priority=50, payload=1,
        attempts=1, max_attempts=5, run_at=now - timedelta(seconds=1), expires_at=None,
        created_at=now, updated_at=now, lease_id=uuid.uuid4(),
        lease_expires_at=now + timedelta(seconds=30), worker_id="w",
        cancel_requested=False, result=None, last_error=None, trace_parent=traceparent,
    )  # fmt: skip
