"""Schedules in tests at the store level: "instances" as Stores on pools of their own,
as two gateway processes would hold them, a schedule written as a PUT writes it, and
the count of duplicated ticks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.schedule_bodies import parse_schedule
from gateway.metrics import Metrics
from gateway.rows import ScheduleRow
from gateway.schedules import plans
from gateway.store import Store
from tests.support.databases import fetch


@contextlib.asynccontextmanager
async def instances(url: str, count: int = 2) -> AsyncIterator[list[Store]]:
    stores = [Store(url, Metrics(), min_size=1, max_size=4) for _ in range(count)]
    for store in stores:
        await store.open()
    try:
        yield stores
    finally:
        for store in stores:
            await store.close()


async def put(store: Store, runtime_id: str, name: str, **body: Any) -> ScheduleRow:
    """Create or replace the schedule as `PUT /v1/runtimes/{rt}/schedules/{name}` does
    with `body` (a payload naming the schedule unless given)."""
    body.setdefault("payload", {"from": name})
    definition = parse_schedule(body, 1_000_000, 64)
    written = await store.write_schedule(
        runtime_id, name, lambda current, now: plans.put_write(definition, current, now)
    )
    return written.row


async def duplicates(url: str) -> int:
    """Tasks beyond the first of each (schedule, tick)."""
    found = await fetch(
        url,
        "SELECT count(*) - count(DISTINCT (schedule, scheduled_for)) AS extra FROM tasks",
    )
    return int(found[0]["extra"])
