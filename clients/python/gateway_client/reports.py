"""Reports: how the worker loop tells the gateway how each finished task ended, and
hands the answer back to the task's loop as an (`Outcome`, gateway status) pair.

- A handler's return value completes the task; its exception fails it (type, message
  and the end of the traceback, bounded), retryable unless it is
  `TaskFailed(retry=False)`. A cancelled handler's task is released.
- Reports in flight (handed over, queued or sent, not yet answered) are at most
  `concurrency`: a finished handler waits for room, keeping its slot, so the leases
  held never exceed 2 x `concurrency`. A lost lease is not reported.
- A finished task's report (its complete or fail) rides on the next claim when that
  claim goes out at once: when every slot was busy and this one freed while the
  others keep running (with one slot, always). The claim's answer says how each
  report ended (`acks`); should the claim fail, or a gateway answer no `acks`, the
  reports are sent on their own (a repeat is safe). Otherwise, as while a claim is
  parked, a report goes on its own at once, never waiting for a claim.
- With `concurrency` > 1, completions are gathered and sent together
  (`complete_many`): as soon as no other handler is still running, else after
  `complete_window_seconds`, at most a sixth of a lease. A gateway without the batch
  endpoints (404 or 405 for the whole request) gets single calls instead.
- A report is retried on transient errors, with full jitter, for at most
  `REPORT_RETRY_SECONDS`, or until stop() comes a second time; then its task counts
  as UNREPORTED and its lease lapses.

The `Worker` owns the held tasks and the stop events; the `Reporter` owns what waits
to be reported (the room, the completions waiting for company, the reports waiting for
a claim) and reads the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .backoff import Backoff
from .errors import DatabaseBusy, Draining, GatewayError, LeaseLost, NotFound, Overloaded
from .failure import TaskFailed, format_error
from .models import Claimed, Completion, Failure, Task
from .options import WorkerOptions
from .runs import Interrupt, Outcome, Running
from .transport import BatchCalls, Transport, describe, log

# Refusals that come before the gateway does anything: a report refused so was not
# applied.
APPLIED_NOTHING = (Overloaded, DatabaseBusy, Draining)

# A report (complete, fail, release) is retried this long at most after a failure.
REPORT_RETRY_SECONDS = 30.0
MAX_BATCH = 1000  # items per batch request, the gateway's limit


@dataclass
class _Completion:
    """A finished handler's result waiting to be sent with others; `done` receives
    what Reporter._report returns for it."""

    run: Running
    result: Any
    done: asyncio.Future[tuple[Outcome, str]]
    since: float  # time.monotonic() as it began to wait


@dataclass
class Report:
    """A finished task's complete or fail waiting for the next claim to carry it;
    `done` receives what Reporter._report returns for it."""

    run: Running
    outcome: Outcome  # COMPLETED or FAILED
    item: Completion | Failure
    done: asyncio.Future[tuple[Outcome, str]]


class Reporter:
    """Reports the finished tasks of one worker loop. `runs` is the loop's held tasks
    by task id, and `stopping` and `forced` its first and second stop()."""

    def __init__(
        self,
        transport: Transport,
        runtime: str,
        options: WorkerOptions,
        *,
        runs: Mapping[str, Running],
        batch_calls: BatchCalls,
        stopping: asyncio.Event,
        forced: asyncio.Event,
    ) -> None:
        self.transport = transport
        self.runtime = runtime
        self.options = options
        self._runs = runs
        self._batch_calls = batch_calls
        self._stopping = stopping
        self._forced = forced
        # Room among the reports in flight, so that they and the leases they hold stay
        # bounded however fast handlers finish.
        self._room = asyncio.Semaphore(options.concurrency)
        self.in_flight = 0
        # Several leases may be held at once: completions go in batches.
        self._batching = options.concurrency > 1
        self._completions: list[_Completion] = []
        self._handler_done = asyncio.Event()  # a handler finished, or a completion waits
        # Reports for the next claim to carry, taken while the claim loop waits for a
        # free slot (`claim_idle`, which the loop sets): that claim then goes out at once.
        self._reports: list[Report] = []
        self.claim_idle = False
        self._apart: set[asyncio.Task[None]] = set()  # reports sent on their own instead

    def handler_finished(self) -> None:
        """Called as any handler finishes: the completions waiting for company may go."""
        self._handler_done.set()

    async def hand_over(
        self, run: Running, free_slot: Callable[[str], None]
    ) -> tuple[Outcome, str]:
        """Frees the task's slot (`free_slot(task_id)`) once there is room among the
        reports in flight, then reports. A lost lease is not reported: the task may be
        another daemon's by now."""
        if run.interrupt is Interrupt.LEASE_LOST:
            free_slot(run.task.id)
            return Outcome.LEASE_LOST, "-"
        async with self._room:
            free_slot(run.task.id)
            self.in_flight += 1
            try:
                return await self._report(run)
            finally:
                self.in_flight -= 1

    async def _report(self, run: Running) -> tuple[Outcome, str]:
        """Tells the gateway how the task ended, retrying transient errors for a while:
        with the next claim when the claim loop is about to send one, else on its own."""
        handler = run.handler
        if self.claim_idle and not self._stopping.is_set() and not handler.cancelled():
            outcome, item = self._report_item(run)
            report = Report(run, outcome, item, asyncio.get_running_loop().create_future())
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

    def _outcome(self, run: Running) -> tuple[Outcome, Callable[[], Awaitable[Task]]]:
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

    def _report_item(self, run: Running) -> tuple[Outcome, Completion | Failure]:
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

    async def _report_single(self, run: Running, sent_before: bool = False) -> tuple[Outcome, str]:
        """_report's single call (complete, fail or release), retried for a while.
        `sent_before`: the report went out already (with a claim) and may have been
        applied, its answer lost."""
        outcome, call = self._outcome(run)
        backoff = Backoff(base_seconds=0.2, cap_seconds=5.0)
        deadline = time.monotonic() + REPORT_RETRY_SECONDS
        while True:
            try:
                answer = await call()
                return outcome, answer.status
            except (LeaseLost, NotFound):
                if sent_before:
                    # A complete sent again is answered `completed` again; a fail or a
                    # release is not: the first send most likely applied it.
                    log.info(
                        "task=%s %s: an earlier send whose answer was lost most likely "
                        "applied it (the lease no longer holds the task)",
                        run.task.id,
                        outcome,
                    )
                    return outcome, "unknown"
                return Outcome.LEASE_LOST, "-"
            except GatewayError as exc:
                if not exc.retryable or time.monotonic() > deadline or self._forced.is_set():
                    log.error("task=%s %s not reported: %s", run.task.id, outcome, describe(exc))
                    return Outcome.UNREPORTED, "-"
                # Refused before any work (overload, a shed request, shutdown), it did
                # nothing; any other failure may have come after the gateway applied it.
                sent_before = sent_before or not isinstance(exc, APPLIED_NOTHING)
                await asyncio.sleep(backoff.next_delay(exc.retry_after_seconds))

    # -- carried by a claim --------------------------------------------------------

    def take_for_claim(self) -> list[Report]:
        """The reports waiting for a claim, for the claim about to go out to carry;
        the claim hands them to settle() or send_apart() with its answer."""
        reports, self._reports = self._reports, []
        return reports

    def settle(self, reports: list[Report], claimed: Claimed) -> None:
        """Hands each report its outcome from the claim's `acks` (completes first, as
        sent). A gateway that answered none (one that does not read reports on a claim)
        has applied none: they are sent on their own."""
        if not reports:
            return
        if len(claimed.acks) != len(reports):
            self.send_apart(reports)
            return
        ordered = [r for r in reports if isinstance(r.item, Completion)]
        ordered += [r for r in reports if isinstance(r.item, Failure)]
        for report, ack in zip(ordered, claimed.acks, strict=True):
            outcome = (Outcome.LEASE_LOST, "-") if ack.refused else (report.outcome, ack.outcome)
            if not report.done.done():
                report.done.set_result(outcome)

    def send_apart(self, reports: list[Report], sent_before: bool = False) -> None:
        """Sends each report on its own (retried for a while, as any report), for those
        a claim did not carry to an answer. `sent_before`: that claim went out and got
        no answer, so it may have applied them."""
        for report in reports:
            job = asyncio.create_task(self._report_apart(report, sent_before))
            self._apart.add(job)
            job.add_done_callback(self._apart.discard)

    async def _report_apart(self, report: Report, sent_before: bool) -> None:
        try:
            outcome = await self._report_single(report.run, sent_before)
        except Exception as exc:  # an answer this client cannot read: never hang
            log.error("task=%s not reported: %s", report.run.task.id, describe(exc))
            outcome = (Outcome.UNREPORTED, "-")
        if not report.done.done():
            report.done.set_result(outcome)

    # -- batches (concurrency > 1) -------------------------------------------------

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

    async def send_completions(self) -> None:
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
                log.error("runtime=%s completions not reported: %s", self.runtime, describe(exc))
                outcomes = [(Outcome.UNREPORTED, "-")] * len(batch)
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if not waiting.done.done():
                    waiting.done.set_result(outcome)

    async def _complete_batch(self, batch: list[_Completion]) -> list[tuple[Outcome, str]]:
        """One request for the batch (a single complete for one item), retrying
        transient errors for a while, as _report does for one task."""
        if len(batch) == 1 or not self._batch_calls.available:
            return await self._report_each(batch)
        items = [Completion(w.run.task.id, w.run.task.lease_id or "", w.result) for w in batch]
        backoff = Backoff(base_seconds=0.2, cap_seconds=5.0)
        deadline = time.monotonic() + REPORT_RETRY_SECONDS
        while True:
            try:
                answers = await self.transport.complete_many(items)
            except GatewayError as exc:
                if self._batch_calls.lacking(exc):
                    return await self._report_each(batch)
                if not exc.retryable or time.monotonic() > deadline or self._forced.is_set():
                    log.error(
                        "runtime=%s %d completion(s) not reported: %s",
                        self.runtime,
                        len(items),
                        describe(exc),
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
