"""The history's reads and the janitor's rollup read by index, never the whole history:
a runtime's points and the listing's sparklines by the primary key; the fleet's reads,
for a token covering every runtime, from the rollups (the fleet's buckets by their
primary key, the last depths deepest first, the hourly failures by hour; the last
hour's failures by task_history_at_idx) with the unfolded rows by
task_history_unfolded_idx; for a limited token, each covered runtime's range of a
primary key; the fold by task_history_unfolded_idx, the depth by the bucket's rows and
each runtime's queued tasks, retention by the oldest buckets, of each table.

The data: 1,000 runtimes with a folded point a minute for two hours, one with a point
a minute for a week, a few unfolded rows of ended buckets, and queued tasks; the
rollups as the fold and the depth leave them. A database of the module's own, loaded
once; the planner chooses on its own, under custom and generic plans.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from bench.history import ROLLUPS_FROM_FOLDED
from gateway.store.sql import history as sql
from tests.support.plans import MODES, describe, explain, indexes, plan_of

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

RUNTIMES = 1_000
TABLES = ("task_history_fleet", "task_history_runtimes", "task_history_failures")
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
        for statement in ROLLUPS_FROM_FOLDED:
            await conn.execute(statement)
        for table in ("task_history", "tasks", *TABLES):
            await conn.execute(f"ANALYZE {table}")
        yield conn
    finally:
        await conn.close()


async def plan(
    conn: asyncpg.Connection, statement: str, types: str, args: tuple[Any, ...], mode: str
) -> list[dict[str, Any]]:
    async with conn.transaction():
        return await explain(conn, statement, types, args, mode)


def history_scans(nodes: list[dict[str, Any]], table: str = "task_history") -> list[dict[str, Any]]:
    return [n for n in nodes if n.get("Relation Name") == table and "Scan" in n["Node Type"]]


def by_index(nodes: list[dict[str, Any]], index: str, table: str = "task_history") -> None:
    shown = describe(nodes)
    scans = history_scans(nodes, table)
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), shown
    assert index in indexes(nodes), shown


ROLLUP_INDEXES = ("task_history_fleet", "task_history_runtimes", "task_history_failures")


def task_history_indexes(nodes: list[dict[str, Any]]) -> set[str]:
    """The indexes task_history is read by (a bitmap's index node names no table);
    a scan of the table without one is a failure."""
    assert all(n["Node Type"] != "Seq Scan" for n in history_scans(nodes)), describe(nodes)
    named = {n["Index Name"] for n in nodes if "Index Name" in n}
    return {i for i in named if i.startswith("task_history_") and not i.startswith(ROLLUP_INDEXES)}


def key_probes(nodes: list[dict[str, Any]], index: str) -> list[dict[str, Any]]:
    """The scans of `index` (plain or bitmap), each asserted to probe one runtime."""
    probes = [n for n in nodes if n.get("Index Name") == index]
    assert probes and all("runtime_id =" in n["Index Cond"] for n in probes), describe(nodes)
    return probes


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


async def fleet_plan(
    conn: asyncpg.Connection, mode: str, statement: str, seconds: int, patterns: Any = ()
) -> list[dict[str, Any]]:
    """The plan of a fleet read: `patterns` () for a statement of one parameter."""
    args: list[tuple[Any, str]] = [(seconds, "int")]
    if patterns != ():
        args.append((patterns, "text[]"))
    async with conn.transaction():
        return await plan_of(conn, mode, getattr(sql, statement), args)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seconds", [3600, 7 * 86400])
async def test_the_fleets_points_read_the_fleet_rows_and_the_unfolded_ones(
    loaded: asyncpg.Connection, mode: str, seconds: int
) -> None:
    nodes = await fleet_plan(loaded, mode, "FLEET_POINTS", seconds)
    # A week is every fleet row retention keeps (one a bucket): read whole, it may be.
    if seconds == 3600:
        by_index(nodes, "task_history_fleet_pkey", "task_history_fleet")
    assert history_scans(nodes, "task_history_fleet"), describe(nodes)
    assert task_history_indexes(nodes) == {"task_history_unfolded_idx"}, describe(nodes)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("patterns", [["rt-1*"], ["week"]])
@pytest.mark.parametrize(
    ("statement", "seconds"),
    [("COVERED_POINTS", 3600), ("COVERED_POINTS", 7 * 86400), ("COVERED_FAILURES", 3600)],
)
async def test_a_limited_tokens_reads_probe_each_covered_runtimes_range(
    loaded: asyncpg.Connection, mode: str, patterns: list[str], statement: str, seconds: int
) -> None:
    nodes = await fleet_plan(loaded, mode, statement, seconds, patterns)
    key_probes(nodes, "task_history_pkey")
    read = task_history_indexes(nodes)
    assert read <= {"task_history_pkey", "task_history_unfolded_idx"}, describe(nodes)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("patterns", [None, ["rt-1*"]])
async def test_the_top_by_depth_reads_the_runtimes_last_depths_only(
    loaded: asyncpg.Connection, mode: str, patterns: list[str] | None
) -> None:
    nodes = await fleet_plan(loaded, mode, "TOP_BY_DEPTH", 7 * 86400, patterns)
    assert history_scans(nodes) == [], describe(nodes)
    assert history_scans(nodes, "task_history_runtimes"), describe(nodes)
    if patterns is None:
        by_index(nodes, "task_history_runtimes_depth_idx", "task_history_runtimes")


@pytest.mark.parametrize("mode", MODES)
async def test_the_last_hours_failures_walk_the_window_by_time(
    loaded: asyncpg.Connection, mode: str
) -> None:
    nodes = await fleet_plan(loaded, mode, "TOP_BY_FAILURES", 3600)
    by_index(nodes, "task_history_at_idx")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seconds", [86400, 7 * 86400])
async def test_the_hourly_failures_read_the_windows_hours(
    loaded: asyncpg.Connection, mode: str, seconds: int
) -> None:
    nodes = await fleet_plan(loaded, mode, "HOURLY_FAILURES", seconds)
    by_index(nodes, "task_history_failures_hour_idx", "task_history_failures")
    assert task_history_indexes(nodes) == {"task_history_unfolded_idx"}, describe(nodes)
    nodes = await fleet_plan(loaded, mode, "COVERED_HOURLY_FAILURES", seconds, ["rt-1*"])
    assert all(n["Node Type"] != "Seq Scan" for n in history_scans(nodes, "task_history_failures"))
    key_probes(nodes, "task_history_failures_pkey")
    read = task_history_indexes(nodes)
    assert read <= {"task_history_pkey", "task_history_unfolded_idx"}, describe(nodes)


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


@pytest.mark.parametrize(
    ("rollup", "table", "index"),
    [
        ("fleet", "task_history_fleet", "task_history_fleet_pkey"),
        ("failures", "task_history_failures", "task_history_failures_hour_idx"),
        ("runtimes", "task_history_runtimes", "task_history_runtimes_last_at_idx"),
    ],
)
async def test_the_rollups_retention_reads_their_oldest_rows(
    loaded: asyncpg.Connection, rollup: str, table: str, index: str
) -> None:
    statement = sql.PURGE_ROLLUPS[rollup]
    nodes = await plan(loaded, statement, "int, int", (1, 1000), "force_generic_plan")
    by_index(nodes, index, table)
