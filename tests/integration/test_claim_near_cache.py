"""The near-cache: a process keeps the verdict hits of the runtimes it is subscribed to,
so that an empty poll costs no Redis round trip, and drops one at the runtime's next
wake-up (a bump on any instance), when Redis fails, and at the verdict's Redis TTL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from tests.support.claims import pg_claims, poll
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample

pytestmark = pytest.mark.integration

TTL = 30  # far beyond every bound below: only a drop can end a near-cached hit


async def wait_until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    """Run `check` (which sends a request) until it is true; fail after `within` s."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.1f}s waiting for {what}")
        await asyncio.sleep(0.01)


async def poll_until_tasks(inst: Instance, runtime: str, within: float, what: str) -> list[dict]:
    """Empty polls until one returns tasks; fail after `within` s."""
    got: list[dict] = []

    async def found() -> bool:
        got.extend((await poll(inst, runtime, wait_seconds=0)).tasks)
        return bool(got)

    await wait_until(found, within, what)
    return got


def local_hits(inst: Instance) -> float:
    return sample(inst, "gateway_verdict_local_hits_total")


def redis_reads(inst: Instance) -> float:
    return sum(
        sample(inst, "gateway_verdict_checks_total", outcome=o) for o in ("hit", "miss", "error")
    )


async def settle_near_hit(inst: Instance, runtime: str) -> None:
    """Poll until an empty poll is answered from the near-cache."""

    async def near_hit() -> bool:
        before = local_hits(inst)
        assert (await poll(inst, runtime, wait_seconds=0)).tasks == []
        return local_hits(inst) > before

    await wait_until(near_hit, 5.0, "an empty poll answered from the near-cache")


async def test_empty_polls_cost_no_redis_round_trip(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as a:
        await settle_near_hit(a, runtime_id)
        reads, claims, hits = redis_reads(a), pg_claims(a), local_hits(a)
        for _ in range(50):
            assert (await poll(a, runtime_id, wait_seconds=0)).tasks == []
        assert (redis_reads(a), pg_claims(a)) == (reads, claims)
        assert local_hits(a) == hits + 50


async def test_a_bump_on_another_instance_ends_the_near_cached_verdict(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Instance a answers empty polls from its near-cache; an enqueue through instance b
    (another app on the same Redis and Postgres) reaches a as a wake-up, and a's next
    polls go to Redis and find the task: not after the verdict's 30 s life."""
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        for round_ in range(3):
            await settle_near_hit(a, runtime_id)
            task = await b.enqueue(runtime_id, {"round": round_})
            # The wake-up's own latency, with a wide margin for a loaded machine.
            got = await poll_until_tasks(a, runtime_id, 2.0, "the task enqueued on b")
            assert [t["id"] for t in got] == [task["id"]]
            status, body = await a.complete(got[0])
            assert status == 200, body


async def test_a_redis_failure_drops_the_near_cache(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """After a Redis failure (breaker counting errors) the process does not trust what
    it kept: the next poll reads Redis again."""
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as a:
        await settle_near_hit(a, runtime_id)
        breaker = a.gateway.cache.breaker
        # A background call that succeeds (a renewal, a parked count) would make Redis
        # healthy again before the poll; on a loaded machine one often runs in between.
        # The test is of the poll right after a failure, so no success counts until then.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(breaker, "record_success", lambda: None)
            breaker.record_failure()  # as a failed call would
            hits, reads = local_hits(a), redis_reads(a)
            assert (await poll(a, runtime_id, wait_seconds=0)).tasks == []
        assert local_hits(a) == hits
        assert redis_reads(a) > reads


async def test_a_near_cached_verdict_ends_with_its_redis_ttl(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A delayed task coming due ends the verdict's life in Redis (I4), and so the copy's:
    the poll after that finds the task, with no wake-up at all."""
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as a:
        task = await a.enqueue(runtime_id, {"late": True}, delay_seconds=1)
        await settle_near_hit(a, runtime_id)
        got = await poll_until_tasks(a, runtime_id, 5.0, "the delayed task, once due")
        assert [t["id"] for t in got] == [task["id"]]


async def test_the_near_cache_can_be_turned_off(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(
        database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL, near_cache_enabled=False
    )
    async with running_gateway(cfg) as a:
        for _ in range(5):
            assert (await poll(a, runtime_id, wait_seconds=0)).tasks == []
        reads = redis_reads(a)
        for _ in range(10):
            assert (await poll(a, runtime_id, wait_seconds=0)).tasks == []
        assert local_hits(a) == 0
        assert redis_reads(a) >= reads + 10
