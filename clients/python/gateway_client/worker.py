"""The worker loop, `Worker`: long-poll one runtime, run up to `concurrency` handlers
at once, and hand each finished task to its report. Times are in seconds.

- A claim asks only for free slots (`max_tasks` = free slots, at most
  `max_tasks_per_poll`), and only when a slot is free. A task holds a slot while its
  handler runs; once the handler has finished and its outcome is handed to the
  reporter, the slot is free, so the next claim goes out while that report is in
  flight.
- Each held lease is heartbeated until its report is answered (heartbeats.py), and
  each outcome reported: on its own, in a batch, or with the next claim (reports.py).
  A claim that carries reports does not wait for work, so that the reports' outcomes
  come back at once; after an empty answer a long poll follows at once.
- Errors and network failures back off with full jitter, at least as long as a
  `Retry-After` says; the loop never spins.
- `stop()` (SIGTERM, SIGINT) stops claiming at once and lets running handlers finish
  within `grace_seconds`; what still runs then is cancelled and released. A second
  `stop()` does that at once. Either way `run()` returns only once every report in
  flight is answered (or has given up retrying), so nothing is dropped on SIGTERM.

- With OpenTelemetry and a tracer provider set, each task gets a consumer span, from
  its claim until its report is answered, and its handler runs inside it (tracing/spans.py).

The `Worker` owns the held tasks (from claim to answered report), their consumer
spans, the slots and the stop events; its `Heartbeats` and `Reporter` read them.
`WorkerOptions`, `Outcome`, `Transport` and `Handler` are importable from here as well
as from their own modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable
from typing import Any

from .backoff import Backoff
from .heartbeats import Heartbeats
from .models import Claimed, Completion, Failure, Task
from .options import WorkerOptions
from .reports import APPLIED_NOTHING, Report, Reporter
from .runs import Interrupt, Outcome, Running, interrupt
from .tracing.spans import ConsumerSpan, start_consumer_span
from .transport import BatchCalls, Handler, Transport, describe, log

__all__ = ["Handler", "Outcome", "Transport", "Worker", "WorkerOptions"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After an empty answer that came early; a long poll's empty answer is claimed again at once.
IDLE_PAUSE_SECONDS = 1.0


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
        tracer_provider: Any = None,
    ) -> None:
        """`tracer_provider`: an OpenTelemetry TracerProvider for the consumer spans;
        by default the one the application set globally, and none when it set none."""
        self.transport = transport
        self.runtime = runtime
        self.handler = handler
        self.options = options or WorkerOptions()
        self.outcomes: Counter[Outcome] = Counter()
        self._backoff = backoff or Backoff()
        self._tracer_provider = tracer_provider
        # Every held task, from its claim until its report is answered.
        self._running: dict[str, asyncio.Task[None]] = {}
        self._runs: dict[str, Running] = {}
        # The tasks holding a slot: their handler runs, or waits for room to report.
        self._slots: set[str] = set()
        self._stopping = asyncio.Event()
        self._forced = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # Several leases may be held at once: heartbeats and completions go in batches.
        self._batching = self.options.concurrency > 1
        batch_calls = BatchCalls(runtime)
        self._heartbeats = Heartbeats(
            transport, runtime, self.options.lease_seconds, self._runs, batch_calls
        )
        self._reporter = Reporter(
            transport,
            runtime,
            self.options,
            runs=self._runs,
            batch_calls=batch_calls,
            stopping=self._stopping,
            forced=self._forced,
        )

    @property
    def running(self) -> int:
        """Tasks holding a slot: their handler runs, or has finished and waits for
        room among the reports in flight."""
        return len(self._slots)

    @property
    def reporting(self) -> int:
        """Outcomes handed to the reporter and not yet answered (queued or sent)."""
        return self._reporter.in_flight

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
                asyncio.create_task(self._heartbeats.beat_all(), name="heartbeats"),
                asyncio.create_task(self._reporter.send_completions(), name="completions"),
            ]
        try:
            await self._claim_loop()
        finally:
            self._stopping.set()
            # Reports no claim will carry now go on their own.
            self._reporter.send_apart(self._reporter.take_for_claim())
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
                self._reporter.claim_idle = opts.reports_with_claims
                try:
                    await self._until_stopped(self._slot_freed.wait())
                finally:
                    self._reporter.claim_idle = False
                continue
            reports = self._reporter.take_for_claim()
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
                # A claim refused before any work applied none of its reports; any other
                # failure may have come after the gateway applied them.
                self._reporter.send_apart(reports, not isinstance(exc, APPLIED_NOTHING))
                delay = self._backoff.next_delay(getattr(exc, "retry_after_seconds", None))
                log.warning(
                    "runtime=%s claim failed (%s); retrying in %.2fs",
                    self.runtime,
                    describe(exc),
                    delay,
                )
                await self._until_stopped(asyncio.sleep(delay))
                continue
            self._reporter.settle(reports, tasks)
            self._backoff.reset()
            for task in tasks:
                self._start(task)
                if self._stopping.is_set():  # claimed as stop() came: given back at once
                    interrupt(self._runs[task.id], Interrupt.SHUTDOWN)
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

    async def _claim(self, max_tasks: int, reports: list[Report]) -> Claimed:
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
        span = start_consumer_span(task, self.options.worker_id, self._tracer_provider)
        handler = asyncio.create_task(self._call(task, span))
        run = Running(task, handler, time.monotonic(), span=span)
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

    async def _process(self, run: Running) -> None:
        task = run.task
        # Batching: Heartbeats.beat_all extends every held lease, this one's included.
        beat = None if self._batching else asyncio.create_task(self._heartbeats.beat(run))
        try:
            try:
                await asyncio.wait({run.handler})
            finally:
                if not run.handler.done():  # this job itself was cancelled: no report
                    run.handler.cancel()
                    with contextlib.suppress(BaseException):
                        await run.handler
                self._reporter.handler_finished()
            outcome, status = await self._reporter.hand_over(run, self._free_slot)
        except BaseException:
            # Cut short (cancelled): no outcome came, and none was reported.
            if run.span is not None:
                run.span.end(Outcome.UNREPORTED, "-")
            raise
        finally:
            # Only now: the lease is held until the report is answered.
            if beat is not None:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat
        self.outcomes[outcome] += 1
        if run.span is not None:
            failed = run.handler.exception() if outcome is Outcome.FAILED else None
            run.span.end(outcome, status, failed)
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

    async def _call(self, task: Task, span: ConsumerSpan | None) -> Any:
        """The handler, inside the task's consumer span if there is one: the spans it
        makes are that span's children. It runs in an asyncio task of its own, so the
        span is current there only."""
        if span is None:
            return await self.handler(task)
        with span.active():
            return await self.handler(task)

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
            interrupt(run, Interrupt.SHUTDOWN)
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)
