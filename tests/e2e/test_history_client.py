"""The Python client's history calls, async and blocking, against a real gateway:
runtime_history, fleet_history (from a token limited to one runtime) and the listing's
sparklines, with the answers typed; a bad window is ValidationFailed naming it.
Buckets of 1 s, on a database of the test's own."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway_client import AsyncClient, Client, HistoryPoint, ValidationFailed
from tests.support.credentials import make_token
from tests.support.gateways import TOKEN, running_gateway
from tests.support.janitor import first_pass_done, janitor_settings


async def test_the_client_reads_the_history(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    settings = janitor_settings(
        own_database_url, redis_url, redis_prefix, history_interval_seconds=1
    )
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        await first_pass_done(gw)
        for n in range(3):
            await client.enqueue(runtime_id, {"n": n})
        claimed = await client.claim(runtime_id, "w", max_tasks=2)
        await client.complete(claimed[0].id, claimed[0].lease_id or "")
        # Into the next bucket, not further: the rollup reads the depth of the bucket
        # that has just ended only (a fixed 1.1 s could land two buckets on).
        await asyncio.sleep(1.05 - time.time() % 1)
        await gw.gateway.janitor.run_once()

        history = await client.runtime_history(runtime_id, "24h")
        assert (history.runtime_id, history.window, history.interval_seconds) == (
            runtime_id,
            "24h",
            1,
        )
        assert all(isinstance(p, HistoryPoint) for p in history.points)
        assert sum(p.enqueued for p in history.points) == 3
        assert sum(p.claimed for p in history.points) == 2
        assert sum(p.completed for p in history.points) == 1
        assert history.points[-1].depth == 1

        reader = (await make_token(gw, ["read"], [runtime_id]))["token"]
        async with AsyncClient(gw.url, reader) as limited:
            fleet = await limited.fleet_history()
            assert fleet.top_by_depth == {runtime_id: 1}
            assert fleet.top_by_failures == {}
            assert sum(p.claimed for p in fleet.points) == 2
            page = await limited.list_runtimes(include_sparkline=True)
            [summary] = page.runtimes
            assert [p.depth for p in summary.sparkline or []] == [1]
            assert (await limited.list_runtimes()).runtimes[0].sparkline is None
            with pytest.raises(ValidationFailed) as bad:
                await limited.runtime_history(runtime_id, "1y")  # type: ignore[arg-type]
            assert bad.value.field == "window"

        def blocking() -> tuple[Any, Any]:
            with Client(gw.url, TOKEN) as sync:
                return sync.runtime_history(runtime_id), sync.fleet_history("7d")

        mine, every = await asyncio.to_thread(blocking)
        assert mine.points == history.points
        assert every.window == "7d" and sum(p.enqueued for p in every.points) == 3
