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
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from ..api.schedule_bodies import MAX_BACKFILL_TICKS, ScheduleDefinition, parse_backfill
from ..background import stop_task
from ..errors import GatewayError, NotFound
from ..metrics import Metrics
from ..rows import DELETED, DecidedTick, ScheduleRow
from ..settings import Settings
from ..store import Store
from ..store.schedules import Planner, Written
from . import plans

log = logging.getLogger("gateway.schedules")

# The longest the leader rests between passes. It rests less when the earliest next
# tick comes sooner (it wakes DUE_MARGIN_SECONDS after it); a schedule written on
# another instance, due sooner than the one this instance knew of, waits at most this.
# A pass that finds nothing due costs one index probe (schedules_due_idx).
PASS_INTERVAL_SECONDS = 0.5
DUE_MARGIN_SECONDS = 0.002
MIN_REST_SECONDS = 0.02
# How far ahead a schedule with overlap allow has its ticks decided: their tasks wait
# (scheduled) until their time, so a tick is claimable on time however long the pass
# takes, as long as a pass runs within this of the tick (passes are at most
# PASS_INTERVAL_SECONDS apart). A change of the definition, a pause or a DELETE
# withdraws the ticks decided ahead whose time has not come.
AHEAD_SECONDS = 2.0
# Due schedules per transaction, and transactions per pass: a pass's work is bounded,
# and what is left is first in line at the next one.
BATCH_SCHEDULES = 2000
MAX_BATCHES_PER_PASS = 10
BATCHES_AT_ONCE = 2
# Runtimes bumped per Redis round trip (one pipeline) after a batch's commit.
BUMPS_PER_ROUND_TRIP = 500


@dataclass
class TickReport:
    """What one pass (or a trigger, or a backfill) decided, for tests and logs."""

    schedules: int = 0
    decided: list[DecidedTick] = field(default_factory=list)
    cancelled: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.decided if t.outcome == outcome)


class Bumps:
    """The runtimes a pass's batches made tasks in, bumped in the background after
    each batch's commit, BUMPS_PER_ROUND_TRIP per Redis round trip, one round trip at a
    time. A runtime already waiting for its bump is not added twice: that bump, sent
    after this commit too, announces both (I1). One taken for a round trip and added
    again waits for the next, as its first bump may have gone out before this commit.
    Ten thousand schedules ticking together over 1,000 runtimes were 5 batches and
    about 4,300 bumps, one round trip each; they are now about 1,000 in a few."""

    def __init__(self, announce: Callable[[Sequence[str]], Awaitable[None]]) -> None:
        self._announce = announce
        self._waiting: dict[str, None] = {}  # insertion-ordered set
        self._sender: asyncio.Task[None] | None = None

    def add(self, runtime_ids: Sequence[str]) -> None:
        """Call after the commit that made tasks in `runtime_ids`."""
        self._waiting.update(dict.fromkeys(runtime_ids))
        if self._waiting and (self._sender is None or self._sender.done()):
            self._sender = asyncio.create_task(self._send(), name="schedule bumps")

    async def _send(self) -> None:
        while self._waiting:
            chunk = list(itertools.islice(self._waiting, BUMPS_PER_ROUND_TRIP))
            for runtime_id in chunk:
                del self._waiting[runtime_id]
            await self._announce(chunk)

    async def finish(self) -> None:
        """Wait until every runtime added is bumped."""
        while self._sender is not None and not self._sender.done():
            await self._sender
        if self._sender is not None:
            self._sender.result()  # what the sender died of, if it died


