"""The scheduler: the tick pass, which makes each due tick's task, and the schedule
operations of the API (put, pause, resume, delete, trigger, backfill).

The pass runs on the janitor's leader, every PASS_INTERVAL_SECONDS. Leadership only
spares the other instances the work: exactly one task per tick holds without it. Each
batch of due schedules is one transaction that holds their rows, and records every
tick with its task in one statement keyed by (schedule, tick time), so that a second
instance, a retried pass, or a leader killed mid-pass never makes a second task
(store/schedules.py). `run_once()` is one pass and is what tests call; `start()` runs
it in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ..api.schedule_bodies import MAX_BACKFILL_TICKS, ScheduleDefinition, parse_backfill
from ..background import stop_task
from ..errors import GatewayError, NotFound
from ..metrics import Metrics
from ..rows import DecidedTick, ScheduleRow
from ..settings import Settings
from ..store import Store
from ..store.schedules import Planner
from . import plans

log = logging.getLogger("gateway.schedules")

# How often the leader looks for due ticks: a tick is enqueued within about this of its
# time. A pass that finds nothing due costs one index probe (schedules_due_idx).
PASS_INTERVAL_SECONDS = 0.5
# Due schedules per transaction, and transactions per pass: a pass's work is bounded,
# and what is left is first in line at the next one.
BATCH_SCHEDULES = 2000
MAX_BATCHES_PER_PASS = 10
# Runtimes bumped at once after a batch's commit: most of the Redis connections
# (GATEWAY_REDIS_MAX_CONNECTIONS, 64 by default) stay free for claims.
ANNOUNCE_CONCURRENCY = 16


@dataclass
class TickReport:
    """What one pass (or a trigger, or a backfill) decided, for tests and logs."""

    schedules: int = 0
    decided: list[DecidedTick] = field(default_factory=list)
    cancelled: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.decided if t.outcome == outcome)


class Scheduler:
    """Owned by the Gateway (`start`/`stop` from the app's lifespan)."""

    def __init__(
        self,
        store: Store,
        announce: Callable[[str], Awaitable[None]],
        settings: Settings,
        metrics: Metrics,
        leading: Callable[[], bool],
        finished: Callable[[list[tuple[uuid.UUID, str]]], Awaitable[None]] | None = None,
    ) -> None:
        """`announce`: bumps a runtime after the commit that made its tasks (I1).
        `leading`: whether this instance runs the janitor, and so the pass.
        `finished`: told of the tasks an overlap cancel_previous cancelled."""
        self._store = store
        self._announce = announce
        self._settings = settings
        self._metrics = metrics
        self._leading = leading
        self._finished = finished
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # -- the tick pass ---------------------------------------------------------

    async def run_once(self) -> TickReport:
        """One pass: due schedules in batches until none is left or the pass's bound.
        Safe from any instance at any time, and at once on several."""
        report = TickReport()
        plan = plans.due_plan(self._settings.schedule_ticks_days)
        # A batch's runtimes are bumped while the next batch is decided; the pass ends
        # once every bump is sent.
        bumping: list[asyncio.Task[None]] = []
        try:
            await self._batches(report, plan, bumping)
        finally:
            await asyncio.gather(*bumping)
        return report

    async def _batches(
        self, report: TickReport, plan: Planner, bumping: list[asyncio.Task[None]]
    ) -> None:
        for _ in range(MAX_BATCHES_PER_PASS):
            try:
                decided, cancelled, due = await self._store.decide_due(BATCH_SCHEDULES, plan)
            except GatewayError as exc:
                # Nothing of the batch was committed: its ticks are decided next pass.
                self._metrics.schedule_ticks.labels("failed").inc()
                report.errors.append(exc.detail)
                log.warning("schedule tick pass failed: %s", exc.detail)
                break
            report.schedules += due
            await self._after_commit(report, decided, cancelled, lag=True, bumping=bumping)
            if due < BATCH_SCHEDULES:
                break

    async def _after_commit(
        self,
        report: TickReport,
        decided: list[DecidedTick],
        cancelled: list[tuple[uuid.UUID, str]],
        lag: bool = False,
        bumping: list[asyncio.Task[None]] | None = None,
    ) -> None:
        """Counts, and after the commit: the runtimes that got tasks bumped (I1), the
        requests waiting for a cancelled task's result woken."""
        report.decided.extend(decided)
        report.cancelled.extend(cancelled)
        now = None
        for tick in decided:
            self._metrics.schedule_ticks.labels(tick.outcome).inc()
            if lag and tick.outcome == "enqueued":
                now = now or await self._store.now()
                self._metrics.schedule_lag.observe(max((now - tick.tick_at).total_seconds(), 0))
        made = sorted({t.runtime_id for t in decided if t.runtime_id is not None})
        self._metrics.tasks_enqueued.inc(sum(1 for t in decided if t.runtime_id is not None))
        if bumping is None:
            await self._announce_all(made)
        else:
            bumping.append(asyncio.create_task(self._announce_all(made), name="schedule bumps"))
        if cancelled and self._finished is not None:
            await self._finished(cancelled)

    async def _announce_all(self, runtime_ids: list[str]) -> None:
        """Bump each runtime (one Redis round trip each), ANNOUNCE_CONCURRENCY at a
        time: one after another, a batch's 500 runtimes took about 0.4 s, and a tick of
        10,000 schedules about 8 s."""
        gate = asyncio.Semaphore(ANNOUNCE_CONCURRENCY)

        async def one(runtime_id: str) -> None:
            async with gate:
                await self._announce(runtime_id)

        await asyncio.gather(*(one(runtime_id) for runtime_id in runtime_ids))

    # -- the API's operations --------------------------------------------------

    async def put(
        self, runtime_id: str, name: str, definition: ScheduleDefinition
    ) -> tuple[ScheduleRow, bool]:
        """Create or replace; (the schedule now, created). Idempotent: the same
        definition again changes nothing. Once this returns, no tick is decided from
        the definition it replaced."""
        return await self._store.write_schedule(
            runtime_id, name, lambda current, now: plans.put_write(definition, current, now)
        )

    async def get(self, runtime_id: str, name: str) -> ScheduleRow:
        row = await self._store.get_schedule(runtime_id, name)
        if row is None:
            raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")
        return row

    async def list_schedules(self, runtime_id: str, after: str, limit: int) -> list[ScheduleRow]:
        return await self._store.list_schedules(runtime_id, after, limit)

    async def delete(self, runtime_id: str, name: str) -> None:
        """Delete, or NotFound. Once this returns, the schedule makes no task."""
        if not await self._store.delete_schedule(runtime_id, name):
            raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")

    async def pause(
        self, runtime_id: str, name: str, paused: bool, note: str | None
    ) -> ScheduleRow:
        """Pause or resume (idempotent), with a note when given."""
        row, _ = await self._store.write_schedule(
            runtime_id, name, plans.pause_write(paused, note), create=False
        )
        return row

    async def trigger(self, runtime_id: str, name: str) -> DecidedTick | None:
        """A tick now, under the schedule's overlap policy: the tick decided."""
        report = TickReport()
        _, decided, cancelled = await self._store.decide_one(
            runtime_id, name, plans.trigger_plan(), "trigger"
        )
        await self._after_commit(report, decided, cancelled)
        return decided[0] if decided else None

    async def backfill(
        self, runtime_id: str, name: str, body: object
    ) -> tuple[list[DecidedTick], int]:
        """Enqueue the ticks of a past range (the request's body, checked against the
        database's clock); each tick at most once. Returns the ticks enqueued now and
        how many ticks the range holds."""
        now = await self._store.now()
        start, end = parse_backfill(body, self._settings.schedule_ticks_days, now)
        report = TickReport()
        schedule, decided, cancelled = await self._store.decide_one(
            runtime_id, name, plans.backfill_plan(start, end), "backfill", upgrade=True
        )
        await self._after_commit(report, decided, cancelled)
        in_range = plans.timing_of(schedule).ticks_between(
            start - timedelta(microseconds=1), end, MAX_BACKFILL_TICKS
        )
        return decided, len(in_range)

    # -- the loop ----------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="gateway-schedules")

    async def stop(self) -> None:
        """Stop the loop. Bounded: never holds up shutdown. A pass cut short commits
        nothing of its open batch."""
        self._stopping.set()
        if self._task is not None:
            await stop_task(self._task, "schedule tick pass")
            self._task = None

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            full = False
            try:
                if self._leading():
                    report = await self.run_once()
                    full = report.schedules >= BATCH_SCHEDULES * MAX_BATCHES_PER_PASS
            except asyncio.CancelledError:
                raise
            except Exception:
                # Never let the loop die: a dead pass stops every schedule.
                self._metrics.schedule_ticks.labels("failed").inc()
                log.exception("schedule tick pass failed; retrying")
            if full:
                # The pass stopped at its bound with ticks perhaps still due: the next
                # one starts at once, not an interval later (they would be late).
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), PASS_INTERVAL_SECONDS)
