"""The history's reads and the janitor's rollup read by index, never the whole history:
a runtime's points and the listing's sparklines by the primary key, the fleet's points
and top lists over a window by task_history_at_idx, the fold by
task_history_unfolded_idx, the depth by the bucket's rows and each runtime's queued
tasks, retention by the oldest buckets.

The data: 1,000 runtimes with a folded point a minute for two hours, one with a point
a minute for a week, a few unfolded rows of ended buckets, and queued tasks. A database
of the module's own, loaded once; the planner chooses on its own, under custom and
generic plans.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from gateway.store.sql import history as sql
from tests.support.plans import MODES, describe, explain, indexes, plan_of

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

RUNTIMES = 1_000
ZEROS = "'{0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::bigint[]"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def loaded(module_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(module_database_url)
    try:
        minute = "to_timestamp(floor(extract(epoch FROM now()) / 60) * 60)"
        await conn.execute(
            f"""
            INSERT INTO task_history (runtime_id, at, backend, enqueued, claimed, failed,
                                      waits, depth)
            SELECT 'rt-' || r, {minute} - make_interval(mins => m), 0, 5, 5, r % 3,
                   {ZEROS}, r % 50
              FROM generate_series(1, $1) AS r, generate_series(1, 120) AS m
            UNION ALL
            SELECT 'week', {minute} - make_interval(mins => m), 0, 1, 1, 0, {ZEROS}, 1
              FROM generate_series(1, 7 * 1440) AS m
            UNION ALL
            SELECT 'rt-' || r, {minute} - interval '1 minute', 1000 + r, 1, 0, 0, {ZEROS}, NULL
              FROM generate_series(1, 50) AS r
            """,
            RUNTIMES,
        )
        await conn.execute(
            "INSERT INTO tasks (runtime_id, payload) "
            "SELECT 'rt-' || (n % $1), '{}'::jsonb FROM generate_series(1, 20000) AS n",
            RUNTIMES,
        )
        await conn.execute("ANALYZE task_history")
        await conn.execute("ANALYZE tasks")
        yield conn
    finally:
        await conn.close()


async def plan(
    conn: asyncpg.Connection, statement: str, types: str, args: tuple[Any, ...], mode: str
) -> list[dict[str, Any]]:
    async with conn.transaction():
        return await explain(conn, statement, types, args, mode)


def history_scans(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        n for n in nodes if n.get("Relation Name") == "task_history" and "Scan" in n["Node Type"]
    ]


def by_index(nodes: list[dict[str, Any]], index: str) -> None:
    shown = describe(nodes)
    scans = history_scans(nodes)
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), shown
    assert index in indexes(nodes), shown


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["week", "rt-7"])
async def test_a_runtimes_points_read_its_range_of_the_primary_key(
    loaded: asyncpg.Connection, mode: str, runtime: str
) -> None:
    for seconds in (3600, 7 * 86400):
        nodes = await plan(loaded, sql.RUNTIME_POINTS, "text, int", (runtime, seconds), mode)
        by_index(nodes, "task_history_pkey")
        probes = [n for n in history_scans(nodes) if "Index Name" in n]
        assert all("runtime_id" in n["Index Cond"] for n in probes), describe(nodes)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("patterns", [None, ["rt-1*"]])
@pytest.mark.parametrize("statement", ["FLEET_POINTS", "TOP_BY_DEPTH", "TOP_BY_FAILURES"])
async def test_the_fleets_reads_walk_the_window_by_time(
    loaded: asyncpg.Connection, mode: str, patterns: list[str] | None, statement: str
) -> None:
    async with loaded.transaction():
        args = [(3600, "int"), (patterns, "text[]")]
        nodes = await plan_of(loaded, mode, getattr(sql, statement), args)
    by_index(nodes, "task_history_at_idx")


@pytest.mark.parametrize("mode", MODES)
async def test_the_sparklines_read_each_runtimes_range(
    loaded: asyncpg.Connection, mode: str
) -> None:
    runtimes = [f"rt-{n}" for n in range(50)]
    nodes = await plan(loaded, sql.SPARKLINES, "text[], int", (runtimes, 3600), mode)
    by_index(nodes, "task_history_pkey")


async def test_the_fold_reads_only_unfolded_rows(loaded: asyncpg.Connection) -> None:
    nodes = await plan(loaded, sql.FOLD, "int", (1000,), "force_generic_plan")
    shown = describe(nodes)
    picked = [n for n in history_scans(nodes) if n.get("Index Name") != "task_history_pkey"]
    assert picked and {n.get("Index Name") for n in picked} == {"task_history_unfolded_idx"}, shown


async def test_the_depth_reads_the_ended_bucket_and_each_runtimes_queue(
    loaded: asyncpg.Connection,
) -> None:
    nodes = await plan(loaded, sql.FILL_DEPTH, "int", (1000,), "force_generic_plan")
    shown = describe(nodes)
    by_index(nodes, "task_history_at_idx")
    tasks = [n for n in nodes if n.get("Relation Name") == "tasks" and "Scan" in n["Node Type"]]
    assert tasks and all(n["Node Type"] != "Seq Scan" for n in tasks), shown
    probes = [n for n in tasks if "Index Name" in n]
    assert probes and all("runtime_id" in n["Index Cond"] for n in probes), shown


async def test_retention_reads_the_oldest_buckets(loaded: asyncpg.Connection) -> None:
    nodes = await plan(loaded, sql.PURGE, "int, int", (1, 1000), "force_generic_plan")
    by_index(nodes, "task_history_at_idx")
