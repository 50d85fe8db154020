"""The worker loop: long-poll one runtime, run up to `concurrency` handlers at once,
heartbeat each lease, and report each outcome.

- A claim asks only for free slots (`max_tasks` = free slots, at most
  `max_tasks_per_poll`), and only when a slot is free. A task holds a slot while its
  handler runs; once the handler has finished and its outcome is handed to the
  reporter, the slot is free, so the next claim goes out while that report is in
  flight.
- Reports in flight (handed over, queued or sent, not yet answered) are at most
  `concurrency`: a finished handler waits for room, keeping its slot, so the leases
  held never exceed 2 x `concurrency`.
- Each lease is heartbeated about every third of its length, from its claim until its
  report is answered (a report waiting for room or for its answer never lets the lease
  lapse); with `concurrency` > 1, every held lease in one request (`heartbeat_many`).
  While the handler runs, a heartbeat answering `cancel_requested` cancels it and
  releases the task, which the gateway then ends `cancelled`; `lease_lost` cancels it
  and reports nothing, since the task may already be another daemon's. Once the
  handler has finished, the report's own answer says how the task ended.
- A handler's return value completes the task; its exception fails it (type, message
  and the end of the traceback, bounded), retryable unless it is `TaskFailed(retry=False)`.
- A finished task's report (its complete or fail) rides on the next claim when that
  claim goes out at once: when every slot was busy and this one freed while the
  others keep running (with one slot, always). The claim's answer says how each
  report ended (`acks`); should the claim fail, or a gateway answer no `acks`, the
  reports are sent on their own (a repeat is safe). Such a claim does not wait for
  work, so that the reports' outcomes come back at once; after an empty answer a long
  poll follows at once. Otherwise, as while a claim is parked, a report goes on its
  own at once, never waiting for a claim.
- With `concurrency` > 1, completions are gathered and sent together
  (`complete_many`): as soon as no other handler is still running, else after
  `complete_window_seconds`, at most a sixth of a lease. A gateway without the batch
  endpoints (404 or 405 for the whole request) gets single calls instead.
- Errors and network failures back off with full jitter, at least as long as a
  `Retry-After` says; the loop never spins.
- `stop()` (SIGTERM, SIGINT) stops claiming at once and lets running handlers finish
  within `grace_seconds`; what still runs then is cancelled and released. A second
  `stop()` does that at once. Either way `run()` returns only once every report in
  flight is answered (or has given up retrying), so nothing is dropped on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import random
import signal
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .backoff import Backoff
from .errors import GatewayError, LeaseLost, MethodNotAllowed, NotFound
from .failure import TaskFailed, format_error
from .models import Beat, Claimed, Completion, Failure, ItemOutcome, ItemOutcomeKind, Task

log = logging.getLogger("gateway_client.worker")

Handler = Callable[[Task], Awaitable[Any]]
# A report (complete, fail, release) is retried this long at most after a failure.
REPORT_RETRY_SECONDS = 30.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After an empty answer that came early; a long poll's empty answer is claimed again at once.
IDLE_PAUSE_SECONDS = 1.0
# The longest a finished task's completion waits for others to share its request; at
# most a sixth of the lease, whatever the option says (see WorkerOptions).
COMPLETE_WINDOW_SECONDS = 0.05
MAX_BATCH = 1000  # items per batch request, the gateway's limit


class Transport(Protocol):
    """The calls the loop makes; AsyncClient has them, tests pass a fake."""

    async def claim(
        self,
        runtime: str,
        worker_id: str,
        *,
        max_tasks: int = 1,
        wait_seconds: float = 0,
        lease_seconds: int | None = None,
        complete: Iterable[Completion] | None = None,
        fail: Iterable[Failure] | None = None,
    ) -> Claimed: ...

    async def heartbeat(
        self, task_id: str, lease_id: str, lease_seconds: int | None = None
    ) -> Task: ...

    async def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task: ...

    async def fail(
        self,
        task_id: str,
        lease_id: str,
        error: str,
        *,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task: ...

    async def release(self, task_id: str, lease_id: str) -> Task: ...

    async def complete_many(self, items: list[Completion]) -> list[ItemOutcome]: ...

    async def heartbeat_many(self, items: list[Beat]) -> list[ItemOutcome]: ...


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


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class WorkerOptions:
    """`concurrency` handlers at once; leases of `lease_seconds`; long polls of
    `wait_seconds`; `grace_seconds` for running handlers after stop()."""

    concurrency: int = 1
    lease_seconds: int = 60
    max_tasks_per_poll: int = 10
    wait_seconds: float = 20.0  # long poll; the gateway's cap is GATEWAY_MAX_WAIT_SECONDS
    grace_seconds: float = 30.0
    worker_id: str = field(default_factory=default_worker_id)
    # With concurrency > 1: how long a completion may wait to share a request.
    complete_window_seconds: float = COMPLETE_WINDOW_SECONDS
    # Send a finished task's report with the next claim when that claim goes out at
    # once (one request instead of two); False: always on its own.
    reports_with_claims: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.max_tasks_per_poll < 1 or self.lease_seconds < 1:
            raise ValueError("concurrency, max_tasks_per_poll and lease_seconds must be >= 1")
        if self.complete_window_seconds < 0:
            raise ValueError("complete_window_seconds must be >= 0")


@dataclass
class _Running:
    task: Task
    handler: asyncio.Task[Any]
    started: float
    interrupt: Interrupt | None = None


@dataclass
class _Completion:
    """A finished handler's result waiting to be sent with others; `done` receives
    what _report returns for it."""

    run: _Running
    result: Any
    done: asyncio.Future[tuple[Outcome, str]]
    since: float


@dataclass
class _Report:
    """A finished task's complete or fail waiting for the next claim to carry it;
    `done` receives what _report returns for it."""

    run: _Running
    outcome: Outcome  # COMPLETED or FAILED
    item: Completion | Failure
    done: asyncio.Future[tuple[Outcome, str]]


class Worker:
    """Runs `handler` for each task claimed from `runtime` until stopped."""

    def __init__(
        self,
        transport: Transport,
        runtime: str,
        handler: Handler,
        options: WorkerOptions | None = None,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self.transport = transport
        self.runtime = runtime
        self.handler = handler
        self.options = options or WorkerOptions()
        self.outcomes: Counter[Outcome] = Counter()
        self._backoff = backoff or Backoff()
        # Every held task, from its claim until its report is answered.
        self._running: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, _Running] = {}
        # The tasks holding a slot: their handler runs, or waits for room to report.
        self._slots: set[str] = set()
        # Room among the reports in flight, so that they and the leases they hold stay
        # bounded however fast handlers finish.
        self._report_room = asyncio.Semaphore(self.options.concurrency)
        self._reports_in_flight = 0
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # Several leases may be held at once: heartbeats and completions go in batches.
        self._batching = self.options.concurrency > 1
        self._completions: list[_Completion] = []
        self._handler_done = asyncio.Event()  # a handler finished, or a completion waits
        self._batch_calls = True  # until a gateway without the batch endpoints says so
        # Reports for the next claim to carry, taken while the claim loop waits for a
        # free slot (`_claim_idle`): that claim then goes out at once.
        self._reports: list[_Report] = []
        self._claim_idle = False
        self._apart: set[asyncio.Task[None]] = set()  # reports sent on their own instead

    @property
    def running(self) -> int:
        """Tasks holding a slot: their handler runs, or has finished and waits for
        room among the reports in flight."""
        return len(self._slots)

    @property
    def reporting(self) -> int:
        """Outcomes handed to the reporter and not yet answered (queued or sent)."""
        return self._reports_in_flight

    def stop(self) -> None:
        """First call: claim no more, let handlers finish within grace_seconds.
        Second call: cancel and release what still runs, at once."""
        if self._stopping.is_set():
            log.warning("runtime=%s stopping now: releasing %d task(s)", self.runtime, self.running)
            self._forced.set()
        else:
            log.info(
                "runtime=%s stopping: no more claims; waiting up to %gs for %d task(s), "
                "then for %d report(s) in flight",
                self.runtime,
                self.options.grace_seconds,
                self.running,
                self.reporting,
            )
            self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT call stop(); call from inside the running loop."""
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self.stop)

    def remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)

    async def run(self) -> None:
        """Claims and runs tasks until stop(); returns once every task is reported."""
        helpers = []
        if self._batching:
            helpers = [
                asyncio.create_task(self._heartbeat_all(), name="heartbeats"),
                asyncio.create_task(self._send_completions(), name="completions"),
            ]
        try:
            await self._claim_loop()
        finally:
            self._stopping.set()
            # Reports no claim will carry now go on their own.
            self._send_apart(self._reports)
            self._reports = []
            try:
                await self._drain()
            finally:
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)

    # -- claiming ----------------------------------------------------------------

    async def _claim_loop(self) -> None:
        opts = self.options
        while not self._stopping.is_set():
            free = opts.concurrency - len(self._slots)
            if free <= 0:
                self._slot_freed.clear()
                self._claim_idle = opts.reports_with_claims
                try:
                    await self._until_stopped(self._slot_freed.wait())
                finally:
                    self._claim_idle = False
                continue
            reports, self._reports = self._reports, []
            asked = time.monotonic()
            claim = asyncio.ensure_future(self._claim(min(free, opts.max_tasks_per_poll), reports))
            if reports:
                # It does not wait for work (_claim), so stop() lets it finish: its
                # answer is its reports' outcomes.
                await asyncio.wait({claim})
            elif not await self._until_stopped(claim):
                # Leaving a parked poll: the gateway gives back whatever it was leasing.
                claim.cancel()
                with contextlib.suppress(BaseException):
                    await claim
                return
            try:
                tasks = claim.result()
            except Exception as exc:
                self._send_apart(reports)
                delay = self._backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning(
                    "runtime=%s claim failed (%s); retrying in %.2fs",
                    self.runtime,
                    _describe(exc),
                    delay,
                )
                await self._until_stopped(asyncio.sleep(delay))
                continue
            self._settle(reports, tasks)
            self._backoff.reset()
            for task in tasks:
                self._start(task)
                if self._stopping.is_set():  # claimed as stop() came: given back at once
                    self._interrupt(self._runs[task.id], Interrupt.SHUTDOWN)
            if not tasks and tasks.retry_after_seconds is not None:
                # Refused, or the runtime held back (paused, at a limit), after the
                # reports it carried were applied: come back when the gateway says.
                await self._until_stopped(asyncio.sleep(tasks.retry_after_seconds))
                continue
            if reports:
                continue  # it did not wait for work: the next claim does
            early = opts.wait_seconds == 0 or time.monotonic() - asked < opts.wait_seconds / 2
            if not tasks and early:
                # Nothing, and sooner than the long poll should take (wait_seconds 0, or a
                # gateway shutting down answers at once): pause rather than spin.
                pause = IDLE_PAUSE_SECONDS * random.uniform(0.5, 1.0)
                await self._until_stopped(asyncio.sleep(pause))

    async def _claim(self, max_tasks: int, reports: list[_Report]) -> Claimed:
        """One claim, carrying `reports` if there are any. Such a claim does not wait for
        work (wait_seconds 0): the reports' outcomes come back at once, and stop()
        never cuts a request whose reports were applied (sent again, a fail would
        answer lease_lost). An empty answer is followed by a long poll at once."""
        opts = self.options
        if not reports:
            return await self.transport.claim(
                self.runtime,
                opts.worker_id,
                max_tasks=max_tasks,
                wait_seconds=opts.wait_seconds,
                lease_seconds=opts.lease_seconds,
            )
        return await self.transport.claim(
            self.runtime,
            opts.worker_id,
            max_tasks=max_tasks,
            wait_seconds=0,
            lease_seconds=opts.lease_seconds,
            complete=[r.item for r in reports if isinstance(r.item, Completion)],
            fail=[r.item for r in reports if isinstance(r.item, Failure)],
        )

    def _settle(self, reports: list[_Report], claimed: Claimed) -> None:
        """Hands each report its outcome from the claim's `acks` (completes first, as
        sent). A gateway that answered none (one that does not read reports on a claim)
        has applied none: they are sent on their own."""
        if not reports:
            return
        if len(claimed.acks) != len(reports):
            self._send_apart(reports)
            return
        ordered = [r for r in reports if isinstance(r.item, Completion)]
        ordered += [r for r in reports if isinstance(r.item, Failure)]
        for report, ack in zip(ordered, claimed.acks, strict=True):
            outcome = (Outcome.LEASE_LOST, "-") if ack.refused else (report.outcome, ack.outcome)
            if not report.done.done():
                report.done.set_result(outcome)

    def _send_apart(self, reports: list[_Report]) -> None:
        """Sends each report on its own (retried for a while, as any report), for those
        a claim did not carry to an answer."""
        for report in reports:
            job = asyncio.create_task(self._report_apart(report))
            self._apart.add(job)
            job.add_done_callback(self._apart.discard)

    async def _report_apart(self, report: _Report) -> None:
        try:
            outcome = await self._report_single(report.run)
        except Exception as exc:  # an answer this client cannot read: never hang
            log.error("task=%s not reported: %s", report.run.task.id, _describe(exc))
            outcome = (Outcome.UNREPORTED, "-")
        if not report.done.done():
            report.done.set_result(outcome)

    async def _until_stopped(self, aw: Awaitable[Any]) -> bool:
        """Waits for `aw` or stop(), whichever comes first; True if `aw` finished."""
        job = asyncio.ensure_future(aw)
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({job, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not job.done():
            job.cancel()
            return False
        return True

    def _start(self, task: Task) -> None:
        run = _Running(task, asyncio.create_task(self._call(task)), time.monotonic())
        job = asyncio.create_task(self._process(run), name=f"task-{task.id}")
        self._running[task.id] = job
        self._runs[task.id] = run
        self._slots.add(task.id)

        def finished(_: asyncio.Task[None]) -> None:
            self._running.pop(task.id, None)
            self._runs.pop(task.id, None)
            self._free_slot(task.id)

        job.add_done_callback(finished)

    def _free_slot(self, task_id: str) -> None:
        if task_id in self._slots:
            self._slots.discard(task_id)
            self._slot_freed.set()

    # -- one task ----------------------------------------------------------------

    async def _process(self, run: _Running) -> None:
        task = run.task
        # Batching: _heartbeat_all extends every held lease, this one's included.
        beat = None if self._batching else asyncio.create_task(self._heartbeat(run))
        try:
            try:
                await asyncio.wait({run.handler})
            finally:
                if not run.handler.done():  # this job itself was cancelled: no report
                    run.handler.cancel()
                    with contextlib.suppress(BaseException):
                        await run.handler
                self._handler_done.set()
            outcome, status = await self._hand_over(run)
        finally:
            # Only now: the lease is held until the report is answered.
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
        self.outcomes[outcome] += 1
        duration = time.monotonic() - run.started
        log.info(
            "task=%s runtime=%s attempt=%d duration_seconds=%.3f outcome=%s status=%s",
            task.id,
            task.runtime_id,
            task.attempts,
            duration,
            outcome,
            status,
            extra={
                "task_id": task.id,
                "runtime": task.runtime_id,
                "attempt": task.attempts,
                "duration_seconds": duration,
                "outcome": str(outcome),
            },
        )

    async def _call(self, task: Task) -> Any:
        return await self.handler(task)

    def _interrupt(self, run: _Running, why: Interrupt) -> None:
        """Cancels a running handler. A finished one's outcome is already decided and
        its report's answer says how the task ended, so it is left alone."""
        if run.handler.done():
            return
        if run.interrupt is None:
            run.interrupt = why
        run.handler.cancel()

    async def _heartbeat(self, run: _Running) -> None:
        """Extends the lease every third of its length until cancelled (once the report
        is answered); cancels a running handler on a requested cancel or a lost lease.
        Failed heartbeats are retried sooner."""
        lease = self.options.lease_seconds
        interval = lease / 3
        backoff = Backoff(base_seconds=min(0.5, interval / 4), cap_seconds=interval)
        delay = interval
        assert run.task.lease_id is not None
        while True:
            await asyncio.sleep(delay)
            try:
                answer = await self.transport.heartbeat(run.task.id, run.task.lease_id, lease)
            except (LeaseLost, NotFound):
                self._interrupt(run, Interrupt.LEASE_LOST)
                return
            except Exception as exc:
                delay = backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning("task=%s heartbeat failed (%s)", run.task.id, _describe(exc))
                continue
            backoff.reset()
            delay = interval
            if answer.cancel_requested and run.interrupt is None:
                # Beating goes on: the release may wait for room among the reports in
                # flight, and the lease must hold until it is answered.
                self._interrupt(run, Interrupt.CANCEL_REQUESTED)

    def _outcome(self, run: _Running) -> tuple[Outcome, Callable[[], Awaitable[Task]]]:
        """What to tell the gateway about a finished handler, and the call that does."""
        task, handler, tr = run.task, run.handler, self.transport
        lease_id = task.lease_id or ""
        if handler.cancelled():
            # A released task with a cancel requested ends `cancelled` (docs/design.md 4).
            cancelled = run.interrupt is Interrupt.CANCEL_REQUESTED
            return (
                Outcome.CANCELLED if cancelled else Outcome.RELEASED,
                functools.partial(tr.release, task.id, lease_id),
            )
        exc = handler.exception()
        if exc is None:
            return Outcome.COMPLETED, functools.partial(
                tr.complete, task.id, lease_id, handler.result()
            )
        failed = exc if isinstance(exc, TaskFailed) else TaskFailed(format_error(exc))
        return Outcome.FAILED, functools.partial(
            tr.fail,
            task.id,
            lease_id,
            format_error(failed),
            retry=failed.retry,
            retry_after_seconds=failed.retry_after_seconds,
        )

    def _report_item(self, run: _Running) -> tuple[Outcome, Completion | Failure]:
        """A finished handler's complete or fail, as a claim carries it (_outcome's
        call, as an item)."""
        task, handler = run.task, run.handler
        exc = handler.exception()
        if exc is None:
            return Outcome.COMPLETED, Completion(task.id, task.lease_id or "", handler.result())
        failed = exc if isinstance(exc, TaskFailed) else TaskFailed(format_error(exc))
        item = Failure(
            task.id,
            task.lease_id or "",
            format_error(failed),
            retry=failed.retry,
            retry_after_seconds=failed.retry_after_seconds,
        )
        return Outcome.FAILED, item

    async def _hand_over(self, run: _Running) -> tuple[Outcome, str]:
        """Frees the task's slot once there is room among the reports in flight, then
        reports. A lost lease is not reported: the task may be another daemon's by now."""
        if run.interrupt is Interrupt.LEASE_LOST:
            self._free_slot(run.task.id)
            return Outcome.LEASE_LOST, "-"
        async with self._report_room:
            self._free_slot(run.task.id)
            self._reports_in_flight += 1
            try:
                return await self._report(run)
            finally:
                self._reports_in_flight -= 1

    async def _report(self, run: _Running) -> tuple[Outcome, str]:
        """Tells the gateway how the task ended, retrying transient errors for a while:
        with the next claim when the claim loop is about to send one, else on its own."""
        handler = run.handler
        if self._claim_idle and not self._stopping.is_set() and not handler.cancelled():
            outcome, item = self._report_item(run)
            report = _Report(run, outcome, item, asyncio.get_running_loop().create_future())
            self._reports.append(report)
            return await report.done
        if self._batching and not handler.cancelled() and handler.exception() is None:
            waiting = _Completion(
                run, handler.result(), asyncio.get_running_loop().create_future(), time.monotonic()
            )
            self._completions.append(waiting)
            self._handler_done.set()
            return await waiting.done
        return await self._report_single(run)

    # -- batches (concurrency > 1) -------------------------------------------------

    async def _heartbeat_all(self) -> None:
        """Every third of a lease, extends every held lease (its handler running, or its
        report not yet answered) in one request; interrupts the running handlers whose
        lease is lost or whose task is to be cancelled. A failed request is retried
        sooner."""
        lease = self.options.lease_seconds
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
                if self._batch_calls:
                    answers = await self.transport.heartbeat_many(beats)
                else:
                    answers = await self._heartbeat_each(beats)
            except Exception as exc:
                if self._no_batch_calls(exc):
                    delay = 0
                    continue
                delay = backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning(
                    "runtime=%s heartbeat of %d lease(s) failed (%s)",
                    self.runtime,
                    len(beats),
                    _describe(exc),
                )
                continue
            backoff.reset()
            delay = interval
            for run, answer in zip(runs, answers, strict=False):
                if answer.refused:
                    self._interrupt(run, Interrupt.LEASE_LOST)
                elif answer.cancel_requested:
                    self._interrupt(run, Interrupt.CANCEL_REQUESTED)

    async def _heartbeat_each(self, beats: list[Beat]) -> list[ItemOutcome]:
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

    def _no_batch_calls(self, exc: BaseException) -> bool:
        """True the first time a batch call shows the gateway lacks it (an older one
        answers the whole request 404 or 405): the loop then makes single calls."""
        if not (self._batch_calls and isinstance(exc, NotFound | MethodNotAllowed)):
            return False
        log.warning(
            "runtime=%s the gateway has no batch calls (%s); using one call per task",
            self.runtime,
            _describe(exc),
        )
        self._batch_calls = False
        return True

    def _window(self) -> float:
        """How long a completion may wait for company: at most a sixth of a lease, so
        that waiting for company never costs a lease's worth of latency (the lease
        itself is heartbeated until the answer)."""
        return min(self.options.complete_window_seconds, self.options.lease_seconds / 6)

    def _ready(self) -> bool:
        """Whether the waiting completions should go now: no handler still runs (none
        could join them soon), the batch is full, the oldest has waited its window, or
        the loop is stopping at once."""
        if not self._completions:
            return False
        oldest = self._completions[0].since
        return (
            all(r.handler.done() for r in self._runs.values())
            or len(self._completions) >= MAX_BATCH
            or time.monotonic() - oldest >= self._window()
            or self._forced.is_set()
        )

    async def _send_completions(self) -> None:
        """Sends the waiting completions, a batch at a time, and hands each its outcome."""
        while True:
            while not self._ready():
                # Woken by a finished handler or a new completion; else when the
                # oldest completion's window ends.
                self._handler_done.clear()
                wait = None
                if self._completions:
                    ends = self._completions[0].since + self._window()
                    wait = max(0.0, ends - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._handler_done.wait(), wait)
            batch = self._completions[:MAX_BATCH]
            del self._completions[:MAX_BATCH]
            try:
                outcomes = await self._complete_batch(batch)
            except Exception as exc:  # an answer this client cannot read: never hang
                log.error("runtime=%s completions not reported: %s", self.runtime, _describe(exc))
                outcomes = [(Outcome.UNREPORTED, "-")] * len(batch)
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.done.done():
                    waiting.done.set_result(outcome)

    async def _complete_batch(self, batch: list[_Completion]) -> list[tuple[Outcome, str]]:
        """One request for the batch (a single complete for one item), retrying
        transient errors for a while, as _report does for one task."""
        if len(batch) == 1 or not self._batch_calls:
            return await self._report_each(batch)
        items = [Completion(w.run.task.id, w.run.task.lease_id or "", w.result) for w in batch]
        backoff = Backoff(base_seconds=0.2, cap_seconds=5.0)
        deadline = time.monotonic() + REPORT_RETRY_SECONDS
        while True:
            try:
                answers = await self.transport.complete_many(items)
            except GatewayError as exc:
                if self._no_batch_calls(exc):
                    return await self._report_each(batch)
                if not exc.retryable or time.monotonic() > deadline or self._forced.is_set():
                    log.error(
                        "runtime=%s %d completion(s) not reported: %s",
                        self.runtime,
                        len(items),
                        _describe(exc),
                    )
                    return [(Outcome.UNREPORTED, "-")] * len(batch)
                await asyncio.sleep(backoff.next_delay(exc.retry_after_seconds))
                continue
            if len(answers) != len(items):
                raise ValueError(f"{len(answers)} results for {len(items)} completions")
            return [
                (Outcome.LEASE_LOST, "-") if a.refused else (Outcome.COMPLETED, a.outcome)
                for a in answers
            ]

    async def _report_each(self, batch: list[_Completion]) -> list[tuple[Outcome, str]]:
        return list(await asyncio.gather(*(self._report_single(w.run) for w in batch)))

    async def _report_single(self, run: _Running) -> tuple[Outcome, str]:
        """_report's single call (complete, fail or release), retried for a while."""
        outcome, call = self._outcome(run)
        backoff = Backoff(base_seconds=0.2, cap_seconds=5.0)
        deadline = time.monotonic() + REPORT_RETRY_SECONDS
        while True:
            try:
                answer = await call()
                return outcome, answer.status
            except (LeaseLost, NotFound):
                return Outcome.LEASE_LOST, "-"
            except GatewayError as exc:
                if not exc.retryable or time.monotonic() > deadline or self._forced.is_set():
                    log.error("task=%s %s not reported: %s", run.task.id, outcome, _describe(exc))
                    return Outcome.UNREPORTED, "-"
                await asyncio.sleep(backoff.next_delay(exc.retry_after_seconds))

    # -- stopping ----------------------------------------------------------------

    async def _drain(self) -> None:
        """Waits for running handlers and reports in flight until grace_seconds pass
        or stop() comes again, then cancels the handlers that still run (each of those
        is released) and waits for every report to be answered."""
        if self._running:
            everything = asyncio.ensure_future(asyncio.wait(set(self._running.values())))
            forced = asyncio.ensure_future(self._forced.wait())
            await asyncio.wait(
                {everything, forced},
                timeout=self.options.grace_seconds,
                return_when=asyncio.FIRST_COMPLETED,
            )
            forced.cancel()
            everything.cancel()
        for run in list(self._runs.values()):
            self._interrupt(run, Interrupt.SHUTDOWN)
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
