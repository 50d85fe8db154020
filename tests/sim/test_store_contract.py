"""One behaviour suite for the simulation's FakeStore and the real Store, so that the
fake cannot drift from what the claim statement does."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pytest

from gateway.api.requests import EnqueueRequest
from gateway.claim.ports import ClaimStore
from gateway.metrics import Metrics
from gateway.rows import Leased
from gateway.store import Store

from .fakes import FakeStore


class Subject(ClaimStore, Protocol):
    async def add(self, runtime_id: str, delay: float = 0.0, priority: int = 0) -> uuid.UUID: ...


class Fake:
    def __init__(self) -> None:
        self.store = FakeStore(random.Random(1), max_latency=0.0)

    async def add(self, runtime_id: str, delay: float = 0.0, priority: int = 0) -> uuid.UUID:
        return self.store.enqueue(runtime_id, delay, priority).id

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> tuple[list[Leased], float | None]:
        return await self.store.claim(runtime_id, worker_ids, lease_seconds)

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        return await self.store.unclaim(task_ids, lease_ids)

    def connection_free(self) -> bool:
        return self.store.connection_free()


class Real:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def add(self, runtime_id: str, delay: float = 0.0, priority: int = 0) -> uuid.UUID:
        run_at = datetime.now(UTC) + timedelta(seconds=delay) if delay else None
        req = EnqueueRequest(
            payload_json="{}",
            priority=priority,
            max_attempts=3,
            run_at=run_at,
            delay_seconds=None,
            ttl_seconds=None,
            idempotency_key=None,
            request_hash="",
        )
        row, _ = await self.store.enqueue(runtime_id, req)
        return row.id

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> tuple[list[Leased], float | None]:
        return await self.store.claim(runtime_id, worker_ids, lease_seconds)

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        return await self.store.unclaim(task_ids, lease_ids)

    def connection_free(self) -> bool:
        return self.store.connection_free()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.integration)])
def which(request: pytest.FixtureRequest) -> str | None:
    """None for the fake, else the test database (resolved outside any event loop)."""
    if request.param == "fake":
        return None
    url: str = request.getfixturevalue("database_url")
    return url


@pytest.fixture
async def subject(which: str | None) -> AsyncIterator[Any]:
    if which is None:
        yield Fake()
        return
    store = Store(which, Metrics(), min_size=1, max_size=2)
    await store.open()
    try:
        yield Real(store)
    finally:
        await store.close()


def ids(rows: list[Leased]) -> list[uuid.UUID]:
    return [r.task.id for r in rows]


async def test_priority_then_fifo_one_task_per_slot(subject: Subject, runtime_id: str) -> None:
    low1 = await subject.add(runtime_id)
    high = await subject.add(runtime_id, priority=5)
    low2 = await subject.add(runtime_id)
    rows, due_in = await subject.claim(runtime_id, ["w1", "w2"], [30.0, 30.0])
    assert ids(rows) == [high, low1]
    assert [r.slot for r in rows] == [1, 2]
    assert due_in is None  # every slot filled: not asked
    rows, _ = await subject.claim(runtime_id, ["w1", "w2"], [30.0, 30.0])
    assert ids(rows) == [low2]  # a claimed task is not claimed again


async def test_due_in_is_the_next_delayed_task(subject: Subject, runtime_id: str) -> None:
    rows, due_in = await subject.claim(runtime_id, ["w"], [30.0])
    assert (rows, due_in) == ([], None)
    await subject.add(runtime_id, delay=120.0)
    await subject.add(runtime_id, delay=60.0)
    rows, due_in = await subject.claim(runtime_id, ["w"], [30.0])
    assert rows == []
    assert due_in is not None and 55.0 < due_in <= 60.0


async def test_unclaim_returns_leases_once(subject: Subject, runtime_id: str) -> None:
    task = await subject.add(runtime_id)
    rows, _ = await subject.claim(runtime_id, ["w"], [30.0])
    assert ids(rows) == [task]
    lease = rows[0].task.lease_id
    assert lease is not None
    assert await subject.unclaim([task], [uuid.uuid4()]) == []  # another lease: untouched
    assert await subject.unclaim([task], [lease]) == [task]
    assert await subject.unclaim([task], [lease]) == []
    rows, _ = await subject.claim(runtime_id, ["w"], [30.0])
    assert ids(rows) == [task]
