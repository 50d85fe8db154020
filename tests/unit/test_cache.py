"""VerdictCache on fakeredis: versions, verdicts, bumps, wake-ups and fail-open (I2, I3, I5)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest

from gateway.errors import CacheUnavailable
from gateway.metrics import Metrics
from gateway.redis.breaker import CircuitBreaker
from gateway.redis.keys import keys_for, runtime_of_channel
from gateway.redis.verdict import CLUSTER_BUMPS_AT_ONCE, VerdictCache
from tests.support.clocks import FakeClock
from tests.support.metrics import sample

PREFIX = "gw"
VERSION_TTL = 3600


def split(version: str) -> tuple[str, int]:
    epoch, _, counter = version.rpartition(":")
    assert epoch, f"version {version!r} has no epoch"
    return epoch, int(counter)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
async def client(server: fakeredis.FakeServer) -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    c = fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    yield c
    await c.aclose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def cache(client: fakeredis.FakeAsyncRedis, metrics: Metrics, clock: FakeClock) -> VerdictCache:
    return VerdictCache(
        client,
        PREFIX,
        metrics,
        timeout_seconds=0.25,
        version_ttl_seconds=VERSION_TTL,
        breaker=CircuitBreaker(3, 5.0, clock=clock),
    )


# --- keys -------------------------------------------------------------------------------


def test_keys_are_hash_tagged_per_runtime() -> None:
    k = keys_for("gw", "rt-1")
    assert k.version == "gw:{rt-1}:version"
    assert k.empty == "gw:{rt-1}:empty"
    assert k.wake == "gw:{rt-1}:wake"


def test_cache_keys_use_its_prefix(cache: VerdictCache) -> None:
    assert cache.keys("a.b:c").version == "gw:{a.b:c}:version"
    assert keys_for("other", "x").empty == "other:{x}:empty"


@pytest.mark.parametrize("runtime_id", ["a", "rt-1", "A.b_c:d-e", "x" * 128])
def test_runtime_of_channel_round_trips(runtime_id: str) -> None:
    assert runtime_of_channel("gw", keys_for("gw", runtime_id).wake) == runtime_id


@pytest.mark.parametrize(
    "channel",
    [
        "gw:{rt}:version",
        "gw:{rt}:empty",
        "other:{rt}:wake",
        "gwx:{rt}:wake",
        "gw:rt:wake",
        "gw:__gateway__",
        "",
    ],
)
def test_runtime_of_channel_refuses_other_channels(channel: str) -> None:
    assert runtime_of_channel("gw", channel) is None


# --- read / write / bump ---------------------------------------------------------------


async def test_first_read_creates_version_and_is_a_miss(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, metrics: Metrics
) -> None:
    assert await client.get("gw:{rt}:version") is None
    verdict = await cache.read("rt")
    assert verdict.hit is False
    assert verdict.ttl_seconds is None
    epoch, counter = split(verdict.version)
    assert counter == 0
    assert len(epoch) >= 8
    assert await client.get("gw:{rt}:version") == verdict.version

    again = await cache.read("rt")
    assert again.hit is False
    assert again.version == verdict.version
    assert sample(metrics, "gateway_verdict_checks_total", outcome="miss") == 2
    assert sample(metrics, "gateway_verdict_checks_total", outcome="hit") == 0


async def test_two_fresh_runtimes_get_different_epochs(cache: VerdictCache) -> None:
    a = await cache.read("a")
    b = await cache.read("b")
    assert split(a.version)[0] != split(b.version)[0]


async def test_concurrent_first_reads_agree_on_one_version(cache: VerdictCache) -> None:
    verdicts = await asyncio.gather(*(cache.read("rt") for _ in range(10)))
    assert len({v.version for v in verdicts}) == 1


async def test_write_empty_then_read_is_a_hit_with_ttl(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, metrics: Metrics
) -> None:
    version = (await cache.read("rt")).version
    await cache.write_empty("rt", version, 30)
    assert await client.get("gw:{rt}:empty") == version
    pttl = await client.pttl("gw:{rt}:empty")
    assert 29_000 < pttl <= 30_000

    verdict = await cache.read("rt")
    assert verdict.hit is True
    assert verdict.version == version
    assert verdict.ttl_seconds is not None
    assert 29.0 < verdict.ttl_seconds <= 30.0
    assert sample(metrics, "gateway_verdict_checks_total", outcome="hit") == 1


async def test_write_empty_with_fractional_ttl(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    version = (await cache.read("rt")).version
    await cache.write_empty("rt", version, 1.5)
    assert 1_000 < await client.pttl("gw:{rt}:empty") <= 1_500
    verdict = await cache.read("rt")
    assert verdict.hit and verdict.ttl_seconds is not None and verdict.ttl_seconds <= 1.5


async def test_hit_only_when_versions_equal(cache: VerdictCache) -> None:
    version = (await cache.read("rt")).version
    epoch, counter = split(version)
    for other in (f"{epoch}:{counter + 1}", f"{epoch}:{counter - 1}", f"x{epoch}:{counter}"):
        await cache.write_empty("rt", other, 30)
        assert (await cache.read("rt")).hit is False, other
    await cache.write_empty("rt", version, 30)
    assert (await cache.read("rt")).hit is True


async def test_verdict_expires_with_its_ttl(cache: VerdictCache) -> None:
    version = (await cache.read("rt")).version
    await cache.write_empty("rt", version, 0.05)
    await asyncio.sleep(0.15)
    assert (await cache.read("rt")).hit is False


async def test_bump_invalidates_and_counts_up_in_the_same_epoch(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, metrics: Metrics
) -> None:
    before = (await cache.read("rt")).version
    await cache.write_empty("rt", before, 30)
    assert (await cache.read("rt")).hit is True

    bumped = await cache.bump("rt")
    assert await client.get("gw:{rt}:version") == bumped
    after = await cache.read("rt")
    assert after.hit is False
    assert after.version == bumped
    assert split(after.version)[0] == split(before)[0]
    assert split(after.version)[1] == split(before)[1] + 1

    again = await cache.bump("rt")
    assert split(again) == (split(before)[0], split(before)[1] + 2)
    assert sample(metrics, "gateway_version_bumps_total", outcome="ok") == 2


async def test_bumps_in_a_cluster_go_out_several_at_a_time_each_in_its_place(
    client: fakeredis.FakeAsyncRedis, metrics: Metrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster's pipeline cannot carry the bump script, so bump_many sends the bumps
    one per call there; several at a time, as one after another a tick pass's bumps
    over many runtimes took seconds (8 s for 10,000 schedules, before the pipeline),
    and the pass waits for them. Each version comes back in its runtime's place, and a
    lost bump as None."""
    cache = VerdictCache(
        client,
        PREFIX,
        metrics,
        timeout_seconds=0.25,
        version_ttl_seconds=VERSION_TTL,
        breaker=CircuitBreaker(100, 5.0),
        cluster=True,
    )
    script = cache._bump_and_publish
    in_flight = most = 0

    async def counted(*, keys: list[str], args: list[Any]) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0)  # the round trip: another bump may start meanwhile
            if args[3] == "lost":
                raise ConnectionError("the node went away")
            return await script(keys=keys, args=args)
        finally:
            in_flight -= 1

    monkeypatch.setattr(cache, "_bump_and_publish", counted)
    runtimes = [f"rt{n}" for n in range(40)] + ["lost"]
    versions = await cache.bump_many(runtimes)
    assert 1 < most <= CLUSTER_BUMPS_AT_ONCE
    assert versions[-1] is None
    for runtime_id, version in zip(runtimes[:-1], versions, strict=False):
        assert version is not None and await client.get(f"gw:{{{runtime_id}}}:version") == version
    assert sample(metrics, "gateway_version_bumps_total", outcome="ok") == 40
    assert sample(metrics, "gateway_version_bumps_total", outcome="error") == 1


