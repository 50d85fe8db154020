"""Idle Postgres cost: while polls are parked and nothing happens, the instance that
wrote a runtime's empty verdict renews it in Redis before its life ends, instead of
scanning Postgres again, as long as no bump made it stale and no delayed task comes
due first (I4)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.api import requests
from tests.support.claims import pg_claims, poll, wait_parked
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample

pytestmark = pytest.mark.integration

TTL = 1.0  # short, so that a test sees several lives of a verdict
QUIET = {"empty_ttl_seconds": TTL, "janitor_interval_seconds": 3600}


def renewals(inst: Instance, outcome: str = "renewed") -> float:
    return sample(inst, "gateway_verdict_renewals_total", outcome=outcome)


async def test_parked_polls_cost_postgres_nothing_over_many_verdict_lives(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as a:
        polls = [
            asyncio.create_task(poll(a, runtime_id, f"w{i}", wait_seconds=5)) for i in range(5)
        ]
        await wait_parked(a, runtime_id, 5)
        claims, renewed = pg_claims(a), renewals(a)
        await asyncio.sleep(3.5 * TTL)
        assert pg_claims(a) == claims, "a verdict's end sent the parked polls to Postgres"
        assert renewals(a) >= renewed + 2
        for answer in await asyncio.gather(*polls):
            assert answer.tasks == []


async def test_a_bump_whose_wake_up_was_lost_stops_the_renewal(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A task committed and a bump that landed in Redis, but its wake-up never arrived
    (a lost publish): the renewal sees the new version, so the verdict lapses and the
    parked poll finds the task within a verdict's life, not at the janitor's pass."""
    cfg = make_settings(database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as a:
        waiting = asyncio.create_task(poll(a, runtime_id, "w", wait_seconds=8))
        await wait_parked(a, runtime_id, 1)
        req = requests.parse_enqueue({"payload": {"lost": "wake-up"}}, None, 1 << 20, 64)
        row, _ = await a.gateway.store.enqueue(runtime_id, req)  # no bump, no publish
        redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        try:
            await redis.set(a.gateway.cache.keys(runtime_id).version, "another-epoch:1")
        finally:
            await redis.aclose()
        answer = await asyncio.wait_for(waiting, 10)
        assert [t["id"] for t in answer.tasks] == [str(row.id)]
        assert answer.elapsed < 8, "the poll ran out its wait: the stale verdict was renewed"


async def test_a_renewed_verdict_never_outlives_a_delayed_task(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """I4 across renewals: a task delayed by several verdict lives reaches the poll that
    parked before it came due, with no wake-up."""
    cfg = make_settings(database_url, redis_url, redis_prefix, **QUIET)
    async with running_gateway(cfg) as a:
        task = await a.enqueue(runtime_id, {"late": True}, delay_seconds=3 * TTL)
        answer = await poll(a, runtime_id, "w", wait_seconds=8)
        assert [t["id"] for t in answer.tasks] == [task["id"]]
        assert answer.elapsed < 8, "the poll ran out its wait: a renewal hid the due task"
        assert renewals(a) >= 1
