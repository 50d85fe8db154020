"""GATEWAY_CACHE=off: every claim goes to Postgres, wake-ups still flow through Redis."""

from __future__ import annotations

import asyncio

from tests.support.gateways import make_settings, running_gateway
from tests.support.metrics import sample


async def test_cache_off_serves_a_herd_without_spinning(
    database_url, redis_url, redis_prefix, runtime_id
):
    # Regression: when one claim filled every parked poll, the pump looped without
    # yielding (nothing awaited with the cache off) and froze the event loop.
    settings = make_settings(database_url, redis_url, redis_prefix, cache_enabled=False)
    async with running_gateway(settings) as gw:
        polls = [
            asyncio.create_task(gw.claim(runtime_id, f"w{i}", wait_seconds=10)) for i in range(20)
        ]
        await asyncio.sleep(0.3)
        status, body = await gw.call(
            "POST",
            f"/v1/runtimes/{runtime_id}/tasks:batch",
            {"tasks": [{"payload": i} for i in range(20)]},
        )
        assert status == 201, body
        async with asyncio.timeout(5):
            results = await asyncio.gather(*polls)
            status, _ = await gw.call("GET", "/healthz")
        assert status == 200
        ids = [t["id"] for r in results for t in r]
        assert sorted(ids) == sorted(t["id"] for t in body["tasks"])
        before = sample(gw, "gateway_verdict_checks_total", outcome="hit")
        assert await gw.claim(runtime_id, "late", wait_seconds=0) == []
        assert sample(gw, "gateway_verdict_checks_total", outcome="hit") == before
