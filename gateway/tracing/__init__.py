"""The gateway's own OpenTelemetry spans, exported over OTLP/HTTP when asked for.

Tracing is off unless the OpenTelemetry SDK is installed (`pip install
'claim-gateway[otel]'`) and the standard variables ask for it (`setup.requested`).
While it is off, `active` is None and the request path checks that one attribute and
does nothing else: no span objects, no contextvar is touched, and no module of
OpenTelemetry is even imported (the modules that use it are imported by `setup.start`
only).

While it is on, `active` is the process's `spans.Spans`, which the app's lifespan sets
at start and clears at exit (`setup.start`, `setup.stop`). The lifespan owns the tracer
provider behind it: it flushes the spans still queued before the process ends.

A task's stored trace context (gateway/api/trace.py) does not depend on this package:
with tracing off, an enqueue stores the producer's own context, as it always has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spans import Spans

# The process's spans while tracing is on, None while it is off: read once per
# request, as `tracing.active`, never imported by name (it changes at start and exit).
active: Spans | None = None
