"""The stale-verdict race (design section 3, I1 and I2).

A poll parked on an empty runtime must get a task enqueued at any moment, including
while the Postgres scan that is about to write "empty" is still running. The verdict
TTL is 30 s and the poll waits 10 s, so a lost wake-up or a verdict that wrongly
covers the new task shows up as a multi-second wait (or an empty answer).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tests.support.claims import (
    pg_claims,
    poll,
    timed_enqueue,
)
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample

pytestmark = pytest.mark.integration

ITERATIONS = 40
WAIT_SECONDS = 10  # the poll's own wait: far longer than the bound we assert
BOUND_SECONDS = 1.0  # every task is claimed this soon after its enqueue was sent


async def test_enqueue_at_a_random_moment_is_never_missed(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """40 rounds: a poll parks on an empty runtime; 0-50 ms after it was sent (half of
    the rounds 0-4 ms, so that the enqueue often lands during the scan and the
    verdict write) a task is enqueued, alternately through the polled instance and a
    second one. Each task reaches the poll within 1 s."""
    rng = random.Random()
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=30)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        latencies: list[float] = []
        for i in range(ITERATIONS):
            # Odd rounds reuse one runtime (verdict and version keys already exist),
            # even rounds start a fresh one (subscribe + new epoch on the first read).
            runtime = f"{runtime_id}-s" if i % 2 else f"{runtime_id}-{i}"
            producer = a if i % 4 < 2 else b
            delay = rng.uniform(0, 0.05) if i % 3 == 0 else rng.uniform(0, 0.004)
            waiting = asyncio.create_task(
                poll(a, runtime, f"w{i}", wait_seconds=WAIT_SECONDS, lease_seconds=30)
            )
            await asyncio.sleep(delay)
            task, sent = await timed_enqueue(producer, runtime, {"round": i})
            try:
                async with asyncio.timeout(BOUND_SECONDS + 2):
                    answer = await waiting
            except TimeoutError:
                waiting.cancel()
                raise AssertionError(
                    f"round {i}: task enqueued {delay * 1000:.1f} ms after the poll was not "
                    f"delivered within {BOUND_SECONDS + 2:.0f} s (stale verdict or lost wake-up)"
                ) from None
            got = answer.tasks
            assert [t["id"] for t in got] == [task["id"]], (i, got)
            latency = answer.answered - sent
            assert latency < BOUND_SECONDS, f"round {i}: claimed {latency:.2f}s after enqueue"
            latencies.append(latency)
            status, body = await a.complete(got[0])
            assert status == 200, body
        assert len(latencies) == ITERATIONS


def rows_of(result: Any) -> list[Any]:
    """The leased rows of a `store.claim` result (a list, or (rows, due_in))."""
    return list(result[0] if isinstance(result, tuple) else result)


class EnqueueDuringScan:
    """Wraps the polled instance's `store.claim`: on its first call, a task is enqueued
    through the second instance's HTTP API while the claim scan is in progress
    (`concurrent`: the enqueue request runs alongside the claim statement) or right after
    the scan found nothing and before the pump writes its verdict (`after_scan`)."""

    def __init__(self, polled: Instance, producer: Instance, runtime: str, mode: str) -> None:
        self.original = polled.gateway.store.claim
        self.producer = producer
        self.runtime = runtime
        self.mode = mode
        self.calls = 0
        self.first_rows: list[Any] | None = None  # what the forced scan found
        self.task: dict[str, Any] | None = None
        self.sent = 0.0

    async def __call__(self, runtime_id: str, worker_ids: Any, lease_seconds: Any) -> Any:
        self.calls += 1
        if self.calls > 1 or runtime_id != self.runtime:
            return await self.original(runtime_id, worker_ids, lease_seconds)
        if self.mode == "concurrent":
            enqueue = asyncio.create_task(timed_enqueue(self.producer, self.runtime, "x"))
            await asyncio.sleep(0)  # let the enqueue request start
            result = await self.original(runtime_id, worker_ids, lease_seconds)
            self.task, self.sent = await enqueue
        else:
            result = await self.original(runtime_id, worker_ids, lease_seconds)
            # The scan is over and found nothing; the verdict is not written yet.
            self.task, self.sent = await timed_enqueue(self.producer, self.runtime, "x")
        self.first_rows = rows_of(result)
        return result


@pytest.mark.parametrize("mode", ["after_scan", "concurrent"])
async def test_enqueue_during_the_scan_makes_the_verdict_stale(
    database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    """Forces the window between the verdict read and the verdict write: a bump lands
    there, so the verdict written under the version read before the scan is stale
    (I2) and the parked poll gets the task at once. A verdict written under the
    version read after the scan would hide the task for the verdict's 30 s TTL."""
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=30)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        for round_ in range(3):
            runtime = f"{runtime_id}-{round_}"
            hook = EnqueueDuringScan(a, b, runtime, mode)
            monkeypatch.setattr(a.gateway.store, "claim", hook)
            claims_before = pg_claims(a)
            answer = await asyncio.wait_for(
                poll(a, runtime, "w", wait_seconds=WAIT_SECONDS), BOUND_SECONDS + 3
            )
            monkeypatch.undo()
            assert hook.task is not None, "the claim hook never ran"
            if mode == "after_scan":
                assert hook.first_rows == [], "the forced scan should have found nothing"
            assert [t["id"] for t in answer.tasks] == [hook.task["id"]]
            latency = answer.answered - hook.sent
            assert latency < BOUND_SECONDS, f"{mode}: claimed {latency:.2f}s after enqueue"
            assert pg_claims(a) - claims_before <= 3
            status, body = await a.complete(answer.tasks[0])
            assert status == 200, body


