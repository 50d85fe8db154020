"""Fail open (I5) and no lost wake-up across a Redis restart (I8), against a private
redis-server that the tests stop and start again on the same port."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from tests.support.claims import (
    pg_claims,
    poll,
    timed_enqueue,
    verdict_hits,
    wait_parked,
)
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

REQUEST_BOUND = 2.0  # every request answers this fast with Redis down (a correctness bound)


# Redis commands give up fast, and an empty verdict outlives every test below.
FAIL_FAST: dict[str, Any] = {"redis_timeout_ms": 100, "empty_ttl_seconds": 30}


async def _claim_one(inst: Instance, runtime: str, worker: str) -> tuple[list[Any], float]:
    answer = await poll(inst, runtime, worker, wait_seconds=0)
    return answer.tasks, answer.elapsed


async def test_enqueue_and_claim_work_without_redis_and_the_cache_comes_back(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_process.url, redis_prefix, **FAIL_FAST)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        # Warm up with Redis: both instances have pooled connections and a subscriber.
        warm = await a.enqueue(runtime_id, "warm")
        tasks, _ = await _claim_one(b, runtime_id, "w")
        assert [t["id"] for t in tasks] == [warm["id"]]
        await b.complete(tasks[0])
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")

        redis_process.kill()
        errors = sample(a, "gateway_redis_errors_total")
        claims = pg_claims(a)
        for i in range(6):
            producer, consumer = (a, b) if i % 2 else (b, a)
            started = time.monotonic()
            task, _ = await timed_enqueue(producer, runtime_id, {"i": i})
            enqueue_seconds = time.monotonic() - started
            assert enqueue_seconds < REQUEST_BOUND, f"enqueue took {enqueue_seconds:.2f}s"
            got, claim_seconds = await _claim_one(consumer, runtime_id, f"w{i}")
            assert claim_seconds < REQUEST_BOUND, f"claim took {claim_seconds:.2f}s"
            assert [t["id"] for t in got] == [task["id"]]
            started = time.monotonic()
            status, body = await producer.complete(got[0])
            assert status == 200 and body["status"] == "completed", body
            assert time.monotonic() - started < REQUEST_BOUND
        assert sample(a, "gateway_redis_errors_total") > errors, "Redis was not really down"
        assert pg_claims(a) > claims, "claims must go to Postgres"

        # A poll that parks while Redis is down polls Postgres (degraded_poll_seconds=1)
        # and gets a task enqueued through the other instance (whose bump is lost).
        parked_rt = f"{runtime_id}-down"
        waiting = asyncio.create_task(poll(a, parked_rt, "parked", wait_seconds=10))
        await wait_until(lambda: a.gateway.claimer.parked(parked_rt) == 1, 3, "poll parked")
        await asyncio.sleep(0.5)
        task, sent = await timed_enqueue(b, parked_rt, "while down")
        answer = await asyncio.wait_for(waiting, 6)
        assert [t["id"] for t in answer.tasks] == [task["id"]]
        assert answer.answered - sent < 3.0, f"degraded poll took {answer.answered - sent:.2f}s"
        await a.complete(answer.tasks[0])

        # Redis comes back: within seconds, empty polls are answered from the cache again.
        redis_process.start()
        empty_rt = f"{runtime_id}-empty"
        hits = verdict_hits(a)
        deadline = time.monotonic() + 12
        while verdict_hits(a) == hits:
            assert time.monotonic() < deadline, "the verdict cache did not come back"
            assert (await poll(a, empty_rt, "w", wait_seconds=0)).tasks == []
            await asyncio.sleep(0.2)
        hits, claims = verdict_hits(a), pg_claims(a)
        for _ in range(10):
            answer = await poll(a, empty_rt, "w", wait_seconds=0)
            assert answer.tasks == []
            assert answer.elapsed < REQUEST_BOUND
        assert verdict_hits(a) >= hits + 10
        assert pg_claims(a) == claims, "empty polls must be answered from Redis"


async def test_a_frozen_redis_costs_each_request_a_bounded_delay(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """Redis accepts connections but never answers (SIGSTOP): the short per-command
    budget, the single retry and the circuit breaker keep every enqueue and claim
    within the bound, and claims are served by Postgres."""
    cfg = make_settings(database_url, redis_process.url, redis_prefix, **FAIL_FAST)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await a.enqueue(runtime_id, "warm")
        [warm] = await b.claim(runtime_id, "w")
        await b.complete(warm)
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        os.kill(redis_process.process.pid, signal.SIGSTOP)
        try:
            worst = 0.0
            for i in range(6):
                producer, consumer = (a, b) if i % 2 else (b, a)
                started = time.monotonic()
                task, _ = await timed_enqueue(producer, runtime_id, {"i": i})
                worst = max(worst, time.monotonic() - started)
                got, claim_seconds = await _claim_one(consumer, runtime_id, f"w{i}")
                worst = max(worst, claim_seconds)
                assert [t["id"] for t in got] == [task["id"]]
                status, body = await consumer.complete(got[0])
                assert status == 200, body
            assert worst < REQUEST_BOUND, f"a request took {worst:.2f}s with Redis frozen"
            # A poll parked while Redis is frozen still gets a task from the other instance.
            waiting = asyncio.create_task(poll(a, f"{runtime_id}-p", "parked", wait_seconds=10))
            await asyncio.sleep(0.5)
            task, sent = await timed_enqueue(b, f"{runtime_id}-p", "while frozen")
            answer = await asyncio.wait_for(waiting, 6)
            assert [t["id"] for t in answer.tasks] == [task["id"]]
            assert answer.answered - sent < 3.0
        finally:
            os.kill(redis_process.process.pid, signal.SIGCONT)


async def test_poll_parked_before_redis_dies_falls_back_to_polling(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """A poll parked on a valid verdict while Redis was up; then Redis dies and a task
    is enqueued through another instance (its bump and wake-up are lost). The parked
    poll must fall back to polling Postgres and get the task within a few seconds."""
    cfg = make_settings(database_url, redis_process.url, redis_prefix, **FAIL_FAST)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        waiting = asyncio.create_task(poll(a, runtime_id, "parked", wait_seconds=10))
        await wait_parked(a, runtime_id, 1)
        assert a.gateway.subscriber.healthy
        redis_process.kill()
        await wait_until(lambda: not a.gateway.subscriber.healthy, 3, "subscriber to notice")
        task, sent = await timed_enqueue(b, runtime_id, "while down")
        try:
            answer = await asyncio.wait_for(waiting, 4)
        finally:
            redis_process.start()
        assert [t["id"] for t in answer.tasks] == [task["id"]]
        assert answer.answered - sent < 3.0


async def test_parked_poll_survives_a_redis_restart(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """I8: a poll parked on A; Redis is killed and started again on the same port; once
    A's subscriber is back, an enqueue through B reaches the parked poll by pub/sub.
    degraded_poll_seconds is long so that polling cannot stand in for the wake-up."""
    cfg = make_settings(
        database_url, redis_process.url, redis_prefix, **FAIL_FAST, degraded_poll_seconds=20
    )
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        waiting = asyncio.create_task(poll(a, runtime_id, "parked", wait_seconds=20))
        await wait_parked(a, runtime_id, 1)
        reconnects = sample(a, "gateway_pubsub_reconnects_total")
        redis_process.kill()
        await wait_until(lambda: not a.gateway.subscriber.healthy, 3, "subscriber to notice")
        await asyncio.sleep(0.3)
        redis_process.start()
        await wait_until(lambda: a.gateway.subscriber.healthy, 6, "subscriber to reconnect")
        assert sample(a, "gateway_pubsub_reconnects_total") > reconnects
        await wait_parked(a, runtime_id, 1)
        assert not waiting.done()
        task, sent = await timed_enqueue(b, runtime_id, "after restart")
        answer = await asyncio.wait_for(waiting, 3)
        assert [t["id"] for t in answer.tasks] == [task["id"]]
        assert answer.answered - sent < 1.0


async def test_bump_lost_during_an_outage_is_recovered_on_reconnect(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """I8: a poll parked on A; Redis dies; a task is enqueued through B (its bump and
    publish are lost); Redis comes back. Once the subscriber is restored it wakes
    every local waiter, which re-checks and finds the task within seconds."""
    cfg = make_settings(database_url, redis_process.url, redis_prefix, **FAIL_FAST)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        waiting = asyncio.create_task(poll(a, runtime_id, "parked", wait_seconds=15))
        await wait_parked(a, runtime_id, 1)
        redis_process.kill()
        await wait_until(lambda: not a.gateway.subscriber.healthy, 3, "subscriber to notice")
        task, _ = await timed_enqueue(b, runtime_id, "while down")
        redis_process.start()
        restarted = time.monotonic()
        answer = await asyncio.wait_for(waiting, 8)
        assert [t["id"] for t in answer.tasks] == [task["id"]]
        assert answer.answered - restarted < 4.0
