"""The spans of a task's leases while tracing is on (gateway/tracing/spans.py): each
lease's span when a complete, fail or release ends it, and a short span inside it per
heartbeat and per cancel request, all in the task's own trace.

A single-task operation has the task's row, and so its stored trace context, at hand.
A batch operation (tasks:complete, tasks:fail, tasks:heartbeat, the acknowledgements a
claim carries) answers per item without it: its spans are written after the answer,
from one read of those tasks' contexts, in a task of their own, so that no answer
waits for tracing. While tracing is off, every method returns at its first line.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import tracing
from ..errors import GatewayError
from ..rows import ItemResult, TaskRow
from .ports import TraceContexts

if TYPE_CHECKING:  # imported only while tracing is on (gateway/tracing/__init__.py)
    from ..tracing.spans import Spans

log = logging.getLogger("gateway.tracing")


class LeaseSpans:
    """Writes lease spans for one process; owned by the Gateway, closed with it."""

    def __init__(self, store: TraceContexts) -> None:
        self._store = store
        self._writes: set[asyncio.Task[None]] = set()

    def ended(self, row: TaskRow, lease_id: uuid.UUID, operation: str) -> None:
        """The lease `lease_id` of `row`'s task was ended now by `operation` (complete,
        fail, release), leaving it as `row` shows it."""
        spans = tracing.active
        if spans is not None and row.trace_parent is not None:
            spans.lease_ended(
                row.runtime_id,
                row.id,
                lease_id,
                operation,
                row.status,
                (row.trace_parent, row.trace_state),
            )

    def in_lease(self, name: str, row: TaskRow) -> None:
        """A heartbeat or a cancel request (`name`) reached `row`'s task in its lease."""
        spans = tracing.active
        if spans is not None and row.trace_parent is not None and row.lease_id is not None:
            spans.in_lease(
                name, row.runtime_id, row.id, row.lease_id, (row.trace_parent, row.trace_state)
            )

    def ended_many(self, results: Sequence[ItemResult], operation: str) -> None:
        """`ended` for the items a batch operation applied (the others: none)."""
        if tracing.active is not None:
            self._later(results, operation)

    def heartbeats(self, results: Sequence[ItemResult]) -> None:
        """`in_lease` for the items a batch heartbeat applied."""
        if tracing.active is not None:
            self._later(results, None)

    def _later(self, results: Sequence[ItemResult], operation: str | None) -> None:
        applied = [r for r in results if r.lease_id is not None and r.runtime_id is not None]
        if applied:
            at_ns = time.time_ns()  # when they were applied, not when their spans are written
            writing = self._write(applied, operation, at_ns)
            write = asyncio.create_task(writing, name="lease-spans")
            self._writes.add(write)
            write.add_done_callback(self._writes.discard)

    async def _write(self, applied: list[ItemResult], operation: str | None, at_ns: int) -> None:
        try:
            contexts = await self._store.trace_contexts([r.task_id for r in applied])
        except GatewayError as exc:  # the spans are lost, never an answer
            log.debug("lease spans not written: %s", exc.detail)
            return
        spans: Spans | None = tracing.active
        if spans is None:
            return
        for r in applied:
            context = contexts.get(r.task_id)
            if context is None:
                continue
            assert r.lease_id is not None and r.runtime_id is not None  # _later's filter
            if operation is None:
                spans.in_lease("heartbeat", r.runtime_id, r.task_id, r.lease_id, context, at_ns)
            else:
                outcome = r.status or "unknown"
                spans.lease_ended(
                    r.runtime_id, r.task_id, r.lease_id, operation, outcome, context, at_ns
                )

    async def close(self) -> None:
        """Finish the writes under way (each one statement), before the pool closes."""
        if self._writes:
            await asyncio.wait(list(self._writes), timeout=2.0)
        for write in list(self._writes):
            write.cancel()
