"""The worker loop's batches (concurrency > 1) against an in-memory gateway: every held
lease heartbeated in one request, completions sent together, a completion never kept
waiting for a long handler, and refusals and errors per item."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway_client import Outcome, Task, TransportError, Worker
from tests.support.fake_gateway import FakeGateway, run_until
from tests.support.fake_gateway import worker as fake_worker


def worker(fake: FakeGateway, handler: Any, **options: Any) -> Worker:
    """The worker loop with every report sent on its own, the path this file tests (a
    claim carrying reports is test_worker_reports.py's)."""
    return fake_worker(fake, handler, reports_with_claims=False, **options)


async def test_completions_that_finish_together_share_one_request():
    fake = FakeGateway()
    fake.add(*range(10))
    gate = asyncio.Event()

    async def handler(task: Task) -> Any:
        await gate.wait()
        return task.payload

    w = worker(fake, handler, concurrency=10, max_tasks_per_poll=10)
    job = asyncio.create_task(run_until(w, lambda: len(fake.named("complete")) == 10))
    while w.running < 10:
        await asyncio.sleep(0.01)
    gate.set()
    await job
    [batch] = fake.named("complete_many")
    assert len(batch.args["task_ids"]) == 10
    results = sorted(c.args["result"] for c in fake.named("complete"))
    assert results == list(range(10))  # each task once, with its own result
    assert w.outcomes == {Outcome.COMPLETED: 10}


async def test_a_completion_does_not_wait_for_a_long_handler():
    """With a window far longer than the lease allows, the quick task's completion is
    still sent while the slow handler runs: the window is capped at a sixth of a lease."""
    fake = FakeGateway()
    quick, slow = fake.add("quick", "slow")
    slow_done = asyncio.Event()

    async def handler(task: Task) -> None:
        if task.payload == "slow":
            await asyncio.sleep(1.5)
            slow_done.set()

    w = worker(fake, handler, concurrency=2, lease_seconds=1, complete_window_seconds=60)
    job = asyncio.create_task(w.run())
    while not [c for c in fake.named("complete") if c.args["task_id"] == quick.id]:
        assert not slow_done.is_set(), "the quick completion waited for the slow handler"
        await asyncio.sleep(0.01)
    await asyncio.wait_for(slow_done.wait(), 5)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert [c.args["task_id"] for c in fake.named("complete")] == [quick.id, slow.id]
    assert w.outcomes == {Outcome.COMPLETED: 2}


async def test_every_held_lease_is_heartbeated_in_one_request():
    fake = FakeGateway()
    fake.add(*range(3))

    async def handler(task: Task) -> None:
        await asyncio.sleep(1.2)

    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=3, lease_seconds=1)
    await run_until(w, lambda: len(fake.named("complete")) == 3)
    beats = fake.named("heartbeat_many")
    assert 3 <= len(beats) <= 4, beats
    assert all(len(b.args["task_ids"]) == 3 for b in beats)
    # Every heartbeat went in a batch: none was sent on its own.
    assert len(fake.named("heartbeat")) == 3 * len(beats)


async def test_a_lease_lost_or_a_cancel_in_a_heartbeat_batch_stops_only_that_handler():
    fake = FakeGateway()
    lost, cancelled, fine = fake.add("lost", "cancelled", "fine")
    stopped: list[str] = []

    async def handler(task: Task) -> str:
        if task.payload == "fine":
            await asyncio.sleep(0.6)
            return "ok"
        try:
            await asyncio.sleep(30)
        finally:
            stopped.append(task.payload)
        return "never"

    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=3, lease_seconds=1)
    job = asyncio.create_task(w.run())
    while w.running < 3:
        await asyncio.sleep(0.01)
    fake.lost.add(lost.id)
    fake.cancelled.add(cancelled.id)
    while len(w.outcomes) < 3 or sum(w.outcomes.values()) < 3:
        await asyncio.sleep(0.01)
    w.stop()
    await asyncio.wait_for(job, 5)
    assert sorted(stopped) == ["cancelled", "lost"]
    assert w.outcomes == {Outcome.LEASE_LOST: 1, Outcome.CANCELLED: 1, Outcome.COMPLETED: 1}
    assert [c.args["task_id"] for c in fake.named("release")] == [cancelled.id]
    assert [c.args["task_id"] for c in fake.named("complete")] == [fine.id]


