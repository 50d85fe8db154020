"""The gateway's own OpenTelemetry spans, exported over OTLP/HTTP when asked for.

Tracing is off unless the OpenTelemetry SDK is installed (`pip install
'claim-gateway[otel]'`) and the standard variables ask for it (`setup.requested`).
While it is off, `active` is None and the request path checks that one attribute and
does nothing else: no span objects, no contextvar is touched, and no module of
OpenTelemetry is even imported (the modules that use it are imported by `setup.start`
only).

The claim path wraps its calls in `client(...)`, which is a shared no-op while tracing
is off.

While it is on, `active` is the process's `spans.Spans`, which the app's lifespan sets
at start and clears at exit (`setup.start`, `setup.stop`). The lifespan owns the tracer
provider behind it: it flushes the spans still queued before the process ends.

A task's stored trace context (gateway/api/trace.py) does not depend on this package:
with tracing off, an enqueue stores the producer's own context, as it always has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .spans import Spans

# The process's spans while tracing is on, None while it is off: read once per
# request, as `tracing.active`, never imported by name (it changes at start and exit).
active: Spans | None = None

# What `client` gives while tracing is off: stateless, so one serves every call.
NO_SPAN: AbstractContextManager[Any] = contextlib.nullcontext()


class Traced(Protocol):
    """What a call is made for: a claim poll, with its request's server span or None."""

    trace: Any


def client(
    system: str, operation: str, target: str | None, made_for: Iterable[Traced], **attributes: Any
) -> AbstractContextManager[Any]:
    """A CLIENT span around a call to `system` made for the polls `made_for`
    (spans.Spans.client), yielding the span; while tracing is off, NO_SPAN, which
    yields None: one attribute read, and nothing made."""
    spans = active
    if spans is None:
        return NO_SPAN
    requests = [poll.trace for poll in made_for if poll.trace is not None]
    return spans.client(system, operation, target, requests, **attributes)
