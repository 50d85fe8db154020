"""The claim path's and the janitor's metrics: enqueue-to-claim delay, long-poll wait,
wake-ups received and delivered, and the queue-depth gauges."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.claims import poll, wait_parked
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample

pytestmark = pytest.mark.integration

QUIET = {"empty_ttl_seconds": 30, "janitor_interval_seconds": 3600}


def histogram(inst: Instance, name: str) -> tuple[float, float]:
    return sample(inst, f"{name}_count"), sample(inst, f"{name}_sum")


async def test_claim_delay_counts_from_run_at_or_created_at(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as gw:
        count, total = histogram(gw, "gateway_claim_delay_seconds")
        await gw.enqueue(runtime_id, "now")
        await gw.enqueue(runtime_id, "later", delay_seconds=0.5)
        await asyncio.sleep(1.0)
        tasks = await gw.claim(runtime_id, max_tasks=2, lease_seconds=600)
        assert len(tasks) == 2
        after_count, after_total = histogram(gw, "gateway_claim_delay_seconds")
        assert after_count == count + 2
        # About 1 s for the first task, 0.5 s for the delayed one (from its run_at).
        assert 1.4 <= after_total - total < 1.5 + 2.0, after_total - total


async def test_long_poll_wait_is_observed_for_polls_that_wait(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as gw:
        count, total = histogram(gw, "gateway_long_poll_wait_seconds")
        assert await gw.claim(runtime_id) == []  # no wait: not a long poll
        assert histogram(gw, "gateway_long_poll_wait_seconds")[0] == count
        assert await gw.claim(runtime_id, wait_seconds=0.3) == []
        after_count, after_total = histogram(gw, "gateway_long_poll_wait_seconds")
        assert after_count == count + 1
        assert 0.3 <= after_total - total < 2.0
        max_bucket = sample(gw, "gateway_long_poll_wait_seconds_bucket", le="60.0")
        assert max_bucket == after_count  # GATEWAY_MAX_WAIT_SECONDS (60) is a bucket


async def test_wakeups_received_and_delivered(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A poll parked on A gets a task enqueued through B: one wake-up received by pub/sub,
    one delivered. One enqueued through A itself is delivered too (a local bump). A poll
    that finds work waiting was never parked: nothing is delivered. (Sync match is off:
    it would hand A's own enqueue to the poll without a wake-up.)"""
    cfg = make_settings(database_url, redis_url, redis_prefix, sync_match_enabled=False, **QUIET)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        for producer in (b, a):
            received = sample(a, "gateway_wakeups_received_total")
            delivered = sample(a, "gateway_wakeups_delivered_total")
            waiting = asyncio.create_task(poll(a, runtime_id, wait_seconds=10))
            await wait_parked(a, runtime_id, 1)
            await producer.enqueue(runtime_id, "wake")
            answer = await asyncio.wait_for(waiting, 5)
            assert len(answer.tasks) == 1
            assert sample(a, "gateway_wakeups_delivered_total") == delivered + 1
            if producer is b:
                assert sample(a, "gateway_wakeups_received_total") > received
        delivered = sample(a, "gateway_wakeups_delivered_total")
        await b.enqueue(runtime_id, "waiting already")
        await asyncio.sleep(0.2)
        assert len(await a.claim(runtime_id, wait_seconds=5)) == 1
        assert sample(a, "gateway_wakeups_delivered_total") == delivered


async def test_the_janitor_leader_gauges_queue_depth(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(own_database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as gw:
        for n in range(3):
            await gw.enqueue(runtime_id, n)
        await gw.enqueue(runtime_id, "later", delay_seconds=3600)
        await gw.claim(runtime_id, lease_seconds=600)
        await asyncio.sleep(0.5)
        janitor = gw.gateway.janitor
        assert janitor.is_leader
        await janitor.run_once()
        counts = {
            status: sample(gw, "gateway_tasks_stored", status=status)
            for status in ("queued", "claimed", "completed", "dead", "expired", "cancelled")
        }
        assert counts == {"queued": 3, "claimed": 1, "completed": 0, "dead": 0, "expired": 0,
                          "cancelled": 0}  # fmt: skip
        assert 0.5 <= sample(gw, "gateway_oldest_queued_age_seconds") < 30
        await janitor.stop()  # no longer the leader: the next one exports them
        registry = gw.gateway.metrics.registry
        assert registry.get_sample_value("gateway_tasks_stored", {"status": "queued"}) is None
        assert sample(gw, "gateway_oldest_queued_age_seconds") == 0