async def test_renewal_gives_a_verdict_a_new_life_while_no_bump_landed(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, metrics: Metrics
) -> None:
    version = (await cache.read("rt")).version
    await cache.write_empty("rt", version, 0.5)
    assert await cache.renew_empty("rt", version, 30) is True
    assert 29_000 < await client.pttl("gw:{rt}:empty") <= 30_000
    # Lapsed a moment ago (a late renewal), but no bump: the scan's answer still stands.
    await client.delete("gw:{rt}:empty")
    assert await cache.renew_empty("rt", version, 30) is True
    assert (await cache.read("rt")).hit is True
    assert sample(metrics, "gateway_verdict_renewals_total", outcome="renewed") == 2


async def test_renewal_refuses_a_verdict_a_bump_made_stale(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, metrics: Metrics
) -> None:
    version = (await cache.read("rt")).version
    await cache.write_empty("rt", version, 30)
    await cache.bump("rt")
    assert await cache.renew_empty("rt", version, 30) is False
    assert (await cache.read("rt")).hit is False
    await client.delete("gw:{rt}:version")  # lost: the next read starts a new epoch (I3)
    assert await cache.renew_empty("rt", version, 30) is False
    assert sample(metrics, "gateway_verdict_renewals_total", outcome="stale") == 2


async def test_i2_verdict_from_before_a_bump_is_stale(cache: VerdictCache) -> None:
    """read -> bump (lands during the scan) -> write_empty(version read before) -> miss."""
    sampled = (await cache.read("rt")).version
    await cache.bump("rt")
    await cache.write_empty("rt", sampled, 30)
    verdict = await cache.read("rt")
    assert verdict.hit is False
    assert verdict.version != sampled


