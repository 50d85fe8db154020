"""A claimed task as the worker loop holds it, from its claim until its report is
answered: `Running` (the task, its handler's asyncio task, when it started in
monotonic seconds, why it was interrupted, if it was, and its consumer span, if any),
`Interrupt` (why a handler was cancelled; an event on the span too), `interrupt()`,
and `Outcome`, how a held task ended.

The `Worker` makes each `Running` and keeps it while the lease is held; the heartbeats
interrupt it, and the reports decide its outcome from its handler.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .models import Task

if TYPE_CHECKING:  # tracing/spans.py imports this module
    from .tracing.spans import ConsumerSpan


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # a cancel was requested; the task was released to end it
    RELEASED = "released"  # still running at shutdown; queued again
    LEASE_LOST = "lease_lost"  # nothing reported
    UNREPORTED = "unreported"  # the report kept failing; the lease will lapse


class Interrupt(enum.Enum):
    """Why a handler was cancelled."""

    CANCEL_REQUESTED = "cancel_requested"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


@dataclass
class Running:
    task: Task
    handler: asyncio.Task[Any]
    started: float  # time.monotonic() as its handler started
    interrupt: Interrupt | None = None
    # Its consumer span, when OpenTelemetry records one (tracing/spans.py); ended by the worker
    # loop once the report is answered.
    span: ConsumerSpan | None = None

    def event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """An event on its consumer span, if it has one."""
        if self.span is not None:
            self.span.event(name, attributes)


def interrupt(run: Running, why: Interrupt) -> None:
    """Cancels a running handler. A finished one's outcome is already decided and
    its report's answer says how the task ended, so it is left alone."""
    if run.handler.done():
        return
    if run.interrupt is None:
        run.interrupt = why
        run.event(why.value)  # "cancel_requested", "lease_lost" or "shutdown"
    run.handler.cancel()
