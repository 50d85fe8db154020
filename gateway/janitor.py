"""The janitor: lease reclaim, TTL expiry, retention (of tasks and of schedule ticks),
the finished-task counts' fold, the per-runtime history's rollup and retention,
verdict repair (I6), the queue-depth gauges, and a VACUUM of the task table after a
burst of completions or deletes.

One instance at a time does the work: leadership is a Postgres advisory lock held on
a dedicated connection, so when the leader dies another instance takes over at its
next interval. `run_once()` is one pass and is what tests call; `start()` runs it in
a loop. A failing step is logged and counted, and the next step and pass still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from . import tracing
from .api.bodies import STATUSES
from .background import stop_task
from .errors import CacheUnavailable, DatabaseBusy, GatewayError, StoreUnavailable
from .metrics import Metrics
from .redis.verdict import VerdictCache
from .settings import Settings
from .store import Store
from .store.history import HISTORY_ROLLUPS
from .store.janitor import Leadership

log = logging.getLogger("gateway.janitor")

LOCK_KEY = zlib.crc32(b"claim-gateway.janitor")
MAX_BATCHES_PER_STEP = 10  # bounds one pass; what is left waits for the next
# The queue-depth count reads every live row; it runs again only once this many times
# its own last duration has passed, so it takes at most a tenth of the janitor's time
# however large the queue grows (and every pass while it is quick).
DEPTH_DUTY = 10.0
# The repair walk's pages (of janitor_batch_size runtimes with a queued task) per pass.
# A page costs about 0.15 s (two index probes, a Redis read and a publish per runtime),
# so a pass stays well under a second however many runtimes there are; with more
# runtimes than two pages a round takes several passes (docs/design.md, I6).
REPAIR_PAGES_PER_PASS = 2
FINISHED = ("completed", "cancelled", "expired")
# The VACUUM after a burst (GATEWAY_JANITOR_VACUUM_DEAD_ROWS) starts no sooner than this
# many times the last one's duration after that one started, so that vacuums take at
# most half the time however fast rows die: on a table of 10^7 rows one takes about
# half a minute here (docs/capacity.md, "After a burst").
VACUUM_DUTY = 2.0
# One VACUUM's bound. Past it, it is cancelled, keeping the pages it has cleaned, and a
# later pass starts another.
VACUUM_TIMEOUT_SECONDS = 900.0


@dataclass
class PassReport:
    """What one pass did, for tests and logs."""

    reclaimed: int = 0
    expired: int = 0
    promoted: int = 0
    purged: int = 0
    ticks_purged: int = 0  # schedule ticks past GATEWAY_SCHEDULE_TICKS_DAYS
    folded: int = 0
    # The history's rollup: per-backend rows folded, depths read for the bucket that
    # just ended, and rows past GATEWAY_HISTORY_DAYS deleted (of task_history, and of
    # its rollups: the fleet's buckets, the hourly failures, the runtimes' last buckets).
    history_folded: int = 0
    history_depths: int = 0
    history_purged: int = 0
    history_rollups_purged: int = 0
    # A step could not reach Postgres (not merely found it busy): the pass says the
    # database is unreachable, though each step's failure was caught.
    unreachable: bool = False
    # Runtimes the repair walk visited, claimable or not (at most
    # REPAIR_PAGES_PER_PASS * janitor_batch_size per pass).
    visited: int = 0
    repaired: list[str] = field(default_factory=list)
    woken: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per step, for measurements
    # The task table's dead row versions when the vacuum step read them (None: not read,
    # the step off or a VACUUM running or not due), and whether it started a VACUUM.
    dead_rows: int | None = None
    vacuum_started: bool = False


class Janitor:
    """Owned by the app's lifespan (`start`/`stop`)."""

    def __init__(
        self,
        store: Store,
        cache: VerdictCache,
        announce: Callable[[str], Awaitable[None]],
        settings: Settings,
        metrics: Metrics,
        finished: Callable[[list[tuple[uuid.UUID, str]]], Awaitable[None]] | None = None,
        slots_freed: Callable[[list[str]], Awaitable[None]] | None = None,
    ) -> None:
        """`finished`: called after a commit with the (id, status) of tasks a lease
        expiry ended (dead, cancelled), to wake the requests waiting for them.
        `slots_freed`: told of runtimes whose leases were reclaimed as dead, whose
        parked polls a max_in_flight may be holding (runtime controls)."""
        self._store = store
        self._finished = finished
        self._cache = cache
        self._announce = announce
        self._slots_freed = slots_freed
        self._settings = settings
        self._metrics = metrics
        self._batch = settings.janitor_batch_size
        self._leadership: Leadership | None = None
        self._repair_after = ""  # runtime id cursor: the repair walks every runtime in turn
        self._depth_due = 0.0  # monotonic time of the next queue-depth count
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._vacuum_task: asyncio.Task[None] | None = None
        self._vacuum_due = 0.0  # monotonic time from which the next VACUUM may start

    @property
    def is_leader(self) -> bool:
        return self._leadership is not None

    async def run_once(self) -> PassReport:
        """One pass over every duty. Safe to call from any instance at any time: each
        statement is idempotent and skips rows another transaction holds."""
        report = PassReport()
        started = time.monotonic()
        for name, step in (
            ("lease reclaim", self._reclaim),
            ("expiry", self._expire),
            ("retention", self._purge),
            ("tick retention", self._purge_ticks),
            ("counts fold", self._fold),
            ("history", self._history),
            ("verdict repair", self._repair),
            ("promotion", self._promote),
            ("queue depth", self._gauge_depth),
            ("vacuum", self._vacuum),
        ):
            step_started = time.monotonic()
            try:
                await step(report)
            except GatewayError as exc:
                self._metrics.janitor_errors.inc()
                report.errors.append(f"{name}: {exc.detail}")
                if isinstance(exc, StoreUnavailable) and not isinstance(exc, DatabaseBusy):
                    report.unreachable = True
                log.warning("janitor %s failed: %s", name, exc.detail)
            report.seconds[name] = time.monotonic() - step_started
        self._metrics.janitor_pass_seconds.observe(time.monotonic() - started)
        return report

    async def _reclaim(self, report: PassReport) -> None:
        runtimes: set[str] = set()
        finished: list[tuple[uuid.UUID, str]] = []
        ended: set[str] = set()
        for _ in range(MAX_BATCHES_PER_STEP):
            rows = await self._store.reclaim_leases(self._batch)
            spans = tracing.active
            for row in rows:
                self._metrics.leases_reclaimed.labels(row.status).inc()
                if spans is not None and row.lease_id is not None:
                    spans.lease_ended(
                        row.runtime_id, row.task_id, row.lease_id, "expire", row.status, row.trace
                    )
                if row.status == "queued":
                    runtimes.add(row.runtime_id)
                else:
                    ended.add(row.runtime_id)
                    if row.task_id is not None:
                        finished.append((row.task_id, row.status))
            report.reclaimed += len(rows)
            if len(rows) < self._batch:
                break
        for runtime_id in sorted(runtimes):  # I1: bump after commit
            await self._announce(runtime_id)
        if finished and self._finished is not None:
            await self._finished(finished)
        if self._slots_freed is not None and ended - runtimes:
            await self._slots_freed(sorted(ended - runtimes))
        if report.reclaimed:
            log.info("reclaimed %d expired leases", report.reclaimed)

    async def _expire(self, report: PassReport) -> None:
        for _ in range(MAX_BATCHES_PER_STEP):
            n = await self._store.expire_tasks(self._batch)
            report.expired += n
            if n < self._batch:
                break
        self._metrics.tasks_expired.inc(report.expired)

    async def _promote(self, report: PassReport) -> None:
        """Scheduled tasks that came due become queued, in bounded batches. Claims take
        due scheduled tasks anyway; this keeps their share of the claim's scan small.
        The runtimes moved are bumped after commit: a claim that skipped a row while
        this held it may have written an empty verdict."""
        runtimes: set[str] = set()
        for _ in range(MAX_BATCHES_PER_STEP):
            moved = await self._store.promote_scheduled(self._batch)
            runtimes.update(moved)
            report.promoted += len(moved)
            if len(moved) < self._batch:
                break
        for runtime_id in sorted(runtimes):  # I1: bump after commit
            await self._announce(runtime_id)

    async def _purge(self, report: PassReport) -> None:
        for statuses, age in (
            (FINISHED, self._settings.retention_seconds),
            (("dead",), self._settings.dead_retention_seconds),
        ):
            purge = functools.partial(self._store.purge_finished, statuses, age)
            report.purged += await self._batches(purge)
        self._metrics.tasks_purged.inc(report.purged)

    async def _purge_ticks(self, report: PassReport) -> None:
        """The schedules' tick record kept GATEWAY_SCHEDULE_TICKS_DAYS (a backfill may
        not reach further back), oldest first, in bounded batches."""
        days = self._settings.schedule_ticks_days
        report.ticks_purged = await self._batches(
            lambda limit: self._store.purge_ticks(days, limit)
        )

    async def _fold(self, report: PassReport) -> None:
        """Keeps the finished-task counts at a few rows per runtime (FOLD_TASK_COUNTS):
        work proportional to the runtimes whose tasks finished since the last pass."""
        report.folded = await self._batches(self._store.fold_counts)

    async def _history(self, report: PassReport) -> None:
        """The per-runtime history's rollup (docs/guides/history.md): hands the bucket
        width to the triggers, folds the per-backend rows of ended buckets (adding them
        to the fleet's and the runtimes' rollups), reads the depth of the runtimes with
        activity in the bucket that has just ended, and deletes buckets past
        GATEWAY_HISTORY_DAYS, of the history and of each rollup, each in bounded
        batches. Work proportional to the runtimes with activity since the last pass
        (and to their queued tasks, for the depth)."""
        await self._store.set_history_interval(self._settings.history_interval_seconds)
        report.history_folded = await self._batches(self._store.fold_history)
        report.history_depths = await self._batches(self._store.fill_history_depth)
        days = self._settings.history_days
        report.history_purged = await self._batches(
            lambda limit: self._store.purge_history(days, limit)
        )
        for rollup in HISTORY_ROLLUPS:
            purge = functools.partial(self._store.purge_history_rollup, rollup, days)
            report.history_rollups_purged += await self._batches(purge)

    async def _batches(self, run: Callable[[int], Awaitable[int]]) -> int:
        """`run(janitor_batch_size)` until a batch comes back short, at most
        MAX_BATCHES_PER_STEP times (what is left waits for the next pass); returns the
        rows the batches did."""
        total = 0
        for _ in range(MAX_BATCHES_PER_STEP):
            n = await run(self._batch)
            total += n
            if n < self._batch:
                break
        return total

    async def _repair(self, report: PassReport) -> None:
        """Runtimes with tasks claimable for over a second are repaired. Those whose
        verdict says empty lost a bump, or had a row skipped by a claim in the instant
        a lease operation re-checked it: one that began while its lease held the task
        and waited for the reclaim that queued it again keeps the row locked until its
        statement ends (store/sql: leases._LEASE_HELD, acks._BATCH_HELD). Bump them.
        The others get a wake-up publish: if a poll is parked on them, it missed one (a
        publish lost while the bump landed), and it re-checks; if none is, nobody
        listens.

        The walk visits at most REPAIR_PAGES_PER_PASS pages of janitor_batch_size
        runtimes with a queued task per pass, and goes on from there at the next pass:
        with R such runtimes a full round takes ceil(R / that) passes, which is the
        repair bound that docs/design.md (section 3, I6) states."""
        if not self._settings.cache_enabled:
            return
        for _ in range(REPAIR_PAGES_PER_PASS):
            page = await self._store.claimable_runtimes(self._batch, self._repair_after)
            self._repair_after = page.next_after
            report.visited += page.visited
            runtimes = page.claimable
            try:
                stale = await self._cache.says_empty(runtimes)
            except CacheUnavailable:
                return  # nothing to repair while Redis is away: claims go to Postgres
            for runtime_id in stale:
                log.warning(
                    "runtime %s had claimable tasks behind an 'empty' verdict; bumped it "
                    "(a version bump was lost earlier, or a claim skipped a task's row "
                    "while a lease operation that had waited for its reclaim re-checked it)",
                    runtime_id,
                )
                self._metrics.repairs.inc()
                await self._announce(runtime_id)
            report.repaired.extend(stale)
            bumped = set(stale)
            waking = [runtime_id for runtime_id in runtimes if runtime_id not in bumped]
            try:
                await self._cache.wake(waking)
            except CacheUnavailable:
                return
            self._metrics.repair_wakeups.inc(len(waking))
            report.woken.extend(waking)
            if not self._repair_after:
                return

    async def _gauge_depth(self, report: PassReport) -> None:
        """The queue-depth gauges, from one query (a scrape runs none): every pass while
        it is quick, less often once it takes over a tenth of the time (DEPTH_DUTY)."""
        started = time.monotonic()
        if started < self._depth_due:
            return
        counts, oldest = await self._store.queue_depth()
        self._depth_due = started + DEPTH_DUTY * (time.monotonic() - started)
        for status in STATUSES:
            self._metrics.tasks_by_status.labels(status).set(counts.get(status, 0))
        self._metrics.oldest_queued_age.set(oldest or 0.0)

    async def _vacuum(self, report: PassReport) -> None:
        """After a burst, a VACUUM (ANALYZE) of the task table, started here and run in
        the background (the pass goes on; `vacuuming` while it runs).

        A burst of completions leaves each task's earlier row versions dead, and their
        index entries with them: a claim on that runtime then walks them before it
        reaches a live task, and its stats read the table's pages instead of the index
        alone, until a VACUUM removes them. Autovacuum waits for a fifth of the table
        to be dead by default (two million rows of ten million), then for its next
        round. The pass reads Postgres's count of dead rows (from its statistics, not
        the table) and starts one VACUUM once GATEWAY_JANITOR_VACUUM_DEAD_ROWS are
        dead; it skips at once when another VACUUM of the table runs (autovacuum's, or
        another replica's janitor's after a change of leader: Postgres's lock
        decides). It blocks no read or write, and runs on a connection of its own to
        the direct URL. At most one at a time per process, bounded by
        VACUUM_TIMEOUT_SECONDS, and no sooner than VACUUM_DUTY times the last one's
        duration after it started."""
        threshold = self._settings.janitor_vacuum_dead_rows
        if threshold <= 0 or self.vacuuming is not None or time.monotonic() < self._vacuum_due:
            return
        report.dead_rows = await self._store.dead_task_rows()
        if report.dead_rows < threshold:
            return
        report.vacuum_started = True
        self._vacuum_task = asyncio.create_task(
            self._vacuum_tasks(report.dead_rows), name="gateway-janitor-vacuum"
        )

    @property
    def vacuuming(self) -> asyncio.Task[None] | None:
        """The VACUUM this janitor started, while it runs."""
        task = self._vacuum_task
        return task if task is not None and not task.done() else None

    async def _vacuum_tasks(self, dead_rows: int) -> None:
        started = time.monotonic()
        outcome = "failed"
        try:
            ran = await self._store.vacuum_tasks(VACUUM_TIMEOUT_SECONDS)
            outcome = "done" if ran else "skipped"
        except GatewayError as exc:
            self._metrics.janitor_errors.inc()
            log.warning("janitor VACUUM of the task table failed: %s", exc.detail)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            took = time.monotonic() - started
            self._vacuum_due = started + VACUUM_DUTY * took
            self._metrics.table_vacuums.labels(outcome).inc()
            log.info(
                "janitor VACUUM of the task table after %d dead rows: %s in %.1fs",
                dead_rows,
                outcome,
                took,
            )

    # -- the loop ----------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="gateway-janitor")

    async def stop(self) -> None:
        """Stop the loop and give up leadership. Bounded: never holds up shutdown."""
        self._stopping.set()
        if self._task is not None:
            await stop_task(self._task, "janitor")
            self._task = None
        if self._vacuum_task is not None:
            await stop_task(self._vacuum_task, "janitor VACUUM")
            self._vacuum_task = None
        await self._resign()

    async def _resign(self) -> None:
        if self._leadership is not None:
            await self._leadership.release()
            self._leadership = None
            self._metrics.janitor_leader.set(0)
            self._depth_due = 0.0  # a new term exports the gauges at its first pass
            # The new leader exports them now: stale copies here would add up wrong.
            self._metrics.tasks_by_status.clear()
            self._metrics.oldest_queued_age.set(0)

    async def _loop(self) -> None:
        interval = self._settings.janitor_interval_seconds
        while not self._stopping.is_set():
            try:
                if self._leadership is not None and not await self._leadership.held():
                    log.warning("janitor lost its database lock; will try to take it again")
                    await self._resign()
                if self._leadership is None:
                    self._leadership = await self._store.try_leadership(LOCK_KEY)
                    if self._leadership is not None:
                        log.info("this instance now runs the janitor")
                        self._metrics.janitor_leader.set(1)
                reached = self._leadership is None or not (await self.run_once()).unreachable
                self._metrics.database_reachable.set(1 if reached else 0)
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                # Expected while Postgres is away (a failover, a partition): one line,
                # no traceback, each round until it answers again.
                self._metrics.database_reachable.set(0)
                self._metrics.janitor_errors.inc()
                log.warning("janitor: the database is unavailable (%s); retrying", exc.detail)
            except Exception:
                # Never let the loop die: a dead janitor strands tasks.
                self._metrics.janitor_errors.inc()
                log.exception("janitor pass failed; retrying in %.1fs", interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
