"""The spans the gateway makes while tracing is on, with the attributes of
OpenTelemetry's semantic conventions (HTTP server spans, messaging spans).

- A SERVER span per HTTP request (`server_start`, `server_end`), a child of the
  request's `traceparent` header when it has one. It is the active span while the
  request is served, so that the spans made for it and its log lines name it.
- A PRODUCER span per enqueued task (`producer`, `sent`), a child of the request's
  server span, or of a batch item's own context when the item carries one. Its context
  is what the task stores, so that whoever claims the task continues from it.
- CLIENT spans for the claim path's calls (`client`): its Postgres statement and the
  Redis calls of its verdict. A call made for one claim request is a child of that
  request's server span; one made for several (the claim pump serves every poll parked
  for a runtime with one statement) links to each of them instead.
- An event on a parked poll's server span when a wake-up makes its pump claim again
  (`woken`), and a CONSUMER span per claim answer that hands tasks out (`received`),
  linked to each task's stored context.
- The task's own life, in its trace (children of its stored context, whichever
  instance serves each step): a `queued` span per attempt, from when the task was due
  to its claim (`received`); a `lease` span per attempt, from its claim to the
  complete, fail or release that ended it, or the janitor's reclaim of it when it
  lapsed (`lease_ended`); and inside that lease, a
  short span per heartbeat and per cancel request (`in_lease`); and a span per
  request that waited for its result (`result_waited`). A lease's span is
  written when the lease ends, on whichever instance ends it, with nothing stored for
  it: its start is read from the lease id (time-ordered, RFC 9562 version 7) and its
  span id is taken from the lease id's random bits (`lease_span_id`), so that a
  heartbeat served earlier by another instance already named it as its parent.

Imported by `setup.start` only: the rest of the gateway reaches it through
`gateway.tracing.active`, which is None while tracing is off. A `Spans` belongs to one
process and is used on its event loop's thread.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from ..rows import TaskRow

# The gateway speaks W3C Trace Context on the wire and in what a task stores
# (gateway/api/trace.py), whatever OTEL_PROPAGATORS says for other programs.
W3C = TraceContextTextMapPropagator()
MESSAGING_SYSTEM = "claim-gateway"  # messaging.system: this gateway is the queue

# The HTTP route of a request no endpoint's path matched (gateway/http/access.py's).
UNMATCHED = "unmatched"


class _AsgiHeaders(Getter[Sequence[tuple[bytes, bytes]]]):
    """Reads W3C headers straight from an ASGI scope's header list (lower-case names)."""

    def get(self, carrier: Sequence[tuple[bytes, bytes]], key: str) -> list[str] | None:
        name = key.encode("latin-1")
        found = [value.decode("latin-1") for header, value in carrier if header == name]
        return found or None

    def keys(self, carrier: Sequence[tuple[bytes, bytes]]) -> list[str]:
        return [header.decode("latin-1") for header, _ in carrier]


_HEADERS = _AsgiHeaders()


class ServerSpan:
    """A request's server span and the context token that made it the active span
    until `Spans.server_end`. Held by the request's middleware frame."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: Token[Context]) -> None:
        self.span = span
        self.token = token


class ChosenIds(RandomIdGenerator):
    """The SDK's random ids, but for a span id chosen for the next span started
    (`choose`, then `start_span` at once, on the same thread): a lease's span takes the
    id that its heartbeats named as their parent before it was written."""

    def __init__(self) -> None:
        self._next: int | None = None

    def choose(self, span_id: int) -> None:
        self._next = span_id

    def generate_span_id(self) -> int:
        chosen, self._next = self._next, None
        return chosen if chosen is not None else super().generate_span_id()


def lease_span_id(lease_id: uuid.UUID) -> int:
    """The span id of the lease `lease_id`'s span: its low 64 bits (random in every
    lease id the gateway makes), never the invalid id 0."""
    return lease_id.int & 0xFFFF_FFFF_FFFF_FFFF or 1


def lease_began_ns(lease_id: uuid.UUID) -> int | None:
    """When the lease began, in ns since the epoch, from its time-ordered id; None for
    a lease id that is not time-ordered (made before the gateway's ids were)."""
    if lease_id.version != 7:
        return None
    return (lease_id.int >> 80) * 1_000_000


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000) * 1000


