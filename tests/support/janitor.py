"""The janitor as its tests drive it: settings with the background loop quiet, so that a
test's own `janitor.run_once()` passes are the only ones, and rows made to look old
(leases lapsed, tasks claimable for a while, bumps lost) so that a pass has work.

The janitor works on the whole task table, not on one runtime, so most janitor tests
run against a freshly migrated database of their own (the `own_database_url` fixture
of tests/conftest.py): a pass's counts (`PassReport.reclaimed`, `.expired`, `.purged`,
`.repaired`) are then exact, and leadership (a per-database advisory lock) is not
shared with other tests' gateways.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import asyncpg

from gateway.settings import Settings
from tests.support.databases import execute, fetch
from tests.support.gateways import JANITOR_OFF, Instance, make_settings
from tests.support.stores import enqueue_request
from tests.support.waiting import wait_until


def janitor_settings(database_url: str, redis_url: str, prefix: str, **overrides: Any) -> Settings:
    """Gateway settings with the background janitor effectively off unless overridden."""
    values: dict[str, Any] = {"janitor_interval_seconds": JANITOR_OFF}
    values.update(overrides)
    return make_settings(database_url, redis_url, prefix, **values)


async def next_history_bucket(
    database_url: str, interval_seconds: int, after: datetime | None = None
) -> Any:
    """Waits for the start of the history bucket of `interval_seconds` that follows the
    one holding `after` (default: now), by the database's clock, whose buckets the
    triggers count into; returns that start. Pass a statement's `now()` as `after` when
    the next pass must read that statement's bucket as the one just ended: the clock
    may have crossed into the next bucket since the statement ran."""
    [row] = await fetch(
        database_url,
        "SELECT to_timestamp(b) AS at, b - extract(epoch FROM clock_timestamp()) AS wait"
        "  FROM (SELECT (floor(extract(epoch FROM coalesce($2, clock_timestamp())) / $1) + 1)"
        "               * $1 AS b) AS next",
        interval_seconds,
        after,
    )
    await asyncio.sleep(max(0.0, float(row["wait"])) + 0.05)
    return row["at"]


async def first_pass_done(inst: Instance) -> None:
    """Wait until the background loop holds leadership and its first pass is over, so
    that a test's own `run_once()` calls are the only passes that follow."""
    janitor = inst.gateway.janitor
    registry = inst.gateway.metrics.registry
    await wait_until(lambda: janitor.is_leader, 5.0, "the janitor to take leadership")
    await wait_until(
        lambda: (registry.get_sample_value("gateway_janitor_pass_seconds_count") or 0) >= 1,
        10.0,
        "the janitor's first pass to end",
    )
    # The first pass counted the queue; a count that a loaded machine made slow is not
    # made again until DEPTH_DUTY times its duration has passed. Wait for that, so that
    # a test's first run_once() counts, as it does on an idle machine.
    await asyncio.sleep(max(0.0, janitor._depth_due - time.monotonic()))


async def row_of(url: str, task_id: str) -> asyncpg.Record:
    rows = await fetch(url, "SELECT * FROM tasks WHERE id = $1::uuid", task_id)
    assert len(rows) == 1, f"task {task_id} is gone"
    return rows[0]


async def wait_lapsed(url: str, task_ids: list[str], within: float = 5.0) -> None:
    """Wait until Postgres sees every one of these leases as expired. A task no longer
    claimed counts too: a janitor running meanwhile may have reclaimed its lapsed lease
    already, and then all of them are never seen lapsed at once."""
    deadline = time.monotonic() + within
    while True:
        rows = await fetch(
            url,
            "SELECT count(*) AS n FROM tasks WHERE id = ANY($1::uuid[]) "
            "AND (status <> 'claimed' OR lease_expires_at < now())",
            task_ids,
        )
        if rows[0]["n"] == len(task_ids):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"leases of {task_ids} did not lapse within {within}s")
        await asyncio.sleep(0.05)


async def empty_verdict(inst: Instance, runtime: str, within: float = 3.0) -> None:
    """Make the runtime's verdict say empty: a claim that waits 0 s on a runtime with
    nothing claimable writes it. The answer can come back before the verdict is
    written, so wait for the hit."""
    assert await inst.claim(runtime, "verdict-maker", wait_seconds=0) == []
    cache = inst.gateway.cache
    deadline = time.monotonic() + within
    while not (await cache.read(runtime)).hit:
        if time.monotonic() > deadline:
            raise AssertionError(f"no empty verdict for {runtime} within {within}s")
        await asyncio.sleep(0.02)


async def enqueue_without_bump(inst: Instance, runtime: str, payload: Any, **fields: Any) -> str:
    """Insert a task the way the enqueue route does, minus `announce`: exactly what a
    version bump lost to a Redis fault after the commit leaves behind. Returns its id."""
    row, created = await inst.gateway.store.enqueue(runtime, enqueue_request(payload, **fields))
    assert created
    return str(row.id)


async def claimable_for_a_while(database_url: str, task_ids: list[Any]) -> None:
    """Move the rows' creation (and run_at, for due rows) a few seconds into the past:
    the repair leaves alone tasks that became claimable less than a second ago, whose
    bump may still be on its way. Delayed rows keep their future run_at."""
    await execute(
        database_url,
        "UPDATE tasks SET created_at = created_at - interval '5 seconds', "
        "run_at = CASE WHEN run_at <= now() THEN run_at - interval '5 seconds' ELSE run_at END "
        "WHERE id = ANY($1::uuid[])",
        [str(t) for t in task_ids],
    )