async def test_verdict_under_the_pre_scan_version_is_stale_in_redis(
    database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same forced window, checked on the keys themselves: after a scan during
    which a bump landed, `empty` holds the version read before the scan, which no
    longer equals `version`, and the next wait_seconds=0 poll goes to Postgres (a miss)
    and finds the task."""
    import redis.asyncio as aioredis

    from gateway.redis.keys import keys_for

    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=30)
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with running_gateway(cfg) as a, running_gateway(cfg) as b:
            keys = keys_for(redis_prefix, runtime_id)
            before: dict[str, Any] = {}
            original = a.gateway.store.claim

            async def hooked(rt: str, workers: Any, leases: Any) -> Any:
                result = await original(rt, workers, leases)
                if "task" not in before:
                    before["rows"] = rows_of(result)
                    before["version"] = await client.get(keys.version)
                    before["task"] = await b.enqueue(runtime_id, "late")
                return result

            # A wait_seconds=0 poll: one read, one scan (hooked), one verdict write.
            monkeypatch.setattr(a.gateway.store, "claim", hooked)
            first = await poll(a, runtime_id, "w", wait_seconds=0)
            monkeypatch.undo()
            assert first.tasks == [] and before["rows"] == []
            # The poll is answered before the pump writes its verdict: wait for the write.
            deadline = asyncio.get_running_loop().time() + 3
            while await client.get(keys.empty) is None:
                assert asyncio.get_running_loop().time() < deadline, "no verdict was written"
                await asyncio.sleep(0.01)
            version, empty = await client.mget(keys.version, keys.empty)
            assert empty == before["version"], "the verdict must carry the pre-scan version"
            assert version != empty, "the bump after commit must have moved the version"
            misses = sample(a, "gateway_verdict_checks_total", outcome="miss")
            claims = pg_claims(a)
            second = await poll(a, runtime_id, "w", wait_seconds=0)
            assert [t["id"] for t in second.tasks] == [before["task"]["id"]]
            assert sample(a, "gateway_verdict_checks_total", outcome="miss") > misses
            assert pg_claims(a) == claims + 1
            status, body = await a.complete(second.tasks[0])
            assert status == 200, body
    finally:
        await client.aclose()
