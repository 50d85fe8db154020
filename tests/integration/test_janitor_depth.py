"""The queue-depth gauges: counted every pass while the count is quick, and only once
DEPTH_DUTY times its last duration has passed when it is slow, so that a large queue
never makes counting most of the janitor's work."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.janitor import DEPTH_DUTY
from tests.support.gateways import running_gateway
from tests.support.janitor import first_pass_done, janitor_settings
from tests.support.metrics import sample

pytestmark = pytest.mark.integration


async def test_a_slow_count_waits_ten_times_its_duration(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        store, janitor = gw.gateway.store, gw.gateway.janitor
        real = store.queue_depth
        counted: list[tuple[float, float]] = []

        async def slow_count() -> Any:
            started = time.monotonic()
            await asyncio.sleep(0.2)  # a count over millions of live rows
            found = await real()
            counted.append((started, time.monotonic()))
            return found

        monkeypatch.setattr(store, "queue_depth", slow_count)
        await gw.enqueue(runtime_id, "first")
        await janitor.run_once()
        assert len(counted) == 1
        assert sample(gw, "gateway_tasks_stored", status="queued") == 1

        await gw.enqueue(runtime_id, "second")
        report = await janitor.run_once()  # too soon: the gauges keep their value
        assert len(counted) == 1, report
        assert sample(gw, "gateway_tasks_stored", status="queued") == 1
        assert report.errors == []

        started, ended = counted[0]
        await asyncio.sleep(max(0.0, started + DEPTH_DUTY * (ended - started) - time.monotonic()))
        await asyncio.sleep(0.05)
        await janitor.run_once()
        assert len(counted) == 2
        assert sample(gw, "gateway_tasks_stored", status="queued") == 2
        passes = gw.gateway.metrics.registry.get_sample_value("gateway_janitor_pass_seconds_count")
        assert passes is not None and passes >= 4  # the loop's first pass and three here
