"""Heartbeats: how the worker loop keeps the leases it holds, and hears that a task is
to be cancelled or its lease is lost.

- Each lease is heartbeated about every third of its length (`lease_seconds` / 3
  seconds), from its claim until its report is answered: a report waiting for room or
  for its answer never lets the lease lapse.
- With one slot, each task has its own loop (`beat`); with `concurrency` > 1, one loop
  extends every held lease in one request (`beat_all`, `heartbeat_many`), or one
  single heartbeat per lease on a gateway without the batch calls.
- While the handler runs, an answer with `cancel_requested` cancels it (the task is
  then released, which the gateway ends `cancelled`); `lease_lost` cancels it and
  nothing is reported, since the task may already be another daemon's. Once the
  handler has finished, the report's own answer says how the task ended.
- Each extended lease is an event on its task's consumer span, when one is recorded.
- A failed heartbeat is retried after a full-jitter backoff of at most one interval,
  unless a `Retry-After` asks for longer.

The `Worker` owns the held tasks; `Heartbeats` reads them and only interrupts their
handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from .backoff import Backoff
from .errors import LeaseLost, NotFound
from .models import Beat, ItemOutcome, ItemOutcomeKind
from .runs import Interrupt, Running, interrupt
from .transport import BatchCalls, Transport, describe, log

# A lease extended, as an event on the task's consumer span (tracing/spans.py).
HEARTBEAT = "heartbeat"
LEASE_ATTRIBUTE = "messaging.claim_gateway.lease_seconds"


class Heartbeats:
    """Extends the leases in `runs` (the worker's held tasks, by task id) for
    `lease_seconds` each time."""

    def __init__(
        self,
        transport: Transport,
        runtime: str,
        lease_seconds: int,
        runs: Mapping[str, Running],
        batch_calls: BatchCalls,
    ) -> None:
        self.transport = transport
        self.runtime = runtime
        self.lease_seconds = lease_seconds
        self._runs = runs
        self._batch_calls = batch_calls

    async def beat(self, run: Running) -> None:
        """Extends the lease every third of its length until cancelled (once the report
        is answered); cancels a running handler on a requested cancel or a lost lease.
        Failed heartbeats are retried sooner."""
        lease = self.lease_seconds
        interval = lease / 3
        backoff = Backoff(base_seconds=min(0.5, interval / 4), cap_seconds=interval)
        delay = interval
        assert run.task.lease_id is not None
        while True:
            await asyncio.sleep(delay)
            try:
                answer = await self.transport.heartbeat(run.task.id, run.task.lease_id, lease)
            except (LeaseLost, NotFound):
                interrupt(run, Interrupt.LEASE_LOST)
                return
            except Exception as exc:
                delay = backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning("task=%s heartbeat failed (%s)", run.task.id, describe(exc))
                continue
            backoff.reset()
            delay = interval
            run.event(HEARTBEAT, {LEASE_ATTRIBUTE: lease})
            if answer.cancel_requested and run.interrupt is None:
                # Beating goes on: the release may wait for room among the reports in
                # flight, and the lease must hold until it is answered.
                interrupt(run, Interrupt.CANCEL_REQUESTED)

    async def beat_all(self) -> None:
        """Every third of a lease, extends every held lease (its handler running, or its
        report not yet answered) in one request; interrupts the running handlers whose
        lease is lost or whose task is to be cancelled. A failed request is retried
        sooner."""
        lease = self.lease_seconds
        interval = lease / 3
        backoff = Backoff(base_seconds=min(0.5, interval / 4), cap_seconds=interval)
        delay = interval
        while True:
            await asyncio.sleep(delay)
            runs = list(self._runs.values())
            if not runs:
                delay = interval
                continue
            beats = [Beat(r.task.id, r.task.lease_id or "", lease) for r in runs]
            try:
                if self._batch_calls.available:
                    answers = await self.transport.heartbeat_many(beats)
                else:
                    answers = await self._beat_each(beats)
            except Exception as exc:
                if self._batch_calls.lacking(exc):
                    delay = 0
                    continue
                delay = backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning(
                    "runtime=%s heartbeat of %d lease(s) failed (%s)",
                    self.runtime,
                    len(beats),
                    describe(exc),
                )
                continue
            backoff.reset()
            delay = interval
            for run, answer in zip(runs, answers, strict=False):
                if answer.refused:
                    interrupt(run, Interrupt.LEASE_LOST)
                    continue
                run.event(HEARTBEAT, {LEASE_ATTRIBUTE: lease})
                if answer.cancel_requested:
                    interrupt(run, Interrupt.CANCEL_REQUESTED)

    async def _beat_each(self, beats: list[Beat]) -> list[ItemOutcome]:
        """heartbeat_many's answers, from one single heartbeat per lease."""
        out = []
        for beat in beats:
            try:
                task = await self.transport.heartbeat(
                    beat.task_id, beat.lease_id, beat.lease_seconds
                )
            except (LeaseLost, NotFound) as exc:
                refused: ItemOutcomeKind = (
                    "lease_lost" if isinstance(exc, LeaseLost) else "not_found"
                )
                out.append(ItemOutcome(beat.task_id, refused, problem=dict(exc.problem)))
                continue
            out.append(
                ItemOutcome(beat.task_id, "extended", cancel_requested=task.cancel_requested)
            )
        return out
