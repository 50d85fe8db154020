"""The janitor's VACUUM of the task table after a burst (janitor.Janitor._vacuum): a pass
that finds GATEWAY_JANITOR_VACUUM_DEAD_ROWS dead row versions or more starts one, a pass
that finds fewer does not, and one that meets another VACUUM of the table skips at once
instead of waiting behind it.

Each test has a database of its own with autovacuum off for the task table, so that the
VACUUMs Postgres counts (pg_stat_user_tables.vacuum_count) are the janitor's alone. The
burst goes through the gateway's own statements (Store.claim, Store.complete_group):
each task completed leaves two dead row versions, its queued one and its claimed one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest

from tests.support.databases import execute, fetch
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import first_pass_done, janitor_settings
from tests.support.metrics import sample
from tests.support.stores import open_store

pytestmark = pytest.mark.integration

THRESHOLD = 2000  # dead row versions: the burst of 1,000 tasks below leaves 2,000
FILLER_ROWS = 300_000
STATS_WITHIN_SECONDS = 15.0  # a backend reports its changes as it ends, or soon after


async def no_autovacuum(url: str) -> str:
    await execute(url, "ALTER TABLE tasks SET (autovacuum_enabled = false)")
    return url


async def complete_tasks(url: str, runtime: str, n: int) -> None:
    """`n` tasks enqueued, then claimed and completed through the gateway's statements
    on a Store of one connection, closed afterwards: its backend ends, and reports its
    changes to the statistics as it does."""
    await execute(
        url,
        "INSERT INTO tasks (runtime_id, payload) "
        "SELECT $1, '{}'::jsonb FROM generate_series(1, $2::int)",
        runtime,
        n,
    )
    async with open_store(url) as store:
        while leased := (await store.claim(runtime, ["burst"] * 500, [60.0] * 500))[0]:
            ids = [x.task.id for x in leased]
            leases = [x.task.lease_id for x in leased]
            done = await store.complete_group(ids, leases, [None] * len(ids))  # type: ignore[arg-type]
            assert len(done) == len(ids)


async def table_stats(url: str) -> dict[str, Any]:
    rows = await fetch(
        url,
        "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relid = 'tasks'::regclass",
    )
    return dict(rows[0])


async def dead_rows_reach(url: str, n: int) -> None:
    deadline = time.monotonic() + STATS_WITHIN_SECONDS
    while (await table_stats(url))["n_dead_tup"] < n:
        assert time.monotonic() < deadline, f"the statistics never counted {n} dead rows"
        await asyncio.sleep(0.1)


async def vacuum_ends(gw: Instance, within: float = 30.0) -> None:
    task = gw.gateway.janitor.vacuuming
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), within)


async def test_a_pass_vacuums_after_a_burst_and_not_before(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url = await no_autovacuum(own_database_url)
    # Rows that stay: the burst's dead rows then sit on under 2% of the table's pages,
    # where a VACUUM left to itself would keep their index entries for later, and the
    # ANALYZE after it would count them as dead again (sql/janitor.py, VACUUM_TASKS).
    await execute(
        url,
        "INSERT INTO tasks (runtime_id, payload) "
        "SELECT $1, '{}'::jsonb FROM generate_series(1, $2::int)",
        f"{runtime_id}-waiting",
        FILLER_ROWS,
    )
    settings = janitor_settings(url, redis_url, redis_prefix, janitor_vacuum_dead_rows=THRESHOLD)
    async with running_gateway(settings) as gw:
        await first_pass_done(gw)
        janitor = gw.gateway.janitor

        await complete_tasks(url, runtime_id, 400)  # 800 dead rows: no burst
        await dead_rows_reach(url, 800)
        report = await janitor.run_once()
        assert report.dead_rows is not None and 800 <= report.dead_rows < THRESHOLD
        assert not report.vacuum_started and janitor.vacuuming is None
        assert (await table_stats(url))["vacuum_count"] == 0

        await complete_tasks(url, runtime_id, 1000)  # 2,000 more
        await dead_rows_reach(url, 2800)
        report = await janitor.run_once()
        assert report.vacuum_started and report.dead_rows is not None
        assert report.dead_rows >= THRESHOLD
        await vacuum_ends(gw)
        after = await table_stats(url)
        assert after["vacuum_count"] == 1
        assert after["n_dead_tup"] < THRESHOLD
        assert sample(gw, "gateway_janitor_vacuums_total", outcome="done") == 1

        # The dead rows are gone: the next pass starts none.
        report = await janitor.run_once()
        assert not report.vacuum_started and janitor.vacuuming is None


async def test_a_vacuum_running_already_is_skipped_not_waited_for(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url = await no_autovacuum(own_database_url)
    settings = janitor_settings(url, redis_url, redis_prefix, janitor_vacuum_dead_rows=THRESHOLD)
    async with running_gateway(settings) as gw:
        await first_pass_done(gw)
        janitor = gw.gateway.janitor
        await complete_tasks(url, runtime_id, 1500)
        await dead_rows_reach(url, 3000)

        # The lock a VACUUM holds on the table (autovacuum's, or another replica's
        # janitor's), held here in an open transaction.
        holder = await asyncpg.connect(url)
        try:
            async with holder.transaction():
                await holder.execute("LOCK TABLE tasks IN SHARE UPDATE EXCLUSIVE MODE")
                report = await janitor.run_once()
                assert report.vacuum_started
                await vacuum_ends(gw, within=5.0)
                assert sample(gw, "gateway_janitor_vacuums_total", outcome="skipped") == 1
                # Writes went on meanwhile, and go on.
                await execute(url, "UPDATE tasks SET priority = 60 WHERE runtime_id = $1", "none")
        finally:
            await holder.close()
        assert (await table_stats(url))["vacuum_count"] == 0

        # Once the other is over, the next pass runs its own.
        report = await janitor.run_once()
        assert report.vacuum_started
        await vacuum_ends(gw)
        assert sample(gw, "gateway_janitor_vacuums_total", outcome="done") == 1
        assert (await table_stats(url))["vacuum_count"] == 1


async def test_off_at_zero(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url = await no_autovacuum(own_database_url)
    settings = janitor_settings(url, redis_url, redis_prefix, janitor_vacuum_dead_rows=0)
    async with running_gateway(settings) as gw:
        await first_pass_done(gw)
        await complete_tasks(url, runtime_id, 1500)
        await dead_rows_reach(url, 3000)
        report = await gw.gateway.janitor.run_once()
        assert report.dead_rows is None and not report.vacuum_started
        assert (await table_stats(url))["vacuum_count"] == 0
