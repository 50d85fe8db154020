"""With GATEWAY_LOG_FORMAT=json and tracing on, a line written inside a span carries
its trace_id and span_id, and one written outside any span neither; with tracing off,
no line carries them. The spans are the real SDK's (no exporter: nothing leaves)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gateway import tracing
from gateway.logs import JsonFormatter
from gateway.tracing.spans import Spans


@pytest.fixture
def spans() -> Iterator[Spans]:
    assert tracing.active is None
    provider = TracerProvider()
    tracing.active = Spans(provider.get_tracer("test"))
    try:
        yield tracing.active
    finally:
        tracing.active = None
        provider.shutdown()


def line(**extra: object) -> dict[str, object]:
    record = logging.makeLogRecord({"name": "gateway", "levelname": "INFO", "msg": "hi", **extra})
    return dict(json.loads(JsonFormatter().format(record)))


def test_a_line_inside_a_span_names_it(spans: Spans) -> None:
    with spans.tracer.start_as_current_span("request") as span:
        context = span.get_span_context()
        written = line()
    assert written["trace_id"] == f"{context.trace_id:032x}"
    assert written["span_id"] == f"{context.span_id:016x}"
    assert "trace_id" not in line() and "span_id" not in line()


def test_ids_given_with_the_line_win(spans: Spans) -> None:
    # The access log's: taken when its line was queued, formatted on another thread.
    with spans.tracer.start_as_current_span("request"):
        written = line(trace_id="a" * 32, span_id="b" * 16)
    assert (written["trace_id"], written["span_id"]) == ("a" * 32, "b" * 16)


def test_with_tracing_off_no_line_carries_ids() -> None:
    assert tracing.active is None
    provider = TracerProvider()
    try:
        with provider.get_tracer("test").start_as_current_span("someone else's"):
            written = line()
    finally:
        provider.shutdown()
    assert "trace_id" not in written and "span_id" not in written
