"""Consumer spans: the OpenTelemetry span the worker loop records for each task it runs,
from the claim until the task's report is answered (`ConsumerSpan`, made by
`start_consumer_span`).

- Recorded only when OpenTelemetry's API is installed and the application has set a
  tracer provider (or hands one to the `Worker`): this client never configures the SDK
  itself (`gateway work` does, for its own process: see export.py). Otherwise no
  span is made, and nothing of OpenTelemetry is imported until the first task.
- Kind CONSUMER, named `process {runtime}`, with the messaging semantic conventions'
  attributes (`messaging.system` "claim-gateway", `messaging.operation.type` "process",
  `messaging.destination.name` the runtime, `messaging.message.id` the task id,
  `messaging.client.id` the worker id) and the attempt
  (`messaging.claim_gateway.attempt`, 1 for the first claim).
- Its parent is the task's stored context (`Task.trace`) on the first attempt. A retry
  starts a trace of its own with a link to that context, so that one producer's trace
  does not grow by every retry's work and each attempt stays findable from it. A task
  without a context starts a trace of its own: never a child of whatever span the
  worker itself runs in, which is no task's.
- The handler runs inside it, so that the spans it makes are its children, and a
  command that `gateway work` runs gets its context as TRACEPARENT and TRACESTATE.
- Heartbeats, a requested cancel, a lost lease and a shutdown are events on it. It ends
  with the task's outcome (`messaging.claim_gateway.outcome`): status OK for a completed
  task, ERROR with the handler's exception for a failed one, ERROR for a lost lease or a
  report that never got through; a released or cancelled task leaves it unset.

The worker loop owns each `ConsumerSpan` (kept on its `Running`) and ends it once.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..failure import format_error
from ..models import Task, TraceContext
from ..runs import Outcome
from .propagation import consumer_context

SYSTEM = "claim-gateway"
TRACER_NAME = "gateway_client"
ATTEMPT = "messaging.claim_gateway.attempt"
OUTCOME = "messaging.claim_gateway.outcome"
STATUS = "messaging.claim_gateway.status"  # the task's status in the report's answer
STATUS_CHARS = 500  # of an error in the span's status description

# Outcomes that end a span in error besides a failed handler. A released or cancelled
# task was stopped from outside, which is no error of its work: its status stays unset.
_ERRORS = {
    Outcome.LEASE_LOST: "the lease was lost: another worker may run the task",
    Outcome.UNREPORTED: "the outcome could not be reported: the lease will lapse",
}


@dataclass(frozen=True)
class _Otel:
    """The parts of OpenTelemetry's API a consumer span needs."""

    trace: ModuleType
    context: ModuleType
    w3c: Any  # a TraceContextTextMapPropagator


@functools.cache
def _otel() -> _Otel | None:
    """OpenTelemetry's API, or None when it is not installed. Once per process: a failed
    import costs a search of the whole path each time."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return _Otel(trace, context, TraceContextTextMapPropagator())


class ConsumerSpan:
    """One task's consumer span. `context` is its W3C context, for a command to
    continue; None when the span has no valid context (a no-op tracer's retry)."""

    def __init__(self, otel: _Otel, span: Any, task_id: str) -> None:
        self._otel = otel
        self.span = span
        self.task_id = task_id
        self._ended = False
        carrier: dict[str, str] = {}
        otel.w3c.inject(carrier, context=otel.trace.set_span_in_context(span))
        self.context = (
            TraceContext(carrier["traceparent"], carrier.get("tracestate"))
            if "traceparent" in carrier
            else None
        )

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Makes this span the current one for the handler's code within (its asyncio
        task's context only), and its context the one `gateway work` gives a command."""
        use = self._otel.trace.use_span(
            self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )
        with use, consumer_context(self.task_id, self.context):
            yield

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        if not self._ended:
            self.span.add_event(name, attributes or {})

    def end(self, outcome: Outcome, status: str, error: BaseException | None = None) -> None:
        """Ends the span with the task's outcome; `status` is the task's in the gateway's
        answer ("-" when there was none), `error` the failed handler's exception.
        Idempotent: only the first call counts."""
        if self._ended:
            return
        self._ended = True
        span, codes = self.span, self._otel.trace.StatusCode
        span.set_attribute(OUTCOME, str(outcome))
        if status not in ("-", "unknown"):
            span.set_attribute(STATUS, status)
        if outcome is Outcome.COMPLETED:
            span.set_status(codes.OK)
        elif outcome is Outcome.FAILED:
            if error is not None:
                span.record_exception(error)
            # The first line of what the gateway is told ("exit code 4", "ValueError: …"):
            # the whole of it, traceback and all, is in the exception event.
            lines = format_error(error).splitlines() if error is not None else []
            span.set_status(codes.ERROR, (lines[0] if lines else "failed")[:STATUS_CHARS])
        elif outcome in _ERRORS:
            span.set_status(codes.ERROR, _ERRORS[outcome])
        span.end()


def start_consumer_span(
    task: Task, worker_id: str, tracer_provider: Any = None
) -> ConsumerSpan | None:
    """A started consumer span for `task`, or None when OpenTelemetry is not installed
    or no tracer provider is set (neither given nor set globally by the application).
    Starts no span in the caller's context: the handler enters it (`active`)."""
    otel = _otel()
    if otel is None:
        return None
    trace = otel.trace
    provider = tracer_provider or trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return None  # the application set none: recording is not ours to decide
    tracer = provider.get_tracer(TRACER_NAME)
    stored = otel.w3c.extract(task.trace.to_json() if task.trace else {}, otel.context.Context())
    stored_span = trace.get_current_span(stored).get_span_context()
    links = []
    # An empty context, not the current one: a span the worker itself runs in is no
    # task's, and must not become this one's parent.
    parent = otel.context.Context()
    if task.attempts <= 1:
        parent = stored
    elif stored_span.is_valid:
        links.append(trace.Link(stored_span))
    span = tracer.start_span(
        f"process {task.runtime_id}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": task.runtime_id,
            "messaging.message.id": task.id,
            "messaging.client.id": worker_id,
            ATTEMPT: task.attempts,
        },
    )
    return ConsumerSpan(otel, span, task.id)
