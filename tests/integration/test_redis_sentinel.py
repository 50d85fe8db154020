"""GATEWAY_REDIS_MODE=sentinel against a real master, replica and sentinel of the
test's own: the gateway finds the master through the sentinel for commands and
pub/sub, and after the master is killed and the replica promoted, both reach it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.claims import pg_claims, poll, timed_enqueue
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.janitor import empty_verdict
from tests.support.metrics import sample
from tests.support.redis_servers import LocalSentinel, require_redis_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[LocalSentinel]:
    require_redis_cli("the Sentinel tests")
    local = LocalSentinel(tmp_path)
    try:
        local.start()
        yield local
    finally:
        local.stop()


async def _verdict_made(inst: Instance, runtime: str, seconds: float = 20) -> None:
    """An empty verdict for `runtime`, the claim made again (1 s each) until one is
    written: a claim whose Redis write failed (the cache fails open) writes none."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            await empty_verdict(inst, runtime, within=1.0)
            return
        except Exception:  # a claim may fail outright while the master changes
            assert asyncio.get_running_loop().time() < deadline, f"no verdict for {runtime}"


async def _wakes_within_a_second(a: Instance, b: Instance, runtime: str) -> None:
    await empty_verdict(a, runtime)
    waiting = asyncio.create_task(poll(a, runtime, "parked", wait_seconds=15))
    await wait_until(lambda: a.gateway.claimer.parked(runtime) == 1, 3, "poll parked")
    channel = a.gateway.cache.keys(runtime).wake
    await wait_until(lambda: a.gateway.subscriber.confirmed(channel), 5, "subscription")
    await asyncio.sleep(0.2)
    task, sent = await timed_enqueue(b, runtime, "wake")
    answer = await asyncio.wait_for(waiting, 5)
    assert [t["id"] for t in answer.tasks] == [task["id"]]
    assert answer.answered - sent < 1.0, f"woken after {answer.answered - sent:.2f}s"
    await a.complete(answer.tasks[0])


async def test_the_gateway_reaches_the_master_through_the_sentinel_and_follows_a_failover(
    database_url: str, sentinel: LocalSentinel, redis_prefix: str, runtime_id: str
) -> None:
    cfg: Any = make_settings(
        database_url, sentinel.url, redis_prefix,
        redis_mode="sentinel", redis_sentinel_master=sentinel.master_name,
        redis_timeout_ms=200, degraded_poll_seconds=20,
    )  # fmt: skip
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        # A's first commands open connections through the sentinel, which on a busy
        # machine can outrun the 200 ms Redis budget: that verdict is then not written
        # (the cache fails open), so the claim is made again until one is.
        await _verdict_made(a, runtime_id)
        claims = pg_claims(a)
        for _ in range(5):
            assert (await poll(a, runtime_id, wait_seconds=0)).tasks == []
        assert pg_claims(a) == claims, "empty polls must be answered from Redis"
        await _wakes_within_a_second(a, b, runtime_id)

        reconnects = sample(a, "gateway_pubsub_reconnects_total")
        sentinel.kill_master()
        # Both clients find the new master: verdicts are written there, and wake-ups
        # published there reach the subscriber once it has reconnected.
        after = f"{runtime_id}-after"
        await _verdict_made(a, after)
        # The subscriber lost its connection with the old master; its reconnect asks
        # the sentinel, which now names the promoted replica.
        await wait_until(
            lambda: sample(a, "gateway_pubsub_reconnects_total") > reconnects, 10, "reconnect"
        )
        await wait_until(lambda: a.gateway.subscriber.healthy, 10, "subscriber on new master")
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # b's first bumps may still hit the old master's connections
            try:
                await _wakes_within_a_second(a, b, f"{after}-{int(deadline)}")
                break
            except AssertionError:
                assert asyncio.get_running_loop().time() < deadline, "no wake-up after failover"
