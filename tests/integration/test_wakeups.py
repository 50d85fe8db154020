"""The shared pub/sub subscriber against a real Redis."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.client import Pipeline

from gateway.errors import CacheUnavailable
from gateway.metrics import Metrics
from gateway.redis.breaker import CircuitBreaker
from gateway.redis.clients import make_client, make_pubsub_client
from gateway.redis.keys import keys_for
from gateway.redis.verdict import VerdictCache
from gateway.redis.wakeups import Subscriber
from tests.support.metrics import sample


async def test_forgetting_and_wanting_a_channel_again_keeps_it_subscribed(redis_url, redis_prefix):
    woken: list[str] = []
    sub = Subscriber(
        make_pubsub_client(redis_url, 0.25),
        redis_prefix,
        Metrics(),
        on_wake=woken.append,
        on_reset=lambda: None,
        timeout_seconds=0.25,
    )
    await sub.start()
    publisher = make_client(redis_url, 0.25)
    try:
        channel = keys_for(redis_prefix, "rt").wake
        async with asyncio.timeout(5):
            while not sub.healthy:
                await asyncio.sleep(0.01)
        assert await sub.subscribe(channel)
        # The runtime is forgotten, and a new poll wants it again before the
        # UNSUBSCRIBE reaches Redis.
        sub.unsubscribe(channel)
        assert await sub.subscribe(channel)
        async with asyncio.timeout(5):
            while not (
                sub.confirmed(channel) and await publisher.pubsub_numsub(channel) == [(channel, 1)]
            ):
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # let a late UNSUBSCRIBE land, if one is coming
        async with asyncio.timeout(5):
            while not woken:
                await publisher.publish(channel, "rt")
                await asyncio.sleep(0.05)
        assert woken[0] == "rt"
    finally:
        await publisher.aclose()
        await sub.stop()


async def test_a_connection_the_server_drops_wakes_every_waiter(redis_process, redis_prefix):
    """Dropped by Redis (CLIENT KILL, an idle timeout, a proxy) while Redis stays up:
    redis-py's pub/sub would reconnect and subscribe again inside the read it may retry,
    so the subscriber never learned of the gap and woke nobody, and a wake-up published
    in the gap was lost to every parked poll (I8). Found by the fault matrix."""
    resets: list[float] = []
    metrics = Metrics()
    sub = Subscriber(
        make_pubsub_client(redis_process.url, 0.25),
        redis_prefix,
        metrics,
        on_wake=lambda _runtime: None,
        on_reset=lambda: resets.append(asyncio.get_running_loop().time()),
        timeout_seconds=0.25,
    )
    await sub.start()
    admin = make_client(redis_process.url, 0.25)
    try:
        async with asyncio.timeout(5):
            while not sub.healthy:
                await asyncio.sleep(0.01)
        before = len(resets)
        assert await admin.client_kill_filter(_type="pubsub") == 1
        async with asyncio.timeout(5):
            while len(resets) == before or not sub.healthy:
                await asyncio.sleep(0.01)
        assert sample(metrics, "gateway_pubsub_reconnects_total") >= 1
    finally:
        await admin.aclose()
        await sub.stop()


def cache_on(url: str, prefix: str, metrics: Metrics) -> VerdictCache:
    """A VerdictCache on its own client, with a quarter-second budget."""
    return VerdictCache(
        make_client(url, 0.25),
        prefix,
        metrics,
        timeout_seconds=0.25,
        version_ttl_seconds=600,
        breaker=CircuitBreaker(100, 1.0),
    )


async def test_a_bump_redis_refuses_to_write_still_publishes_its_wake_up_and_drops_the_verdict(
    redis_process, redis_prefix
):
    """Redis out of memory under noeviction (or refusing writes for another reason: a
    failed save, too few replicas) refuses the bump's SET but not a PUBLISH. The bump is
    lost and reported (the janitor repairs it, I6), but its wake-up must still go out,
    as it did when the two were pipelined: a poll parked elsewhere without a verdict to
    trust (none can be written now) then checks Postgres at once rather than at its next
    degraded poll (I8)."""
    cache = cache_on(redis_process.url, redis_prefix, Metrics())
    admin = make_client(redis_process.url, 0.25)
    listener = admin.pubsub()
    try:
        channel = keys_for(redis_prefix, "rt").wake
        await listener.subscribe(channel)
        await cache.bump("rt")
        # An empty verdict under the version the refused bump cannot change.
        version = (await cache.read("rt")).version
        await cache.write_empty("rt", version, 60.0)
        assert (await cache.read("rt")).hit
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", 1)  # every write is now refused (OOM)
        with pytest.raises(CacheUnavailable, match="OutOfMemory"):
            await cache.bump("rt")
        # The verdict is gone with the refused bump: the next poll scans Postgres rather
        # than trust it for the rest of its life (I6), and its own verdict is refused.
        after = await cache.read("rt")
        assert after.version == version and not after.hit
        with pytest.raises(CacheUnavailable, match="OutOfMemory"):
            await cache.write_empty("rt", version, 60.0)
        assert not (await cache.read("rt")).hit
        await admin.config_set("maxmemory", 0)
        wake_ups = []
        async with asyncio.timeout(5):
            while len(wake_ups) < 2:
                message = await listener.get_message(timeout=0.2)
                if message is not None and message["type"] == "message":
                    wake_ups.append(message["data"])
        assert wake_ups == ["rt", "rt"]
    finally:
        await listener.aclose()
        await admin.aclose()
        await cache.close()


async def test_bumps_in_one_round_trip_bump_publish_and_drop_each_verdict(
    redis_process, redis_prefix
):
    """bump_many (a tick pass's batch) is bump for each runtime: each version counts up,
    each verdict goes stale, each wake-up goes out, even on a server that never saw the
    script (the pipeline loads it). A server refusing writes loses every bump, reports
    each one, and still publishes and drops the verdicts, as a lost single bump does."""
    metrics = Metrics()
    cache = cache_on(redis_process.url, redis_prefix, metrics)
    admin = make_client(redis_process.url, 0.25)
    listener = admin.pubsub()
    runtimes = ["a", "b", "c"]
    try:
        await listener.subscribe(*(keys_for(redis_prefix, rt).wake for rt in runtimes))
        before = {}
        for rt in runtimes:
            before[rt] = (await cache.read(rt)).version
            await cache.write_empty(rt, before[rt], 60.0)
        await admin.script_flush()
        versions = await cache.bump_many(runtimes)
        for rt, version in zip(runtimes, versions, strict=True):
            epoch, count = before[rt].rsplit(":", 1)
            assert version == f"{epoch}:{int(count) + 1}"
            verdict = await cache.read(rt)
            assert verdict.version == version and not verdict.hit
            await cache.write_empty(rt, version, 60.0)
        assert sample(metrics, "gateway_version_bumps_total", outcome="ok") == 3

        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", 1)  # every write is now refused (OOM)
        assert await cache.bump_many(runtimes) == [None, None, None]
        assert sample(metrics, "gateway_version_bumps_total", outcome="error") == 3
        assert not any([(await cache.read(rt)).hit for rt in runtimes])
        await admin.config_set("maxmemory", 0)
        wake_ups = []
        async with asyncio.timeout(5):
            while len(wake_ups) < 6:
                message = await listener.get_message(timeout=0.2)
                if message is not None and message["type"] == "message":
                    wake_ups.append(message["data"])
        assert sorted(wake_ups) == sorted(runtimes * 2)
    finally:
        await listener.aclose()
        await admin.aclose()
        await cache.close()


async def test_bumps_sent_again_to_a_redis_that_lost_its_scripts_still_land(
    redis_process, redis_prefix, monkeypatch
):
    """A pipeline checks its scripts once, before its first attempt; sent again on a
    new connection to a Redis that restarted meanwhile, every bump gets NOSCRIPT.
    bump_many then loads the script and sends those bumps once more: none is lost.
    (The lost check is played by a pipeline that skips it.)"""

    async def unchecked(self: Pipeline) -> None:
        return None

    metrics = Metrics()
    cache = cache_on(redis_process.url, redis_prefix, metrics)
    admin = make_client(redis_process.url, 0.25)
    try:
        await admin.script_flush()
        monkeypatch.setattr(Pipeline, "load_scripts", unchecked)
        versions = await cache.bump_many(["a", "b"])
        assert all(v is not None and v.endswith(":1") for v in versions), versions
        assert sample(metrics, "gateway_version_bumps_total", outcome="ok") == 2
        assert sample(metrics, "gateway_version_bumps_total", outcome="error") == 0
    finally:
        await admin.aclose()
        await cache.close()
