"""A task's trace context in the client: read from the gateway's task objects, sent with
an enqueue as W3C `traceparent` and `tracestate` headers (given, or the active
OpenTelemetry span's), and in a batch as each item's own `trace`. The gateway here is a
small HTTP server that records what it is sent and answers as the real one does."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gateway_client import AsyncClient, Client, NewTask, Task, TraceContext
from gateway_client.tracing import propagation
from tests.support.ci import unavailable

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass
class Sent:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Recorder:
    """The requests received, and the address to send them to."""

    url: str = ""
    sent: list[Sent] = field(default_factory=list)

    def trace_headers(self, index: int = -1) -> dict[str, str]:
        got = self.sent[index].headers
        return {k: got[k] for k in ("traceparent", "tracestate") if k in got}


def _task_json(n: int, trace: dict[str, str] | None) -> dict[str, Any]:
    task: dict[str, Any] = {
        "id": f"task-{n}",
        "runtime_id": "rt",
        "status": "queued",
        "priority": 50,
        "payload": None,
        "attempts": 0,
        "max_attempts": 5,
    }
    if trace:
        task["trace"] = trace
    return task


@pytest.fixture
def gateway() -> Iterator[Recorder]:
    """Answers an enqueue (or a batch) with its task(s), each with the trace the gateway
    would store: the item's own, else the request's headers; only ids when the request
    asks for `return=minimal`."""
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorder.sent.append(Sent(self.path, headers, body))
            header_trace = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
            items = body["tasks"] if self.path.endswith(":batch") else [body]
            tasks = [
                _task_json(n, item.get("trace") or header_trace) for n, item in enumerate(items)
            ]
            if headers.get("prefer") == "return=minimal":
                tasks = [{"id": t["id"]} for t in tasks]
            answer = {"tasks": tasks} if self.path.endswith(":batch") else tasks[0]
            data = json.dumps(answer).encode()
            self.send_response(201)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def tracer() -> Any:
    """A tracer of the OpenTelemetry SDK, on a provider of its own (the global one is
    left alone); the global propagator is OpenTelemetry's default, W3C Trace Context."""
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        unavailable(
            "the OpenTelemetry SDK is not installed",
            "it is in the dev extra: pip install -e '.[dev]'",
        )
    return TracerProvider().get_tracer("tests")