async def test_i3_deleted_version_key_never_resurrects_old_verdict(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    old = (await cache.read("rt")).version
    await cache.write_empty("rt", old, 30)
    assert (await cache.read("rt")).hit is True

    await client.delete("gw:{rt}:version")
    assert await client.get("gw:{rt}:empty") == old  # the old verdict is still there
    verdict = await cache.read("rt")
    assert verdict.hit is False
    assert split(verdict.version)[0] != split(old)[0]
    assert split(verdict.version)[1] == 0


async def test_i3_flushall_then_old_verdict_written_back_is_no_hit(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    await cache.read("rt")
    await cache.bump("rt")
    old = (await cache.read("rt")).version  # "<epoch>:1"
    await cache.write_empty("rt", old, 30)
    assert (await cache.read("rt")).hit is True

    await client.flushall()
    # A verdict that survives (e.g. replicated late, or restored) under the old epoch.
    await client.set("gw:{rt}:empty", old, ex=30)
    fresh = await cache.read("rt")
    assert fresh.hit is False
    assert split(fresh.version)[0] != split(old)[0]
    # Bumps in the new epoch never reach the old version either.
    for _ in range(3):
        await cache.bump("rt")
        await client.set("gw:{rt}:empty", old, ex=30)
        assert (await cache.read("rt")).hit is False


async def test_i3_bump_on_missing_key_starts_new_epoch_at_one(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    old = (await cache.read("rt")).version
    await client.delete("gw:{rt}:version")
    bumped = await cache.bump("rt")
    epoch, counter = split(bumped)
    assert counter == 1
    assert epoch != split(old)[0]
    assert await client.get("gw:{rt}:version") == bumped


async def test_bump_on_never_read_runtime_starts_at_one(cache: VerdictCache) -> None:
    bumped = await cache.bump("new")
    assert split(bumped)[1] == 1
    assert (await cache.read("new")).version == bumped


@pytest.mark.parametrize("garbage", ["garbage", "abc:", "abc:x1", ":", "12"])
async def test_i3_bump_on_garbage_starts_new_epoch(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis, garbage: str
) -> None:
    await client.set("gw:{rt}:version", garbage)
    bumped = await cache.bump("rt")
    epoch, counter = split(bumped)
    assert counter == 1
    assert garbage not in (epoch, bumped)
    assert len(epoch) >= 8


async def test_runtimes_are_isolated(cache: VerdictCache) -> None:
    va = (await cache.read("a")).version
    vb = (await cache.read("b")).version
    await cache.write_empty("a", va, 30)
    await cache.write_empty("b", vb, 30)

    await cache.bump("a")
    assert (await cache.read("a")).hit is False
    b = await cache.read("b")
    assert b.hit is True
    assert b.version == vb


async def test_bump_publishes_wakeup_on_runtime_channel(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    pubsub = client.pubsub()
    await pubsub.subscribe("gw:{rt}:wake", "gw:{other}:wake")
    for _ in range(2):
        confirm = await pubsub.get_message(timeout=1.0)
        assert confirm is not None and confirm["type"] == "subscribe"

    await cache.bump("rt")
    message: dict[str, Any] | None = None
    deadline = time.monotonic() + 2.0
    while message is None and time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
    assert message is not None, "bump published no wake-up"
    assert message["type"] == "message"
    assert message["channel"] == "gw:{rt}:wake"
    assert runtime_of_channel("gw", message["channel"]) == "rt"
    assert message["data"] == "rt"
    # Nothing on the other runtime's channel.
    assert await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1) is None
    await pubsub.aclose()


async def test_version_ttl_set_on_creation_and_renewed_by_bump(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    await cache.read("rt")
    ttl = await client.ttl("gw:{rt}:version")
    assert VERSION_TTL - 5 <= ttl <= VERSION_TTL

    await client.expire("gw:{rt}:version", 100)
    assert await client.ttl("gw:{rt}:version") <= 100
    await cache.bump("rt")
    ttl = await client.ttl("gw:{rt}:version")
    assert VERSION_TTL - 5 <= ttl <= VERSION_TTL


async def test_bump_on_missing_key_sets_version_ttl(
    cache: VerdictCache, client: fakeredis.FakeAsyncRedis
) -> None:
    await cache.bump("rt")
    ttl = await client.ttl("gw:{rt}:version")
    assert VERSION_TTL - 5 <= ttl <= VERSION_TTL


async def test_ping(cache: VerdictCache, server: fakeredis.FakeServer) -> None:
    assert await cache.ping() is True
    server.connected = False
    assert await cache.ping() is False


# --- fail open (I5) -----------------------------------------------------------------------


async def test_each_call_raises_cache_unavailable_when_redis_is_down(
    cache: VerdictCache, server: fakeredis.FakeServer, metrics: Metrics
) -> None:
    server.connected = False
    with pytest.raises(CacheUnavailable):
        await cache.read("rt")
    assert sample(metrics, "gateway_redis_errors_total") == 1
    with pytest.raises(CacheUnavailable):
        await cache.write_empty("rt", "e:0", 30)
    assert sample(metrics, "gateway_redis_errors_total") == 2
    assert not cache.breaker.is_open
    assert sample(metrics, "gateway_redis_breaker_open") == 0
    with pytest.raises(CacheUnavailable):
        await cache.bump("rt")
    assert sample(metrics, "gateway_redis_errors_total") == 3
    assert sample(metrics, "gateway_version_bumps_total", outcome="error") == 1
    assert sample(metrics, "gateway_version_bumps_total", outcome="ok") == 0
    # A failed read is neither a hit nor a miss in the cache's own count.
    assert sample(metrics, "gateway_verdict_checks_total", outcome="hit") == 0
    assert sample(metrics, "gateway_verdict_checks_total", outcome="miss") == 0


async def test_breaker_opens_and_skips_redis_until_open_time_passes(
    cache: VerdictCache,
    client: fakeredis.FakeAsyncRedis,
    server: fakeredis.FakeServer,
    metrics: Metrics,
    clock: FakeClock,
) -> None:
    server.connected = False
    for _ in range(3):
        with pytest.raises(CacheUnavailable):
            await cache.read("rt")
    assert cache.breaker.is_open
    assert sample(metrics, "gateway_redis_errors_total") == 3
    assert sample(metrics, "gateway_redis_breaker_open") == 1

    # Redis is back, but the breaker refuses without touching it.
    server.connected = True
    clock.advance(4.9)
    with pytest.raises(CacheUnavailable, match="breaker"):
        await cache.read("rt")
    with pytest.raises(CacheUnavailable, match="breaker"):
        await cache.write_empty("rt", "e:0", 30)
    with pytest.raises(CacheUnavailable, match="breaker"):
        await cache.bump("rt")
    assert await client.keys("*") == []  # no read created a version, no write, no bump
    assert sample(metrics, "gateway_redis_errors_total") == 3  # refused calls are not errors
    assert sample(metrics, "gateway_version_bumps_total", outcome="error") == 1
    assert sample(metrics, "gateway_redis_breaker_open") == 1

    # After open_seconds one probe goes through; its success closes the breaker.
    clock.advance(0.1)
    verdict = await cache.read("rt")
    assert verdict.hit is False
    assert await client.get("gw:{rt}:version") == verdict.version
    assert not cache.breaker.is_open
    assert sample(metrics, "gateway_redis_breaker_open") == 0
    await cache.write_empty("rt", verdict.version, 30)
    assert (await cache.read("rt")).hit is True
    await cache.bump("rt")


async def test_failed_probe_reopens_the_breaker(
    cache: VerdictCache,
    client: fakeredis.FakeAsyncRedis,
    server: fakeredis.FakeServer,
    metrics: Metrics,
    clock: FakeClock,
) -> None:
    server.connected = False
    for _ in range(3):
        with pytest.raises(CacheUnavailable):
            await cache.read("rt")
    clock.advance(5.0)
    with pytest.raises(CacheUnavailable):
        await cache.read("rt")  # the probe reaches Redis and fails
    assert sample(metrics, "gateway_redis_errors_total") == 4
    assert cache.breaker.is_open

    server.connected = True
    with pytest.raises(CacheUnavailable, match="breaker"):
        await cache.read("rt")
    assert await client.keys("*") == []
    clock.advance(5.0)
    assert (await cache.read("rt")).hit is False
    assert not cache.breaker.is_open


async def test_success_resets_consecutive_failures(
    cache: VerdictCache, server: fakeredis.FakeServer
) -> None:
    for _ in range(3):
        server.connected = False
        for _ in range(2):
            with pytest.raises(CacheUnavailable):
                await cache.read("rt")
        server.connected = True
        await cache.read("rt")
    assert not cache.breaker.is_open


class _Hang:
    """A Redis client (and pipeline) whose every command hangs."""

    def register_script(self, script: str) -> Any:
        async def run(**kwargs: Any) -> Any:
            await asyncio.sleep(3600)

        return run

    def pipeline(self, transaction: bool = True) -> _Hang:
        return self

    async def __aenter__(self) -> _Hang:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def mget(self, *args: Any) -> None:
        return None

    def pttl(self, *args: Any) -> None:
        return None

    def publish(self, *args: Any) -> None:
        return None

    async def execute(self) -> Any:
        await asyncio.sleep(3600)

    async def set(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(3600)


async def test_hanging_redis_is_bounded_by_the_budget(metrics: Metrics) -> None:
    cache = VerdictCache(
        _Hang(),  # type: ignore[arg-type]
        PREFIX,
        metrics,
        timeout_seconds=0.05,
        version_ttl_seconds=VERSION_TTL,
        breaker=CircuitBreaker(3, 5.0),
    )
    for call in (
        lambda: cache.read("rt"),
        lambda: cache.write_empty("rt", "e:0", 30),
        lambda: cache.bump("rt"),
    ):
        started = time.monotonic()
        with pytest.raises(CacheUnavailable):
            await call()
        assert time.monotonic() - started < 1.0
    assert sample(metrics, "gateway_redis_errors_total") == 3
    assert cache.breaker.is_open


class _Answers(_Hang):
    """A Redis client whose pipeline answers MGET and PTTL with fixed values."""

    def __init__(self, answer: list[Any]) -> None:
        self._answer = answer

    async def execute(self) -> Any:
        return self._answer


@pytest.mark.parametrize(
    ("pttl", "hit"),
    [(0, False), (-1, False), (-2, False), (None, False), (1, True), (30_000, True)],
    ids=["spent", "no-expiry", "gone", "unknown", "1ms", "30s"],
)
async def test_a_hit_needs_a_life_to_park_for(metrics: Metrics, pttl: Any, hit: bool) -> None:
    """The pump wakes when a verdict lapses, when Redis may still hold it with PTTL 0:
    such a read (or one whose life is unknown) is a miss, never a hit that parks the
    poll for the whole empty TTL past a task coming due (I4)."""
    cache = VerdictCache(
        _Answers([["e:1", "e:1"], pttl]),  # type: ignore[arg-type]
        PREFIX,
        metrics,
        timeout_seconds=0.25,
        version_ttl_seconds=VERSION_TTL,
        breaker=CircuitBreaker(3, 5.0),
    )
    verdict = await cache.read("rt")
    assert verdict.hit is hit
    assert verdict.ttl_seconds == (pttl / 1000 if hit else None)
