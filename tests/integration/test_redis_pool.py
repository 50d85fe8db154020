"""GATEWAY_REDIS_MAX_CONNECTIONS against real Redis: a burst shares the bounded pool, a
call beyond the bound waits for a connection, and one that waits out its budget is a
miss (the claim goes to Postgres) that the circuit breaker does not count."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.errors import CacheUnavailable
from gateway.metrics import Metrics
from gateway.redis.breaker import CircuitBreaker
from gateway.redis.clients import make_client
from gateway.redis.slots import PoolBusy
from gateway.redis.verdict import VerdictCache
from tests.support.claims import pg_claims, poll
from tests.support.gateways import make_settings, running_gateway
from tests.support.metrics import sample

pytestmark = pytest.mark.integration

PAUSE_SECONDS = 2.0  # CLIENT PAUSE while calls are in flight: far longer than any budget


def bounded_cache(url: str, prefix: str, budget: float, bound: int, **client: Any) -> VerdictCache:
    """A VerdictCache whose client has the gateway's options and `bound` connections,
    as the Gateway builds it in standalone mode."""
    return VerdictCache(
        make_client(url, budget, max_connections=bound, **client),
        prefix,
        Metrics(60),
        timeout_seconds=budget,
        version_ttl_seconds=3600,
        breaker=CircuitBreaker(3, 5.0),
        max_connections=bound,
    )


async def connections_named(admin: aioredis.Redis, name: str) -> int:
    return sum(1 for c in await admin.client_list() if c.get("name") == name)


def mixed_calls(cache: VerdictCache, n: int) -> list[Awaitable[Any]]:
    """`n` calls of the claim path's kinds over 10 runtimes: verdict reads, bumps with
    their wake-up, renewals and result wake-up publishes."""
    calls: list[Awaitable[Any]] = []
    for i in range(n):
        rt = f"rt{i % 10}"
        kind = i % 4
        if kind == 0:
            calls.append(cache.read(rt))
        elif kind == 1:
            calls.append(cache.bump(rt))
        elif kind == 2:
            calls.append(cache.renew_empty(rt, "no-such-version", 5.0))
        else:
            calls.append(cache.publish([(f"{cache.prefix}:result:{i}", "done")]))
    return calls


async def test_a_burst_of_50_calls_shares_two_connections_and_every_call_succeeds(
    redis_url: str, redis_prefix: str
) -> None:
    name = f"{redis_prefix}-pool"  # to find the client's connections in CLIENT LIST
    cache = bounded_cache(redis_url, redis_prefix, 2.0, 2, client_name=name)
    admin = aioredis.Redis.from_url(redis_url, socket_timeout=5, decode_responses=True)
    seen: list[int] = []
    done = asyncio.Event()

    async def watch() -> None:
        while not done.is_set():
            seen.append(await connections_named(admin, name))

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.gather(*mixed_calls(cache, 50), return_exceptions=True)
        done.set()
        await watcher
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures[:3]
        # Idle connections stay in the pool: what is open now is all it ever opened.
        assert 1 <= await connections_named(admin, name) <= 2
        assert max(seen) <= 2, seen
        assert cache.breaker.consecutive_failures == 0
    finally:
        done.set()
        await cache.close()
        await admin.aclose()


async def test_calls_beyond_the_bound_wait_through_a_slow_moment_and_succeed(
    redis_process: Any, redis_prefix: str
) -> None:
    """Redis stalls for less than a call's budget while both connections are in use:
    the ten calls beyond the bound wait for them instead of failing at once."""
    cache = bounded_cache(redis_process.url, redis_prefix, 1.5, 2)
    admin = aioredis.Redis.from_url(redis_process.url, socket_timeout=5)
    try:
        before = (await admin.info("stats"))["total_connections_received"]
        await cache.read("warm")
        await admin.execute_command("CLIENT", "PAUSE", "300", "ALL")
        results = await asyncio.gather(*mixed_calls(cache, 12), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures[:3]
        opened = (await admin.info("stats"))["total_connections_received"] - before
        assert opened <= 2, f"the client opened {opened} connections"
    finally:
        await cache.close()
        await admin.aclose()


async def _timed(call: Awaitable[Any]) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        await call
    except CacheUnavailable as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


async def test_a_call_finding_every_connection_busy_gives_up_within_its_budget_unblamed(
    redis_process: Any, redis_prefix: str
) -> None:
    """Redis stops answering with both connections in use: the two calls on them fail
    as Redis failures (the breaker counts them), the ten waiting for a connection give
    up after their budget as CacheUnavailable without reaching Redis, and the breaker
    does not count them: a full pool is not a sick Redis."""
    budget = 0.3
    cache = bounded_cache(redis_process.url, redis_prefix, budget, 2)
    admin = aioredis.Redis.from_url(redis_process.url, socket_timeout=10)
    try:
        await cache.read("warm")
        await admin.execute_command("CLIENT", "PAUSE", str(int(PAUSE_SECONDS * 1000)), "ALL")
        paused = time.monotonic()
        outcomes = await asyncio.gather(*(_timed(cache.read(f"rt{i}")) for i in range(12)))
        over = time.monotonic() - paused
        assert over < PAUSE_SECONDS, "the calls waited for Redis instead of giving up"
        errors = [exc for exc, _ in outcomes]
        assert all(isinstance(exc, CacheUnavailable) for exc in errors), errors
        waited = [exc for exc in errors if isinstance(exc.__cause__, PoolBusy)]  # type: ignore[union-attr]
        assert len(waited) == 10, errors
        assert cache.breaker.consecutive_failures == 2
        assert not cache.breaker.is_open
        metrics = cache._metrics
        assert sample(metrics, "gateway_redis_pool_timeouts_total") == 10
        assert sample(metrics, "gateway_redis_errors_total") == 2

        await admin.ping()  # answered once the pause is over
        assert not (await cache.read("after")).hit
        assert cache.breaker.consecutive_failures == 0
    finally:
        await cache.close()
        await admin.aclose()


async def test_claims_that_find_the_pool_busy_are_answered_from_postgres(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """One command connection, Redis paused: every claim still gets its task (from
    Postgres), without waiting for Redis, and some gave up waiting for the connection."""
    cfg = make_settings(
        database_url,
        redis_process.url,
        redis_prefix,
        redis_max_connections=1,
        redis_timeout_ms=200,
        janitor_interval_seconds=3600,
        near_cache_enabled=False,
    )
    runtimes = [f"{runtime_id}-{i}" for i in range(8)]
    async with running_gateway(cfg) as gw:
        tasks = {rt: (await gw.enqueue(rt, rt))["id"] for rt in runtimes}
        admin = aioredis.Redis.from_url(redis_process.url, socket_timeout=10)
        try:
            claims = pg_claims(gw)
            await admin.execute_command("CLIENT", "PAUSE", str(int(PAUSE_SECONDS * 1000)), "ALL")
            paused = time.monotonic()
            answers = await asyncio.gather(*(poll(gw, rt, wait_seconds=0) for rt in runtimes))
            assert time.monotonic() - paused < PAUSE_SECONDS, "claims waited for Redis"
            for rt, answer in zip(runtimes, answers, strict=True):
                assert answer.status == 200, answer.body
                assert [t["id"] for t in answer.tasks] == [tasks[rt]]
            assert pg_claims(gw) >= claims + len(runtimes)
            assert sample(gw, "gateway_redis_pool_timeouts_total") > 0
            await admin.ping()
        finally:
            await admin.aclose()
