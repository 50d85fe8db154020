"""gateway/claim/results.py over in-memory fakes: the query's validation, the read after
subscribing (a finish between the first read and the subscription is not missed), the
fallback read while wake-ups cannot arrive, and the expiry bound."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gateway.api.requests import parse_wait
from gateway.claim.results import Results, _until_expiry, done_channel
from gateway.errors import Overloaded, ValidationFailed
from gateway.metrics import Metrics
from gateway.rows import TaskRow
from gateway.settings import Settings

NOW = datetime.now(UTC)
TASK = TaskRow(
    id=uuid.uuid4(), runtime_id="rt", status="queued", priority=50, payload=1, attempts=0,
    max_attempts=5, run_at=NOW, expires_at=None, created_at=NOW, updated_at=NOW,
    lease_id=None, lease_expires_at=None, worker_id=None, cancel_requested=False,
    result=None, last_error=None,
)  # fmt: skip


class Store:
    """Answers the statuses in `script`, one per read, then the last one for ever."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.reads = 0

    async def get(self, task_id: uuid.UUID) -> TaskRow:
        self.reads += 1
        status = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return dataclasses.replace(TASK, status=status)


class Cache:
    def __init__(self, healthy: bool = True) -> None:
        self.healthy = healthy
        self.published: list[list[tuple[str, str]]] = []

    async def publish(self, messages: list[tuple[str, str]]) -> None:
        self.published.append(messages)


class Channels:
    def __init__(self, confirms: bool = True) -> None:
        self.confirms = confirms
        self.wanted: set[str] = set()

    async def subscribe(self, channel: str) -> bool:
        self.wanted.add(channel)
        return self.confirms

    def unsubscribe(self, channel: str) -> None:
        self.wanted.discard(channel)

    def confirmed(self, channel: str) -> bool:
        return self.confirms and channel in self.wanted


class Admission:
    def __init__(self, room: int = 10) -> None:
        self.room = room
        self.held = 0

    def admit_long_wait(self) -> None:
        if self.held >= self.room:
            raise Overloaded("full")
        self.held += 1

    def end_long_wait(self) -> None:
        self.held -= 1


def results(
    store: Store, cache: Cache | None = None, channels: Channels | None = None, room: int = 10
) -> tuple[Results, Admission, Channels]:
    admission, channels = Admission(room), channels or Channels()
    settings = Settings(redis_prefix="gw", degraded_poll_seconds=0.05)
    found = Results(store, cache or Cache(), channels, admission, settings, Metrics())
    return found, admission, channels


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 0.0), ("0", 0.0), ("2.5", 2.5), ("60", 60.0), ("1e1", 10.0)]
)
def test_wait_seconds_within_the_cap(raw: str | None, expected: float) -> None:
    assert parse_wait({} if raw is None else {"wait_seconds": raw}, 60.0) == expected


@pytest.mark.parametrize(
    "raw", ["", "-1", "60.01", "abc", "nan", "inf", "-inf", "1e999", "0x10", " 1", "1_0"]
)
def test_wait_seconds_out_of_range_or_not_a_number_is_refused(raw: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_wait({"wait_seconds": raw}, 60.0)
    assert caught.value.extra["field"] == "wait_seconds"


async def test_a_finish_before_the_subscription_is_found_by_the_read_after_it() -> None:
    """Read 1 (before subscribing) sees it queued; it finished before the subscription,
    so no wake-up will come: read 2, after subscribing, must find it."""
    store = Store("queued", "completed")
    waits, admission, channels = results(store)
    row = await asyncio.wait_for(waits.wait(TASK.id, 30.0), 5)
    assert row.status == "completed" and store.reads == 2
    assert admission.held == 0 and not channels.wanted and waits.waiting() == 0


async def test_a_wake_up_ends_the_wait_with_one_more_read() -> None:
    store = Store("queued")
    waits, _, _ = results(store)
    waiting = asyncio.create_task(waits.wait(TASK.id, 30.0))
    while store.reads < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # four degraded intervals: a polling wait would read here
    assert store.reads == 2
    store.script = ["completed"]
    waits.message(done_channel("gw", uuid.uuid4()))  # another task's: not woken
    await asyncio.sleep(0.05)
    assert store.reads == 2
    waits.message(done_channel("gw", TASK.id))
    assert (await asyncio.wait_for(waiting, 5)).status == "completed"
    assert store.reads == 3


@pytest.mark.parametrize("down", ["subscription", "redis"])
async def test_without_wake_ups_the_wait_reads_once_per_degraded_interval(down: str) -> None:
    store = Store("queued", "queued", "queued", "completed")
    cache, channels = Cache(healthy=down != "redis"), Channels(confirms=down != "subscription")
    waits, _, _ = results(store, cache, channels)
    row = await asyncio.wait_for(waits.wait(TASK.id, 30.0), 5)
    assert row.status == "completed" and store.reads == 4


async def test_a_full_process_refuses_a_wait_but_answers_a_finished_task() -> None:
    waits, admission, _ = results(Store("queued"), room=0)
    with pytest.raises(Overloaded):
        await waits.wait(TASK.id, 5.0)
    assert admission.held == 0 and waits.waiting() == 0
    waits, _, _ = results(Store("dead"), room=0)
    assert (await waits.wait(TASK.id, 5.0)).status == "dead"


async def test_finished_publishes_only_finishes_and_batches_them() -> None:
    cache = Cache()
    waits, _, _ = results(Store("queued"), cache)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await waits.finished([(a, "completed"), (b, "queued"), (c, "dead")])
    await waits.finished([(b, "cancelled")])
    await waits.close()
    assert cache.published == [
        [(done_channel("gw", a), str(a)), (done_channel("gw", c), str(c)),
         (done_channel("gw", b), str(b))],
    ]  # fmt: skip


def test_only_a_queued_task_wakes_its_wait_at_its_expiry() -> None:
    soon = datetime.now(UTC) + timedelta(seconds=30)
    claimed = dataclasses.replace(TASK, status="claimed", expires_at=soon)
    assert _until_expiry(claimed, 1.0) == float("inf")  # a claimed task does not expire
    assert _until_expiry(TASK, 1.0) == float("inf")  # no expires_at
    assert 29 < _until_expiry(dataclasses.replace(TASK, expires_at=soon), 1.0) <= 30.05
    # Past it by this clock, not yet by Postgres's: read again a degraded interval later.
    past = dataclasses.replace(TASK, expires_at=datetime.now(UTC) - timedelta(seconds=1))
    assert _until_expiry(past, 1.0) == 1.0


async def test_a_wake_up_during_a_read_is_not_lost() -> None:
    """The finish is committed and published while the read after subscribing is in
    flight, and that read saw the task before the commit: the wake-up must still lead
    to one more read, not a sleep for the whole wait."""
    waits, _, _ = results(Store("queued"))

    class WakingStore(Store):
        async def get(self, task_id: uuid.UUID) -> TaskRow:
            row = await super().get(task_id)
            if self.reads == 2:  # the read after subscribing: the wake-up lands now
                waits.message(done_channel("gw", TASK.id))
                self.script = ["completed"]
            return row

    store = WakingStore("queued")
    waits._store = store
    row = await asyncio.wait_for(waits.wait(TASK.id, 30.0), 5)
    assert row.status == "completed" and store.reads == 3
