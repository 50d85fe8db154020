"""An in-memory gateway for the client's unit tests (clients/python/tests/): a queue, leases
(lapsing, if asked), cancels, scripted failures, completions held unanswered, and a
record of every call with its (monotonic) time; and a worker loop run against it until
a condition holds."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway_client import (
    Beat,
    Claimed,
    Completion,
    Failure,
    ItemOutcome,
    LeaseLost,
    NotFound,
    Task,
    Worker,
    WorkerOptions,
)

_ids = itertools.count(1)


def make_task(payload: Any = None, runtime: str = "rt") -> Task:
    n = next(_ids)
    return Task(
        id=f"task-{n}",
        runtime_id=runtime,
        status="queued",
        priority=50,
        payload=payload,
        attempts=0,
        max_attempts=5,
    )


@dataclass
class Call:
    name: str
    at: float
    args: dict[str, Any]


@dataclass
class FakeGateway:
    queue: list[Task] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    claim_errors: list[Exception] = field(default_factory=list)
    heartbeat_errors: list[Exception] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)
    leases: dict[str, str] = field(default_factory=dict)
    complete_many_errors: list[Exception] = field(default_factory=list)
    # An older gateway: the batch calls' path is unknown (404 for the whole request).
    no_batch_calls: bool = False
    # While this event is unset, completions (single or batch) are received but not
    # answered: `held` has the task ids in flight, `most_held` the most at once.
    hold: asyncio.Event | None = None
    held: set[str] = field(default_factory=set)
    most_held: int = 0
    # Leases lapse lease_seconds after their claim or last heartbeat, as the gateway's do.
    expire_leases: bool = False
    expires: dict[str, float] = field(default_factory=dict)

    def add(self, *payloads: Any) -> list[Task]:
        tasks = [make_task(p) for p in payloads]
        self.queue.extend(tasks)
        return tasks

    def named(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def _record(self, name: str, **args: Any) -> None:
        self.calls.append(Call(name, time.monotonic(), args))

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
    ) -> Claimed:
        completes, fails = list(complete or []), list(fail or [])
        self._record(
            "claim",
            max_tasks=max_tasks,
            wait_seconds=wait_seconds,
            complete=[i.task_id for i in completes],
            fail=[i.task_id for i in fails],
        )
        if self.claim_errors:
            raise self.claim_errors.pop(0)
        # Reports first, each as its single call (recorded as one), then the claim.
        acks = [await self._item(self.complete(i.task_id, i.lease_id, i.result), i.task_id)
                for i in completes]  # fmt: skip
        for i in fails:
            call = self.fail(i.task_id, i.lease_id, i.error, retry=i.retry)
            acks.append(await self._item(call, i.task_id))
        deadline = time.monotonic() + wait_seconds
        while not self.queue and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        out = []
        for task in self.queue[:max_tasks]:
            lease = f"lease-{next(_ids)}"
            self.leases[task.id] = lease
            self.expires[task.id] = time.monotonic() + (lease_seconds or 60)
            out.append(replace(task, status="claimed", lease_id=lease, attempts=task.attempts + 1))
        del self.queue[:max_tasks]
        if complete is None and fail is None:
            return Claimed(out)
        return Claimed(out, acks)

    async def _item(self, call: Awaitable[Task], task_id: str) -> ItemOutcome:
        """A single call's answer as a batch item's."""
        try:
            task = await call
        except LeaseLost:
            return ItemOutcome(task_id, "lease_lost", problem={"code": "lease_lost"})
        return ItemOutcome(task_id, task.status)

    def _check(self, task_id: str, lease_id: str) -> None:
        lapsed = self.expire_leases and time.monotonic() > self.expires.get(task_id, 0.0)
        if task_id in self.lost or self.leases.get(task_id) != lease_id or lapsed:
            raise LeaseLost("lease lost", status=409)

    def _extend(self, task_id: str, lease_seconds: int | None) -> None:
        self.expires[task_id] = time.monotonic() + (lease_seconds or 60)

    async def _held(self, task_ids: list[str]) -> None:
        """Keeps these completions unanswered while `hold` is unset."""
        if self.hold is None or self.hold.is_set():
            return
        self.held.update(task_ids)
        self.most_held = max(self.most_held, len(self.held))
        try:
            await self.hold.wait()
        finally:
            self.held.difference_update(task_ids)

    async def heartbeat(
        self, task_id: str, lease_id: str, lease_seconds: int | None = None
    ) -> Task:
        self._record("heartbeat", task_id=task_id)
        if self.heartbeat_errors:
            raise self.heartbeat_errors.pop(0)
        self._check(task_id, lease_id)
        self._extend(task_id, lease_seconds)
        task = replace(make_task(), id=task_id, status="claimed", lease_id=lease_id)
        return replace(task, cancel_requested=task_id in self.cancelled)

    async def _finish(
        self, name: str, task_id: str, lease_id: str, status: str, **args: Any
    ) -> Task:
        self._record(name, task_id=task_id, **args)
        self._check(task_id, lease_id)
        del self.leases[task_id]
        return replace(make_task(), id=task_id, status=status)

    async def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task:
        await self._held([task_id])
        status = "cancelled" if task_id in self.cancelled else "completed"
        return await self._finish("complete", task_id, lease_id, status, result=result)

    async def fail(
        self,
        task_id: str,
        lease_id: str,
        error: str,
        *,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task:
        status = "queued" if retry else "dead"
        return await self._finish("fail", task_id, lease_id, status, error=error, retry=retry)

    async def release(self, task_id: str, lease_id: str) -> Task:
        status = "cancelled" if task_id in self.cancelled else "queued"
        return await self._finish("release", task_id, lease_id, status)

    # Batch calls: recorded as themselves, and each item as its single call (so that
    # `named("complete")` lists every completion reported, in one request or many).

    async def complete_many(self, items: list[Completion]) -> list[ItemOutcome]:
        self._record("complete_many", task_ids=[i.task_id for i in items])
        if self.no_batch_calls:
            raise NotFound("POST /v1/tasks:complete: Not Found", status=404)
        if self.complete_many_errors:
            raise self.complete_many_errors.pop(0)
        await self._held([i.task_id for i in items])
        out = []
        for i in items:
            try:
                task = await self.complete(i.task_id, i.lease_id, i.result)
            except LeaseLost:
                out.append(ItemOutcome(i.task_id, "lease_lost", problem={"code": "lease_lost"}))
                continue
            out.append(ItemOutcome(i.task_id, task.status))
        return out

    async def heartbeat_many(self, items: list[Beat]) -> list[ItemOutcome]:
        self._record("heartbeat_many", task_ids=[i.task_id for i in items])
        if self.no_batch_calls:
            raise NotFound("POST /v1/tasks:heartbeat: Not Found", status=404)
        if self.heartbeat_errors:
            raise self.heartbeat_errors.pop(0)
        out = []
        for i in items:
            self._record("heartbeat", task_id=i.task_id)
            try:
                self._check(i.task_id, i.lease_id)
            except LeaseLost:
                out.append(ItemOutcome(i.task_id, "lease_lost", problem={"code": "lease_lost"}))
                continue
            self._extend(i.task_id, i.lease_seconds)
            flagged = i.task_id in self.cancelled
            out.append(ItemOutcome(i.task_id, "extended", cancel_requested=flagged))
        return out


def worker(
    fake: FakeGateway, handler: Any, *, tracer_provider: Any = None, **options: Any
) -> Worker:
    opts = {"wait_seconds": 0.05, "worker_id": "w", **options}
    return Worker(fake, "rt", handler, WorkerOptions(**opts), tracer_provider=tracer_provider)


async def run_until(w: Worker, condition: Any, within: float = 5.0) -> None:
    """Runs the worker until `condition()` holds, then stops it and waits for the drain."""
    job = asyncio.create_task(w.run())
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        assert not job.done(), job
        await asyncio.sleep(0.01)
    w.stop()
    await asyncio.wait_for(job, 10)
