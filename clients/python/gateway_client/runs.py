"""A claimed task as the worker loop holds it, from its claim until its report is
answered: `Running` (the task, its handler's asyncio task, when it started in
monotonic seconds, and why it was interrupted, if it was), `Interrupt` (why a handler
was cancelled), `interrupt()`, and `Outcome`, how a held task ended.

The `Worker` makes each `Running` and keeps it while the lease is held; the heartbeats
interrupt it, and the reports decide its outcome from its handler.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from .models import Task


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


def interrupt(run: Running, why: Interrupt) -> None:
    """Cancels a running handler. A finished one's outcome is already decided and
    its report's answer says how the task ended, so it is left alone."""
    if run.handler.done():
        return
    if run.interrupt is None:
        run.interrupt = why
    run.handler.cancel()
