"""The worker loop against an in-memory gateway: slots, heartbeats, cancels, lost
leases, backoff and Retry-After, and the drain on SIGTERM."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from typing import Any

from gateway_client import (
    Backoff,
    Outcome,
    Overloaded,
    Task,
    TaskFailed,
    TransportError,
    Worker,
    WorkerOptions,
)
from tests.support.fake_gateway import FakeGateway, run_until, worker


async def test_results_and_errors_are_reported():
    fake = FakeGateway()
    fake.add({"n": 1}, {"n": 2}, {"n": 3})

    async def handler(task: Task) -> Any:
        if task.payload["n"] == 2:
            raise ValueError("two is wrong")
        if task.payload["n"] == 3:
            raise TaskFailed("exit code 3", retry=False)
        return {"double": task.payload["n"] * 2}

    w = worker(fake, handler)
    await run_until(w, lambda: len(fake.named("complete")) + len(fake.named("fail")) == 3)
    [done] = fake.named("complete")
    assert done.args["result"] == {"double": 2}
    failed = {c.args["error"].split("\n")[0]: c.args for c in fake.named("fail")}
    assert failed["ValueError: two is wrong"]["retry"] is True
    assert "Traceback" in fake.named("fail")[0].args["error"]
    assert failed["exit code 3"] == {"task_id": failed["exit code 3"]["task_id"],
                                     "error": "exit code 3", "retry": False}  # fmt: skip
    assert w.outcomes == {Outcome.COMPLETED: 1, Outcome.FAILED: 2}


async def test_claims_only_free_slots_and_never_runs_more_than_concurrency():
    fake = FakeGateway()
    fake.add(*range(20))
    running = 0
    most = 0

    async def handler(task: Task) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1

    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=2)
    await run_until(w, lambda: len(fake.named("complete")) == 20)
    assert most == 3
    assert all(1 <= c.args["max_tasks"] <= 2 for c in fake.named("claim"))


async def test_heartbeats_every_third_of_the_lease():
    fake = FakeGateway()
    fake.add("slow")
    started = time.monotonic()

    async def handler(task: Task) -> None:
        await asyncio.sleep(1.2)

    w = worker(fake, handler, lease_seconds=1)
    await run_until(w, lambda: fake.named("complete"))
    beats = [c.at - started for c in fake.named("heartbeat")]
    assert 3 <= len(beats) <= 4, beats
    assert beats[0] >= 0.3
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert all(0.25 < g < 0.5 for g in gaps), gaps


async def test_a_requested_cancel_stops_the_handler_and_releases_the_task():
    fake = FakeGateway()
    [task] = fake.add("long")
    stopped = asyncio.Event()

    async def handler(task: Task) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    w = worker(fake, handler, lease_seconds=1)
    job = asyncio.create_task(w.run())
    await asyncio.sleep(0.1)
    fake.cancelled.add(task.id)
    await asyncio.wait_for(stopped.wait(), 2)  # at the next heartbeat, within a third of 1 s
    w.stop()
    await asyncio.wait_for(job, 5)
    assert [c.name for c in fake.calls if c.name in ("complete", "fail", "release")] == ["release"]
    assert w.outcomes == {Outcome.CANCELLED: 1}


async def test_a_lost_lease_stops_the_handler_and_reports_nothing():
    fake = FakeGateway()
    [task] = fake.add("long")
    stopped = asyncio.Event()

    async def handler(task: Task) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    w = worker(fake, handler, lease_seconds=1)
    job = asyncio.create_task(w.run())
    await asyncio.sleep(0.1)
    fake.lost.add(task.id)
    await asyncio.wait_for(stopped.wait(), 2)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert not [c for c in fake.calls if c.name in ("complete", "fail", "release")]
    assert w.outcomes == {Outcome.LEASE_LOST: 1}


async def test_a_failed_heartbeat_is_retried_before_the_lease_runs_out():
    fake = FakeGateway()
    fake.add("x")
    fake.heartbeat_errors = [TransportError("down"), TransportError("down")]

    async def handler(task: Task) -> None:
        # Until the third heartbeat (4 s at most), not a fixed time: on a loaded machine
        # a fixed 0.8 s could end before the retries were due.
        for _ in range(80):
            if len(fake.named("heartbeat")) >= 3:
                return
            await asyncio.sleep(0.05)

    w = worker(fake, handler, lease_seconds=1)
    await run_until(w, lambda: fake.named("complete"), within=10)
    assert len(fake.named("heartbeat")) >= 3  # the two failures, then a success
    assert w.outcomes == {Outcome.COMPLETED: 1}


async def test_claim_errors_back_off_with_jitter_and_honour_retry_after():
    fake = FakeGateway()
    fake.claim_errors = [Overloaded("busy", status=429, retry_after_seconds=0.4)]
    fake.claim_errors += [TransportError("refused") for _ in range(3)]
    delays: list[float] = []
    backoff = Backoff(base_seconds=0.05, cap_seconds=1.0, rng=lambda: 0.5)
    real = backoff.next_delay

    def recording(retry_after_seconds: float | None = None) -> float:
        delays.append(real(retry_after_seconds))
        return delays[-1]

    backoff.next_delay = recording  # type: ignore[method-assign]
    w = Worker(fake, "rt", lambda t: asyncio.sleep(0), WorkerOptions(wait_seconds=0.05),
               backoff=backoff)  # fmt: skip
    await run_until(w, lambda: len(fake.named("claim")) >= 6)
    claims = [c.at for c in fake.named("claim")]
    assert claims[1] - claims[0] >= 0.4  # Retry-After
    assert delays == [0.4, 0.1, 0.2, 0.4]  # then half of 0.05 * 2**n: the jitter's ceiling grows
    assert backoff.failures == 0  # reset by the first answer


async def test_errors_never_spin_the_loop():
    fake = FakeGateway()
    fake.claim_errors = [TransportError("refused") for _ in range(1000)]
    w = Worker(fake, "rt", lambda t: asyncio.sleep(0), WorkerOptions(wait_seconds=0),
               backoff=Backoff(base_seconds=0.001, cap_seconds=0.001, rng=lambda: 0.0))  # fmt: skip
    job = asyncio.create_task(w.run())
    await asyncio.sleep(0.5)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert len(fake.named("claim")) <= 11  # one per 50 ms floor at most


async def test_sigterm_stops_claiming_and_lets_running_handlers_finish():
    fake = FakeGateway()
    fake.add(*range(4))
    started = asyncio.Event()

    async def handler(task: Task) -> str:
        started.set()
        await asyncio.sleep(0.5)
        return "done"

    w = worker(fake, handler, concurrency=2, max_tasks_per_poll=2)
    w.install_signal_handlers()
    try:
        job = asyncio.create_task(w.run())
        await asyncio.wait_for(started.wait(), 2)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
        claims = len(fake.named("claim"))
        await asyncio.wait_for(job, 5)
    finally:
        w.remove_signal_handlers()
    assert len(fake.named("claim")) == claims
    assert len(fake.named("complete")) == 2 and len(fake.queue) == 2
    assert not fake.leases  # nothing left claimed


async def test_handlers_past_the_grace_are_released():
    fake = FakeGateway()
    fake.add("stuck")
    cancelled = asyncio.Event()

    async def handler(task: Task) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    w = worker(fake, handler, grace_seconds=0.3)
    job = asyncio.create_task(w.run())
    while not w.running:
        await asyncio.sleep(0.01)
    begun = time.monotonic()
    w.stop()
    await asyncio.wait_for(job, 5)
    assert 0.3 <= time.monotonic() - begun < 2
    assert cancelled.is_set() and len(fake.named("release")) == 1
    assert w.outcomes == {Outcome.RELEASED: 1}


async def test_a_second_stop_releases_at_once():
    fake = FakeGateway()
    fake.add("stuck")

    async def handler(task: Task) -> None:
        await asyncio.sleep(30)

    w = worker(fake, handler, grace_seconds=30)
    w.install_signal_handlers()
    try:
        job = asyncio.create_task(w.run())
        while not w.running:
            await asyncio.sleep(0.01)
        begun = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.1)
        assert not job.done()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(job, 5)
    finally:
        w.remove_signal_handlers()
    assert time.monotonic() - begun < 1
    assert len(fake.named("release")) == 1 and not fake.leases


async def test_a_lost_lease_on_report_is_not_retried():
    fake = FakeGateway()
    [task] = fake.add("x")

    async def handler(t: Task) -> None:
        fake.lost.add(t.id)

    w = worker(fake, handler)
    await run_until(w, lambda: fake.named("complete"))
    assert len(fake.named("complete")) == 1 and task.id in fake.lost
    assert w.outcomes == {Outcome.LEASE_LOST: 1}


async def test_empty_answers_that_come_early_do_not_spin_the_loop():
    fake = FakeGateway()  # no tasks, and wait_seconds 0: every answer is empty at once
    w = worker(fake, lambda t: asyncio.sleep(0), wait_seconds=0)
    job = asyncio.create_task(w.run())
    await asyncio.sleep(1.2)
    fake.add("late")
    await asyncio.sleep(1.2)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert len(fake.named("complete")) == 1
    # A pause of 0.5-1 s after each empty answer; only the claims right after the task
    # came (one at once, one carrying its report) may follow the one before sooner. A
    # spinning loop would make hundreds. Gaps, not a count: a loaded machine only
    # stretches them.
    at = [call.at for call in fake.named("claim")]
    quick = [b - a for a, b in itertools.pairwise(at) if b - a < 0.45]
    assert len(at) >= 3 and len(quick) <= 2, (len(at), quick)