class Scheduler:
    """Owned by the Gateway (`start`/`stop` from the app's lifespan)."""

    def __init__(
        self,
        store: Store,
        announce: Callable[[Sequence[str]], Awaitable[None]],
        settings: Settings,
        metrics: Metrics,
        leading: Callable[[], bool],
        finished: Callable[[list[tuple[uuid.UUID, str]]], Awaitable[None]] | None = None,
    ) -> None:
        """`announce`: bumps runtimes after the commit that made their tasks (I1).
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
        plan = plans.due_plan(self._settings.schedule_ticks_days, ahead_seconds=AHEAD_SECONDS)
        # A batch's runtimes are bumped while the next batch is decided; the pass ends
        # once every bump is sent.
        bumps = Bumps(self._announce)
        started = time.monotonic()
        try:
            await self._batches(report, plan, bumps)
        finally:
            await bumps.finish()
        if report.schedules:
            self._metrics.schedule_pass_seconds.observe(time.monotonic() - started)
        return report

    async def _batches(self, report: TickReport, plan: Planner, bumps: Bumps) -> None:
        """Batches until one comes back short of BATCH_SCHEDULES (nothing more is
        due), one fails, or MAX_BATCHES_PER_PASS were taken. The first runs alone (most
        passes find a few schedules due); after a full one, BATCHES_AT_ONCE run at once
        on connections of their own, so that one batch's statements run in Postgres
        while another's are planned here (SKIP LOCKED gives each its own schedules)."""
        left = MAX_BATCHES_PER_PASS

        async def batch() -> bool:
            """One batch; whether it was full (more may be due)."""
            nonlocal left
            left -= 1
            try:
                decided, cancelled, due = await self._store.decide_due(
                    BATCH_SCHEDULES, plan, AHEAD_SECONDS
                )
            except GatewayError as exc:
                # Nothing of the batch was committed: its ticks are decided next pass.
                self._metrics.schedule_ticks.labels("failed").inc()
                report.errors.append(exc.detail)
                log.warning("schedule tick pass failed: %s", exc.detail)
                return False
            report.schedules += due
            await self._after_commit(report, decided, cancelled, lag=True, bumps=bumps)
            return due == BATCH_SCHEDULES

        async def go_on() -> None:
            nonlocal left
            while left > 0:
                if not await batch():
                    left = 0

        if await batch():
            await asyncio.gather(*(go_on() for _ in range(BATCHES_AT_ONCE)))

    async def _after_commit(
        self,
        report: TickReport,
        decided: list[DecidedTick],
        cancelled: list[tuple[uuid.UUID, str]],
        lag: bool = False,
        bumps: Bumps | None = None,
    ) -> None:
        """Counts, and after the commit: the runtimes that got tasks bumped (I1), the
        requests waiting for a cancelled task's result woken."""
        report.decided.extend(decided)
        report.cancelled.extend(cancelled)
        for outcome, count in Counter(t.outcome for t in decided).items():
            self._metrics.schedule_ticks.labels(outcome).inc(count)
        if lag:
            for tick in decided:
                if tick.outcome == "enqueued" and tick.recorded_at is not None:
                    late = (tick.recorded_at - tick.tick_at).total_seconds()
                    self._metrics.schedule_lag.observe(max(late, 0.0))
        made = sorted({t.runtime_id for t in decided if t.runtime_id is not None})
        self._metrics.tasks_enqueued.inc(sum(1 for t in decided if t.runtime_id is not None))
        if bumps is None:
            await self._announce(made)
        else:
            bumps.add(made)
        if cancelled and self._finished is not None:
            await self._finished(cancelled)

    # -- the API's operations --------------------------------------------------

    async def put(
        self, runtime_id: str, name: str, definition: ScheduleDefinition
    ) -> tuple[ScheduleRow, bool]:
        """Create or replace; (the schedule now, created). Idempotent: the same
        definition again changes nothing. Once this returns, no tick is decided from
        the definition it replaced; the ticks that came due before it and were not
        decided yet are decided first, under the definition they came due in."""
        written = await self._store.write_schedule(
            runtime_id,
            name,
            lambda current, now: plans.put_write(definition, current, now),
            settle=self._settle(),
        )
        await self._after_write(written)
        return written.row, written.created

    async def get(self, runtime_id: str, name: str) -> ScheduleRow:
        row = await self._store.get_schedule(runtime_id, name)
        if row is None:
            raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")
        return row

    async def list_schedules(self, runtime_id: str, after: str, limit: int) -> list[ScheduleRow]:
        return await self._store.list_schedules(runtime_id, after, limit)

    async def delete(self, runtime_id: str, name: str) -> None:
        """Delete, or NotFound. Once this returns, the schedule makes no task."""
        found, withdrawn = await self._store.delete_schedule(runtime_id, name)
        if not found:
            raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")
        await self._woken(withdrawn)

    async def pause(
        self, runtime_id: str, name: str, paused: bool, note: str | None
    ) -> ScheduleRow:
        """Pause or resume (idempotent), with a note when given. A pause first decides
        the ticks that came due before it and were not decided yet."""
        written = await self._store.write_schedule(
            runtime_id, name, plans.pause_write(paused, note), create=False, settle=self._settle()
        )
        await self._after_write(written)
        return written.row

    async def _after_write(self, written: Written) -> None:
        """After a PUT's or a pause's commit: the ticks it decided first announced, and
        the waits for the tasks it withdrew woken."""
        await self._after_commit(TickReport(), written.decided, written.cancelled, lag=True)
        await self._woken(written.withdrawn)

    async def _woken(self, withdrawn: Sequence[uuid.UUID]) -> None:
        """After the commit that withdrew (deleted) tasks decided ahead: a request
        waiting for one's result is woken, and finds it gone (404)."""
        if withdrawn and self._finished is not None:
            await self._finished([(task_id, DELETED) for task_id in withdrawn])

    def _settle(self) -> Planner:
        """The ticks due now, as the pass would decide them (none ahead: the change
        may withdraw those)."""
        return plans.due_plan(self._settings.schedule_ticks_days)

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
            rest = PASS_INTERVAL_SECONDS
            try:
                if self._leading():
                    report = await self.run_once()
                    if report.schedules >= BATCH_SCHEDULES * MAX_BATCHES_PER_PASS:
                        # The pass stopped at its bound with ticks perhaps still due:
                        # the next one starts at once (they would be late).
                        rest = 0.0
                    else:
                        rest = await self._rest()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Never let the loop die: a dead pass stops every schedule.
                self._metrics.schedule_ticks.labels("failed").inc()
                log.exception("schedule tick pass failed; retrying")
            if rest <= 0:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), rest)

    async def _rest(self) -> float:
        """How long to rest after a pass that took every due schedule it found: until
        just after the earliest next tick, at most PASS_INTERVAL_SECONDS. A schedule
        still due (another transaction held it) is looked at again after
        MIN_REST_SECONDS, not at once: the holder's commit is what it waits for."""
        try:
            due_in = await self._store.next_due_in()
        except GatewayError as exc:
            log.warning("could not read the next tick's time: %s", exc.detail)
            return PASS_INTERVAL_SECONDS
        if due_in is None:
            return PASS_INTERVAL_SECONDS
        return min(PASS_INTERVAL_SECONDS, max(MIN_REST_SECONDS, due_in + DUE_MARGIN_SECONDS))