class Spans:
    """The gateway's spans (module docstring), made with one tracer."""

    def __init__(self, tracer: trace.Tracer, ids: ChosenIds | None = None) -> None:
        self.tracer = tracer
        self.ids = ids

    # -- the server span of a request -------------------------------------------------

    def server_start(self, scope: Mapping[str, Any]) -> ServerSpan:
        """Start the request's server span, a child of its `traceparent` header (when
        well formed), and make it the active span. Named by its method until its route
        is known (`server_end`)."""
        headers = scope.get("headers", ())
        parent = W3C.extract(headers, getter=_HEADERS)
        method = str(scope.get("method", "_OTHER"))
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.scheme": str(scope.get("scheme", "http")),
        }
        host = _server_address(scope, headers)
        if host:
            attributes["server.address"] = host
        span = self.tracer.start_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return ServerSpan(span, token)

    def server_end(self, server: ServerSpan, method: str, route: str, status: int) -> None:
        """End the request's server span with its route template (never the raw path,
        whose ids would make every span's name its own) and status, and make the span
        that was active before it active again. A 5xx marks the span as an error (a 4xx
        is the client's, as the HTTP conventions say)."""
        span = server.span
        if route != UNMATCHED:
            span.update_name(f"{method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
            span.set_attribute("error.type", str(status))
        span.end()
        otel_context.detach(server.token)

    def batch_size(self, count: int) -> None:
        """Note on the active (server) span how many tasks one request's batch sent."""
        trace.get_current_span().set_attribute("messaging.batch.message_count", count)

    # -- a producer span per enqueued task --------------------------------------------

    def producer(
        self, runtime_id: str, own: tuple[str, str | None] | None = None
    ) -> tuple[Span, tuple[str, str | None] | None]:
        """Start the producer span of one task about to be enqueued for `runtime_id`,
        and return it with the context the task is to store (traceparent, tracestate):
        the span's own. Its parent is the active span (the request's), or `own`, the
        context a batch item or a body carries for itself, with a link to the request's
        span. End it with `sent` once the task's id is known, or `failed`."""
        parent: Context | None = None
        links: list[Link] = []
        if own is not None and (carried := stored_context(*own)) is not None:
            parent = child_of(carried)
            current = trace.get_current_span().get_span_context()
            if current.is_valid:
                links.append(Link(current))
        span = self.tracer.start_span(
            f"send {runtime_id}",
            context=parent,
            kind=SpanKind.PRODUCER,
            links=links,
            attributes={
                "messaging.system": MESSAGING_SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": runtime_id,
            },
        )
        stored: dict[str, str] = {}
        W3C.inject(stored, context=trace.set_span_in_context(span))
        if "traceparent" not in stored:  # no valid context to store: keep the producer's
            return span, own
        return span, (stored["traceparent"], stored.get("tracestate"))

    @staticmethod
    def sent(span: Span, task_id: object, created: bool = True) -> None:
        """End a producer span: its task was stored with id `task_id` (or, `created`
        false, an idempotent replay answered the task stored before)."""
        span.set_attribute("messaging.message.id", str(task_id))
        if not created:
            span.set_attribute("claim_gateway.idempotent_replay", True)
        span.end()

    @staticmethod
    def failed(spans: Iterable[Span], exc: BaseException) -> None:
        """End producer spans whose enqueue failed with `exc`."""
        for span in spans:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.set_attribute("error.type", type(exc).__name__)
            span.end()

    # -- the claim path ---------------------------------------------------------------

    @staticmethod
    def current_span() -> Span | None:
        """The active span (a claim request's server span), kept by its waiter so that
        the claim pump, which runs in a task of its own, can name the request."""
        span = trace.get_current_span()
        return span if span.get_span_context().is_valid else None

    @contextmanager
    def client(
        self,
        system: str,
        operation: str,
        target: str | None,
        requests: Sequence[Span],
        **attributes: Any,
    ) -> Iterator[Span]:
        """A CLIENT span around a call to `system` (postgresql, redis) made for the
        claim requests whose server spans are `requests`: a child of the one request's
        span, or, for several (or none), a root linked to each. The pump's task may
        carry the context of the request that started it, which is never the parent
        of a later call. An exception leaving the block is recorded on the span."""
        contexts = [span.get_span_context() for span in requests]
        links: list[Link] = []
        if len(contexts) == 1:
            parent = child_of(contexts[0])
        else:
            parent, links = Context(), [Link(context) for context in contexts]
        span = self.tracer.start_span(
            f"{operation} {target}" if target else operation,
            context=parent,
            kind=SpanKind.CLIENT,
            links=links,
            attributes={"db.system.name": system, "db.operation.name": operation, **attributes},
        )
        if target:
            span.set_attribute("db.collection.name", target)
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.set_attribute("error.type", type(exc).__name__)
            raise
        finally:
            span.end()

    @staticmethod
    def woken(request: Span, tasks: int, matched: bool = False) -> None:
        """The parked poll whose server span is `request` was woken: a wake-up made its
        pump claim again, handing it `tasks` tasks, or (`matched`) an enqueue wrote its
        task leased to it (sync match). An event on that span."""
        request.add_event(
            "claim_gateway.poll.woken",
            {"claim_gateway.tasks": tasks, "claim_gateway.sync_match": matched},
        )

    def received(self, runtime_id: str, tasks: Sequence[TaskRow]) -> None:
        """A claim answer hands out `tasks`: a CONSUMER span, a child of the request's
        server span, linked to each task's stored context (its producer span); and in
        each task's own trace, the `queued` span of this attempt, from when it was due
        (its run_at, or its creation when later) to its claim (its updated_at, which
        the claim set: the database's clock at both ends)."""
        links = []
        for task in tasks:
            stored = stored_context(task.trace_parent, task.trace_state)
            if stored is None:
                continue
            links.append(Link(stored))
            due = max(task.run_at, task.created_at)
            self.tracer.start_span(
                f"queued {runtime_id}",
                context=child_of(stored),
                start_time=_ns(due),
                attributes={
                    **_task_attributes(runtime_id, task.id),
                    "claim_gateway.attempt": task.attempts,
                },
            ).end(end_time=max(_ns(task.updated_at), _ns(due)))
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "receive",
            "messaging.operation.name": "receive",
            "messaging.destination.name": runtime_id,
            "messaging.batch.message_count": len(tasks),
        }
        if len(tasks) == 1:
            attributes["messaging.message.id"] = str(tasks[0].id)
        span = self.tracer.start_span(
            f"receive {runtime_id}", kind=SpanKind.CONSUMER, links=links, attributes=attributes
        )
        span.end()

    def result_waited(self, task: TaskRow, began_ns: int) -> None:
        """A request waited from `began_ns` (ns since the epoch) until now for the
        result of `task` (as it stands now: finished, or not when the wait ran out): a
        span in the task's trace, a child of its stored context, linked to the
        request's server span. Nothing for a task without a context."""
        stored = stored_context(task.trace_parent, task.trace_state)
        if stored is None:
            return
        request = trace.get_current_span().get_span_context()
        self.tracer.start_span(
            f"result wait {task.runtime_id}",
            context=child_of(stored),
            links=[Link(request)] if request.is_valid else [],
            start_time=began_ns,
            attributes={
                **_task_attributes(task.runtime_id, task.id),
                "claim_gateway.outcome": task.status,
            },
        ).end()

    # -- a lease, in its task's trace --------------------------------------------------

    def lease_ended(
        self,
        runtime_id: str,
        task_id: object,
        lease_id: uuid.UUID,
        operation: str,
        outcome: str,
        context: tuple[str | None, str | None],
        at_ns: int | None = None,
    ) -> None:
        """The lease `lease_id` of task `task_id` ended now (or at `at_ns`, in ns since
        the epoch) by `operation` (complete,
        fail, release, or expire: the janitor took it back), leaving the task
        `outcome` (its status: completed, queued or scheduled for a retry, dead,
        cancelled): its span, a child of the task's stored `context` (traceparent,
        tracestate), from the lease's start to now, with the id its heartbeats named
        (module docstring). Nothing for a task without a context."""
        stored = stored_context(*context)
        if stored is None:
            return
        now = time.time_ns() if at_ns is None else at_ns
        began = lease_began_ns(lease_id)
        if self.ids is not None:
            self.ids.choose(lease_span_id(lease_id))
        span = self.tracer.start_span(
            f"lease {runtime_id}",
            context=child_of(stored),
            kind=SpanKind.CONSUMER,
            start_time=min(began, now) if began is not None else now,
            attributes={
                **_task_attributes(runtime_id, task_id),
                "messaging.operation.type": "settle",
                "messaging.operation.name": operation,
                "claim_gateway.lease.id": str(lease_id),
                "claim_gateway.outcome": outcome,
            },
        )
        if outcome == "dead" or operation == "expire":  # its holder failed for good, or vanished
            span.set_status(
                Status(StatusCode.ERROR, "lease expired" if operation == "expire" else outcome)
            )
        span.end(end_time=now)

    def in_lease(
        self,
        name: str,
        runtime_id: str,
        task_id: object,
        lease_id: uuid.UUID,
        context: tuple[str | None, str | None],
        at_ns: int | None = None,
    ) -> None:
        """A moment inside the lease `lease_id` (a heartbeat, a cancel request), now or
        at `at_ns`: a short span named `name`, a child of the lease's span (which is
        written when the lease ends: `lease_ended`), in the task's trace."""
        stored = stored_context(*context)
        if stored is None:
            return
        lease = SpanContext(
            stored.trace_id,
            lease_span_id(lease_id),
            is_remote=True,
            trace_flags=stored.trace_flags,
            trace_state=stored.trace_state,
        )
        self.tracer.start_span(
            f"{name} {runtime_id}",
            context=child_of(lease),
            start_time=at_ns,
            attributes=_task_attributes(runtime_id, task_id),
        ).end(end_time=at_ns)

    # -- what log lines name ----------------------------------------------------------

    @staticmethod
    def current_ids() -> tuple[str, str] | None:
        """The active span's trace id and span id, as hex, or None outside any span."""
        context = trace.get_current_span().get_span_context()
        if not context.is_valid:
            return None
        return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def stored_context(traceparent: str | None, tracestate: str | None) -> SpanContext | None:
    """A task's stored trace context, when it has a valid one."""
    if traceparent is None:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = trace.get_current_span(W3C.extract(carrier)).get_span_context()
    return context if context.is_valid else None


def child_of(parent: SpanContext) -> Context:
    """A context whose span is `parent` (and nothing else of the current context), to
    start a child of it."""
    return trace.set_span_in_context(NonRecordingSpan(parent), Context())


def _task_attributes(runtime_id: str, task_id: object) -> dict[str, Any]:
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": runtime_id,
        "messaging.message.id": str(task_id),
    }


def _server_address(scope: Mapping[str, Any], headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The host the client asked for (its Host header, without the port), else the
    address the server listens on."""
    for name, value in headers:
        if name == b"host":
            host = value.decode("latin-1")
            if host.startswith("["):  # [v6]:port
                return host[1 : host.find("]")] if "]" in host else host
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    server = scope.get("server")
    return str(server[0]) if server else None
