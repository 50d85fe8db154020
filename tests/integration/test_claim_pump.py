"""A runtime's pump lives as long as it has polls to serve (I10: nothing outlives the
drain). It used to sleep out the verdict's life after its last poll left, and once
the claimer forgot the runtime, the drain at shutdown could not reach it."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.gateways import make_settings, running_gateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def pumps(runtime_id: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"pump:{runtime_id}"]


async def test_a_pump_stops_when_its_last_poll_leaves(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=30)
    async with running_gateway(cfg) as gw:
        for _ in range(2):  # the second poll parks on the first one's 30 s verdict
            assert await gw.claim(runtime_id, wait_seconds=0.2) == []
            await wait_until(lambda: not pumps(runtime_id), 2, "the pump to stop")
        task = await gw.enqueue(runtime_id, "after")
        assert [t["id"] for t in await gw.claim(runtime_id, wait_seconds=1)] == [task["id"]]
