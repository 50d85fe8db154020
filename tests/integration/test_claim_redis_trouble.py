"""A failing Redis command path (pub/sub still up) is noticed by an instance whose polls
all sleep on a cached verdict: they stop trusting it and poll Postgres (I5).

Both instances reach Redis's commands through a loopback proxy that the test
blackholes; their pub/sub connections go straight to Redis, so no wake-up path notices
anything. A bump lost to the blackhole would otherwise hide the task from the parked
poll for the verdict's whole life (30 s here).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

import gateway.instance
from gateway.redis.clients import make_pubsub_client
from tests.support.gateways import make_settings, running_gateway
from tests.support.janitor import empty_verdict
from tests.support.metrics import sample
from tests.support.proxy import BlackholeProxy
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

FOUND_WITHIN_SECONDS = 5.0  # a ping (0.75 s at most), a spread re-check (1 s), a claim


@pytest.fixture
async def proxy(redis_process: Any) -> AsyncIterator[BlackholeProxy]:
    proxy = BlackholeProxy(redis_process.port)
    await proxy.start()
    yield proxy
    proxy.heal()
    await proxy.close()


async def test_a_parked_poll_learns_that_redis_commands_fail_and_polls_postgres(
    database_url: str,
    redis_process: Any,
    proxy: BlackholeProxy,
    redis_prefix: str,
    runtime_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        gateway.instance,
        "make_pubsub_client",
        lambda _url, timeout: make_pubsub_client(redis_process.url, timeout),
    )
    cfg = make_settings(
        database_url, proxy.url, redis_prefix,
        redis_timeout_ms=100, empty_ttl_seconds=30, janitor_interval_seconds=3600,
    )  # fmt: skip
    async with running_gateway(cfg) as polled, running_gateway(cfg) as producer:
        await wait_until(lambda: polled.gateway.subscriber.healthy, 5, "subscriber up")
        await empty_verdict(polled, runtime_id)
        waiting = asyncio.create_task(polled.claim(runtime_id, "parked", wait_seconds=20))
        await wait_until(lambda: polled.gateway.claimer.parked(runtime_id) == 1, 3, "parked")
        await asyncio.sleep(1.5)  # the watch pings meanwhile: Redis is fine
        assert sample(polled, "gateway_redis_errors_total") == 0

        proxy.blackhole()
        try:
            started = time.monotonic()
            task = await producer.enqueue(runtime_id, {"job": "behind a lost bump"})
            assert sample(producer, "gateway_version_bumps_total", outcome="error") == 1
            got = await asyncio.wait_for(waiting, 25)
            elapsed = time.monotonic() - started
        finally:
            # Healed before the gateways stop: a Redis connection cancelled halfway
            # through its handshake at shutdown would be left for the collector.
            proxy.heal()
        assert [t["id"] for t in got] == [task["id"]], f"after {elapsed:.1f}s"
        assert elapsed < FOUND_WITHIN_SECONDS, f"found after {elapsed:.1f}s"
        assert polled.gateway.subscriber.healthy, "pub/sub stayed up: not what noticed"
