"""How a task's trace context travels through this client: into an enqueue as W3C
`traceparent` and `tracestate` headers (`request_headers`), and out to a command that
`gateway work` runs as `TRACEPARENT` and `TRACESTATE` environment variables
(`command_environment`), OpenTelemetry's carrier for a process's environment.

OpenTelemetry stays optional. Without it (`claim-gateway-client[otel]` installs its
API), an enqueue carries only the context its caller gives, and a command still gets
its task's. With it, an enqueue that is given none carries the context of the span
active in the caller, as the global propagator writes it, so that a traced producer
needs no code of its own. Its package is imported at the first enqueue that could use
it, never when this module is, and an import that fails is not tried again.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, MutableMapping

from ..models import Task, TraceContext

# OpenTelemetry's environment-variable carrier: the names a traced program reads its
# parent's context from (see the OpenTelemetry specification, "Environment Variables
# as Context Propagation Carriers").
TRACEPARENT_ENV = "TRACEPARENT"
TRACESTATE_ENV = "TRACESTATE"
TRACE_ENV = (TRACEPARENT_ENV, TRACESTATE_ENV)

Inject = Callable[[MutableMapping[str, str]], None]

# The consumer span the worker loop runs a handler in (spans.py), as (task id, its W3C
# context): set in the handler's own asyncio task, so that tasks run side by side never
# see each other's.
_consumer: contextvars.ContextVar[tuple[str, TraceContext | None] | None] = contextvars.ContextVar(
    "gateway_client_consumer", default=None
)


def request_headers(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """The trace headers of one enqueue (computed once, so that its retries carry the
    same): the context given, if any (`tracestate` is sent only beside a
    `traceparent`, as W3C Trace Context has it); else the active span's, when
    OpenTelemetry is installed; else none."""
    if traceparent is not None:
        return TraceContext(traceparent, tracestate).to_json()
    inject = _otel_inject()
    if inject is None:
        return {}
    carrier: dict[str, str] = {}
    # Writes nothing when no span is active, or its context is invalid: the enqueue then
    # goes without, as it would without OpenTelemetry.
    inject(carrier)
    return carrier


@contextlib.contextmanager
def consumer_context(task_id: str, context: TraceContext | None) -> Iterator[None]:
    """Within it, `task_context` of the task `task_id` is the consumer span's `context`
    (when it is valid, else the task's stored one)."""
    token = _consumer.set((task_id, context))
    try:
        yield
    finally:
        _consumer.reset(token)


def task_context(task: Task) -> TraceContext | None:
    """The context that the work done for `task` continues: its consumer span's, when
    the worker loop runs the caller inside one for this very task, else the task's
    stored context (`task.trace`), as without OpenTelemetry."""
    current = _consumer.get()
    if current is not None and current[0] == task.id and current[1] is not None:
        return current[1]
    return task.trace


def command_environment(env: MutableMapping[str, str], trace: TraceContext | None) -> None:
    """Puts a task's context into the environment of the command that runs it, in place.
    A context already there (the worker's own, inherited from whatever started it) is
    removed first: it is not the task's, and a command that continued it would put its
    spans into an unrelated trace."""
    for name in TRACE_ENV:
        env.pop(name, None)
    if trace is None:
        return
    env[TRACEPARENT_ENV] = trace.traceparent
    if trace.tracestate:
        env[TRACESTATE_ENV] = trace.tracestate


@functools.cache
def _otel_inject() -> Inject | None:
    """OpenTelemetry's `propagate.inject`, or None when its API is not installed. Once
    per process: a failed import costs a search of the whole path each time."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    inject: Inject = propagate.inject
    return inject
