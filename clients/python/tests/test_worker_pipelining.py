"""The worker loop frees a task's slot once its outcome is handed to the reporter: the
next claim goes out while completions are in flight, at most `concurrency` of them,
each lease heartbeated until its completion is answered, and stop() waiting for every
one. The in-memory gateway holds completions unanswered to show each of these; every
test runs with one slot (single calls) and with three (batches)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from gateway_client import Outcome, Task, Worker
from tests.support.fake_gateway import FakeGateway
from tests.support.fake_gateway import worker as fake_worker


def worker(fake: FakeGateway, handler: Any, **options: Any) -> Worker:
    """The worker loop with every report sent on its own, the path this file tests (a
    claim carrying reports is test_worker_reports.py's)."""
    return fake_worker(fake, handler, reports_with_claims=False, **options)


CONCURRENCY = [1, 3]


async def until(condition: Any, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def echo(task: Task) -> Any:
    return task.payload


@pytest.mark.parametrize("concurrency", CONCURRENCY)
async def test_the_next_claim_goes_out_while_a_completion_is_unanswered(concurrency: int):
    fake = FakeGateway(hold=asyncio.Event())
    first = fake.add(*range(concurrency))
    handled: list[str] = []

    async def handler(task: Task) -> Any:
        handled.append(task.id)
        return task.payload

    w = worker(fake, handler, concurrency=concurrency, max_tasks_per_poll=concurrency)
    job = asyncio.create_task(w.run())
    await until(lambda: len(fake.held) == concurrency)
    second = fake.add(*range(concurrency))
    # A claim after the first (parked, or sent since) takes the new tasks and runs
    # them while the first completions are still held.
    await until(lambda: all(t.id in handled for t in second))
    assert fake.held == {t.id for t in first}
    assert len(fake.named("claim")) >= 2
    assert not fake.named("complete")  # none answered yet
    fake.hold.set()
    await until(lambda: sum(w.outcomes.values()) == 2 * concurrency)
    w.stop()
    await asyncio.wait_for(job, 5)
    done = [c.args["task_id"] for c in fake.named("complete")]
    assert sorted(done) == sorted(t.id for t in first + second)  # each once
    assert w.outcomes == {Outcome.COMPLETED: 2 * concurrency}
    assert not fake.leases


@pytest.mark.parametrize("concurrency", CONCURRENCY)
async def test_completions_in_flight_never_exceed_concurrency(concurrency: int):
    """With every completion held, the loop claims one slot's worth more and stops
    there: `concurrency` reports in flight, `concurrency` finished handlers waiting for
    room in their slots, nothing else claimed."""
    fake = FakeGateway(hold=asyncio.Event())
    fake.add(*range(10 * concurrency))
    w = worker(fake, echo, concurrency=concurrency, max_tasks_per_poll=concurrency)
    job = asyncio.create_task(w.run())
    await until(lambda: len(fake.leases) >= 2 * concurrency)
    await asyncio.sleep(0.3)  # room for anything more to go out
    assert len(fake.held) == concurrency and w.reporting == concurrency
    assert len(fake.leases) == 2 * concurrency and w.running == concurrency
    assert len(fake.queue) == 8 * concurrency
    fake.hold.set()
    await until(lambda: sum(w.outcomes.values()) == 10 * concurrency)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert fake.most_held == concurrency
    assert len(fake.named("complete")) == 10 * concurrency
    assert w.outcomes == {Outcome.COMPLETED: 10 * concurrency}


@pytest.mark.parametrize("concurrency", CONCURRENCY)
async def test_stop_waits_for_every_completion_in_flight(concurrency: int):
    """Even past the grace period: a held completion is answered, not dropped."""
    fake = FakeGateway(hold=asyncio.Event())
    tasks = fake.add(*range(concurrency))
    w = worker(fake, echo, concurrency=concurrency, max_tasks_per_poll=concurrency,
               grace_seconds=0.2)  # fmt: skip
    job = asyncio.create_task(w.run())
    await until(lambda: len(fake.held) == concurrency)
    w.stop()
    await asyncio.sleep(0.6)
    assert not job.done(), "run() returned with completions unanswered"
    fake.hold.set()
    await asyncio.wait_for(job, 5)
    assert sorted(c.args["task_id"] for c in fake.named("complete")) == sorted(t.id for t in tasks)
    assert w.outcomes == {Outcome.COMPLETED: concurrency}
    assert not fake.named("release") and not fake.leases


@pytest.mark.parametrize("concurrency", CONCURRENCY)
async def test_a_lease_whose_completion_waits_is_heartbeated_until_the_answer(concurrency: int):
    """Leases of 1 s that lapse, completions held for 2 s: each lease is extended every
    third of a second meanwhile, and each completion is answered `completed`."""
    fake = FakeGateway(hold=asyncio.Event(), expire_leases=True)
    tasks = fake.add(*range(concurrency))
    w = worker(fake, echo, concurrency=concurrency, max_tasks_per_poll=concurrency,
               lease_seconds=1)  # fmt: skip
    job = asyncio.create_task(w.run())
    await until(lambda: len(fake.held) == concurrency)
    held_since = time.monotonic()
    await asyncio.sleep(2.0)
    fake.hold.set()
    await until(lambda: sum(w.outcomes.values()) == concurrency)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert w.outcomes == {Outcome.COMPLETED: concurrency}  # no lease lapsed
    for task in tasks:
        beats = [held_since] + [
            c.at for c in fake.named("heartbeat")
            if c.args["task_id"] == task.id and c.at > held_since
        ]  # fmt: skip
        assert len(beats) >= 5, beats  # about six in 2 s
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        assert max(gaps) < 0.6, gaps


@pytest.mark.parametrize("concurrency", CONCURRENCY)
async def test_a_completion_answered_lease_lost_changes_nothing_else(concurrency: int):
    """While the first tasks' completions are held, the next tasks run; the held ones
    then come back `lease_lost`, and the running handlers go on and complete."""
    fake = FakeGateway(hold=asyncio.Event())
    first = fake.add(*range(concurrency))
    gate = asyncio.Event()
    cancelled: list[str] = []

    async def handler(task: Task) -> Any:
        if task.payload == "next":
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled.append(task.id)
                raise
        return task.payload

    w = worker(fake, handler, concurrency=concurrency, max_tasks_per_poll=concurrency)
    job = asyncio.create_task(w.run())
    await until(lambda: len(fake.held) == concurrency)
    second = fake.add(*(["next"] * concurrency))
    await until(lambda: w.running == concurrency and not fake.queue)
    fake.lost.update(t.id for t in first)
    fake.hold.set()
    await until(lambda: w.outcomes[Outcome.LEASE_LOST] == concurrency)
    assert w.running == concurrency and not cancelled  # the next handlers still run
    gate.set()
    await until(lambda: w.outcomes[Outcome.COMPLETED] == concurrency)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert w.outcomes == {Outcome.LEASE_LOST: concurrency, Outcome.COMPLETED: concurrency}
    completed = {t.id for t in second}
    assert {c.args["task_id"] for c in fake.named("complete")} >= completed
    assert not fake.named("release") and not cancelled


async def test_a_cancel_requested_task_waiting_for_room_to_report_keeps_its_lease() -> None:
    """One slot: A's completion is held unanswered, B is claimed meanwhile and a cancel
    is requested for it. B's release waits for A's report to leave room; B's lease must
    be heartbeated all that time, or it lapses and the release answers lease_lost."""
    fake = FakeGateway(hold=asyncio.Event(), expire_leases=True)
    (a,) = fake.add("a")
    started = asyncio.Event()

    async def handler(task: Task) -> Any:
        if task.payload == "b":
            started.set()
            await asyncio.sleep(3600)
        return task.payload

    w = worker(fake, handler, concurrency=1, lease_seconds=3)
    job = asyncio.create_task(w.run())
    await until(lambda: a.id in fake.held)
    (b,) = fake.add("b")
    await asyncio.wait_for(started.wait(), 5)
    fake.cancelled.add(b.id)
    await asyncio.sleep(5)  # past B's 3 s lease, A's completion still held
    fake.hold.set()
    await until(lambda: sum(w.outcomes.values()) == 2, within=10)
    w.stop()
    await asyncio.wait_for(job, 10)
    assert w.outcomes[Outcome.COMPLETED] == 1, w.outcomes
    assert w.outcomes[Outcome.CANCELLED] == 1, w.outcomes