async def test_a_failed_batch_is_retried_and_each_task_completed_once():
    fake = FakeGateway()
    fake.add(*range(4))
    fake.complete_many_errors = [TransportError("down"), TransportError("down")]
    gate = asyncio.Event()

    async def handler(task: Task) -> Any:
        await gate.wait()
        return task.payload

    w = worker(fake, handler, concurrency=4, max_tasks_per_poll=4)
    job = asyncio.create_task(run_until(w, lambda: len(fake.named("complete")) == 4))
    while w.running < 4:
        await asyncio.sleep(0.01)
    gate.set()
    await job
    assert len(fake.named("complete_many")) == 3  # two failures, then the one that counts
    assert sorted(c.args["result"] for c in fake.named("complete")) == [0, 1, 2, 3]
    assert w.outcomes == {Outcome.COMPLETED: 4}


async def test_a_lease_lost_in_a_completion_batch_is_that_items_outcome():
    fake = FakeGateway()
    tasks = fake.add(*range(3))
    gate = asyncio.Event()

    async def handler(task: Task) -> None:
        await gate.wait()

    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=3)
    job = asyncio.create_task(run_until(w, lambda: sum(w.outcomes.values()) == 3))
    while w.running < 3:
        await asyncio.sleep(0.01)
    fake.lost.add(tasks[1].id)
    gate.set()
    await job
    assert len(fake.named("complete_many")) == 1
    assert w.outcomes == {Outcome.COMPLETED: 2, Outcome.LEASE_LOST: 1}


async def test_failures_and_a_single_completion_use_the_single_calls():
    fake = FakeGateway()
    fake.add("ok", "bad")

    async def handler(task: Task) -> str:
        if task.payload == "bad":
            raise ValueError("bad")
        await asyncio.sleep(0.2)  # finishes alone: nothing to share a request with
        return "done"

    w = worker(fake, handler, concurrency=2, max_tasks_per_poll=2)
    await run_until(w, lambda: sum(w.outcomes.values()) == 2)
    assert not fake.named("complete_many")
    assert len(fake.named("complete")) == 1 and len(fake.named("fail")) == 1
    assert w.outcomes == {Outcome.COMPLETED: 1, Outcome.FAILED: 1}


@pytest.mark.parametrize("first", ["heartbeat", "complete"])
async def test_a_gateway_without_batch_calls_gets_single_calls(first: str):
    """Whichever batch call finds out first (a heartbeat with a 1 s lease, a completion
    with a 60 s one), the loop goes on with single calls and loses nothing."""
    fake = FakeGateway(no_batch_calls=True)
    fake.add(*range(6))
    gate = asyncio.Event()

    async def handler(task: Task) -> Any:
        await gate.wait()
        return task.payload

    lease = 1 if first == "heartbeat" else 60
    w = worker(fake, handler, concurrency=3, max_tasks_per_poll=3, lease_seconds=lease)
    job = asyncio.create_task(run_until(w, lambda: sum(w.outcomes.values()) == 6))
    while w.running < 3:
        await asyncio.sleep(0.01)
    if first == "heartbeat":
        while not fake.named("heartbeat"):  # refused as a batch, then sent singly
            await asyncio.sleep(0.01)
    gate.set()
    await job
    assert [c.name for c in fake.calls if c.name.endswith("_many")] == [f"{first}_many"]
    assert sorted(c.args["result"] for c in fake.named("complete")) == list(range(6))
    assert w.outcomes == {Outcome.COMPLETED: 6}