def traceparent_of(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


# -- reading --------------------------------------------------------------------------


def test_a_task_s_trace_is_read_and_absent_when_the_gateway_sends_none() -> None:
    both = Task.from_json(_task_json(1, {"traceparent": PARENT, "tracestate": STATE}))
    assert both.trace == TraceContext(PARENT, STATE)
    assert Task.from_json(_task_json(2, {"traceparent": PARENT})).trace == TraceContext(PARENT)
    assert Task.from_json(_task_json(3, None)).trace is None
    # Nothing a tracer could continue: no traceparent.
    assert Task.from_json(_task_json(4, {"tracestate": STATE})).trace is None


def test_a_batch_item_carries_its_own_trace_and_others_none() -> None:
    traced = NewTask({"n": 1}, trace=TraceContext(PARENT, STATE)).to_json()
    assert traced["trace"] == {"traceparent": PARENT, "tracestate": STATE}
    assert NewTask(1, trace=TraceContext(PARENT)).to_json()["trace"] == {"traceparent": PARENT}
    assert "trace" not in NewTask(1).to_json()


# -- sending --------------------------------------------------------------------------


async def test_an_enqueue_sends_the_trace_it_is_given_and_none_otherwise(
    gateway: Recorder,
) -> None:
    async with AsyncClient(gateway.url) as gw:
        task = await gw.enqueue("rt", {"n": 1}, traceparent=PARENT, tracestate=STATE)
        assert gateway.trace_headers() == {"traceparent": PARENT, "tracestate": STATE}
        assert task.trace == TraceContext(PARENT, STATE)
        assert "trace" not in gateway.sent[-1].body  # a single enqueue: headers only
        task_id = await gw.enqueue("rt", 2, minimal=True, traceparent=PARENT)
        assert task_id == "task-0"
        assert gateway.trace_headers() == {"traceparent": PARENT}
        assert gateway.sent[-1].headers["prefer"] == "return=minimal"
        # A tracestate alone means nothing without the traceparent it belongs to.
        untraced = await gw.enqueue("rt", 3, tracestate=STATE)
        assert gateway.trace_headers() == {} and untraced.trace is None


async def test_a_batch_sends_each_item_s_own_trace(gateway: Recorder) -> None:
    items = [NewTask(1, trace=TraceContext(PARENT, STATE)), NewTask(2)]
    async with AsyncClient(gateway.url) as gw:
        tasks = await gw.enqueue_batch("rt", items)
        assert [t.get("trace") for t in gateway.sent[-1].body["tasks"]] == [
            {"traceparent": PARENT, "tracestate": STATE},
            None,
        ]
        assert gateway.trace_headers() == {}
        assert [t.trace for t in tasks] == [TraceContext(PARENT, STATE), None]


def test_the_blocking_client_sends_the_trace_it_is_given(gateway: Recorder) -> None:
    with Client(gateway.url) as gw:
        assert gw.enqueue("rt", 1, traceparent=OTHER).trace == TraceContext(OTHER)
        assert gateway.trace_headers() == {"traceparent": OTHER}
        assert gw.enqueue("rt", 1, minimal=True, traceparent=PARENT, tracestate=STATE)
        assert gateway.trace_headers() == {"traceparent": PARENT, "tracestate": STATE}


# -- OpenTelemetry --------------------------------------------------------------------


async def test_an_enqueue_in_an_active_span_carries_its_context(
    gateway: Recorder, tracer: Any
) -> None:
    async with AsyncClient(gateway.url) as gw:
        await gw.enqueue("rt", 1)
        assert gateway.trace_headers() == {}  # no span active: nothing to carry
        with tracer.start_as_current_span("produce") as span:
            task = await gw.enqueue("rt", 2)
            assert gateway.trace_headers() == {"traceparent": traceparent_of(span)}
            assert task.trace == TraceContext(traceparent_of(span))
            await gw.enqueue_batch("rt", [NewTask(3), NewTask(4, trace=TraceContext(OTHER))])
            assert gateway.trace_headers() == {"traceparent": traceparent_of(span)}
            assert gateway.sent[-1].body["tasks"][1]["trace"] == {"traceparent": OTHER}
            # The caller's own context wins over the span's.
            await gw.enqueue("rt", 5, traceparent=OTHER)
            assert gateway.trace_headers() == {"traceparent": OTHER}


def test_the_blocking_client_carries_the_span_active_at_each_call(
    gateway: Recorder, tracer: Any
) -> None:
    """Its event loop is its own, but the span is the caller's, at the time of the call
    (not at the client's first call, when its loop was made)."""
    with Client(gateway.url) as gw:
        gw.enqueue("rt", 1)
        assert gateway.trace_headers() == {}
        with tracer.start_as_current_span("first") as first:
            gw.enqueue("rt", 2)
            assert gateway.trace_headers() == {"traceparent": traceparent_of(first)}
        with tracer.start_as_current_span("second") as second:
            gw.enqueue_batch("rt", [NewTask(3)], minimal=True)
            assert gateway.trace_headers() == {"traceparent": traceparent_of(second)}


async def test_without_opentelemetry_an_enqueue_sends_no_context(
    gateway: Recorder, tracer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As where the package is not installed: its import fails, and a span that some
    other library keeps active is not looked for."""
    propagation._otel_inject.cache_clear()
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setitem(sys.modules, "opentelemetry.propagate", None)
    try:
        async with AsyncClient(gateway.url) as gw:
            with tracer.start_as_current_span("produce"):
                await gw.enqueue("rt", 1)
                assert gateway.trace_headers() == {}
                await gw.enqueue("rt", 2, traceparent=PARENT)
                assert gateway.trace_headers() == {"traceparent": PARENT}
    finally:
        propagation._otel_inject.cache_clear()


def test_importing_the_client_imports_no_opentelemetry() -> None:
    check = (
        "import sys, gateway_client, gateway_client.command, gateway_client.worker; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    found = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
