"""A runtime's bulk statements read a bounded part of it, never its whole history:
RETRY_MATCHING and ERROR_GROUPS walk the runtime's tasks in one status through
tasks_ended_badly_idx, newest first, and stop after their window ($3, HISTORY_ROWS in
the gateway); CANCEL_QUEUED reads its candidates from the live rows' indexes, at most
its limit and one more.

The data: one runtime whose dead tasks, with errors, are its OLDEST, behind more
completed tasks than HISTORY_ROWS, and a backlog of queued tasks, and 500 small
runtimes. A database of the module's own, loaded once; the planner chooses on its own.
Each statement runs (EXPLAIN ANALYZE, rolled back), so that the rows each scan read are
counted, under custom and generic plans.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from bench.measure import bulk_finished
from gateway.api.bulk_bodies import HISTORY_ROWS
from gateway.store.sql import bulk as bulk_sql
from tests.support.plans import MODES, describe, explain, task_scans

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

HISTORY = HISTORY_ROWS + 10_000
QUEUED = 2_000
DEAD = 6_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def loaded(module_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(module_database_url)
    try:
        # The dead tasks first: the completed ones are all newer.
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, last_error,
                               created_at)
            SELECT 'big', 'dead', '{}'::jsonb, 5, now(),
                   'TimeoutError: ' || (n % 3) || E'\n  at line ' || n,
                   now() - interval '1 day' + n * interval '1 ms'
              FROM generate_series(1, $1) AS n
            """,
            DEAD,
        )
        await bulk_finished(conn, "big", HISTORY)
        await conn.execute(
            "INSERT INTO tasks (runtime_id, status, payload) "
            "SELECT 'big', 'queued', '{}'::jsonb FROM generate_series(1, $1)",
            QUEUED,
        )
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, finished_at, last_error)
            SELECT 'rt-' || (n % 500), CASE WHEN n % 2 = 0 THEN 'dead' ELSE 'queued' END,
                   '{}'::jsonb, CASE WHEN n % 2 = 0 THEN now() END, 'boom'
              FROM generate_series(1, 5000) AS n
            """
        )
        await conn.execute("VACUUM ANALYZE tasks")
        yield conn
    finally:
        await conn.close()


async def plan(conn: asyncpg.Connection, sql: str, types: str, args: tuple[Any, ...], mode: str):
    async with conn.transaction():
        return await explain(conn, sql, types, args, mode, analyze=True)


def rows_read(nodes: list[dict[str, Any]], index: str) -> int:
    return sum(
        n["Actual Rows"] * n.get("Actual Loops", 1)
        for n in task_scans(nodes)
        if n.get("Index Name") == index
    )


RETRY_TYPES = "text, text, int, text, int"
WINDOW = 100  # a window smaller than the dead tasks, to see the walk stop at it
INDEX = "tasks_ended_badly_idx"


@pytest.mark.parametrize("mode", MODES)
async def test_retry_reaches_dead_tasks_behind_the_runtime_s_newest(loaded, mode):
    # A prefix that no task has: the walk reads its whole window of dead tasks, none of
    # the completed ones in front of them, and finds nothing.
    nodes = await plan(
        loaded,
        bulk_sql.RETRY_MATCHING,
        RETRY_TYPES,
        ("big", "dead", WINDOW, "no such error", 1000),
        mode,
    )
    scans = task_scans(nodes)
    assert {n["Node Type"] for n in scans} == {"Index Scan"}, describe(nodes)
    assert {n["Index Name"] for n in scans} == {INDEX, "tasks_pkey"}, describe(nodes)
    assert rows_read(nodes, INDEX) == WINDOW, describe(nodes)
    assert rows_read(nodes, "tasks_pkey") == 0, describe(nodes)


@pytest.mark.parametrize("mode", MODES)
async def test_retry_stops_once_it_holds_its_limit(loaded, mode):
    # Every dead task matches: 11 are read (the limit and one more), 10 locked and
    # updated through the primary key. (With a window near the runtime's count of dead
    # tasks, the planner may rather read them all in one bitmap scan and sort them,
    # which costs it less then; a window far below that count is walked.)
    args = ("big", "dead", WINDOW, "TimeoutError: ", 10)
    nodes = await plan(loaded, bulk_sql.RETRY_MATCHING, RETRY_TYPES, args, mode)
    scans = task_scans(nodes)
    assert {n["Index Name"] for n in scans} == {INDEX, "tasks_pkey"}, describe(nodes)
    assert rows_read(nodes, INDEX) <= 11, describe(nodes)
    assert rows_read(nodes, "tasks_pkey") == 20, describe(nodes)  # locked, then updated


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_reads_live_rows_only(loaded, mode):
    nodes = await plan(loaded, bulk_sql.CANCEL_QUEUED, "text, int", ("big", 100), mode)
    scans = task_scans(nodes)
    assert "Seq Scan" not in {n["Node Type"] for n in scans}, describe(nodes)
    live = {"tasks_live_idx", "tasks_claim_idx", "tasks_scheduled_idx"}
    used = {n["Index Name"] for n in scans}
    assert used - {"tasks_pkey"} <= live and used & live, describe(nodes)
    assert sum(n["Actual Rows"] for n in scans if n["Index Name"] in live) <= 101, describe(nodes)


@pytest.mark.parametrize("mode", MODES)
async def test_error_groups_walk_a_bounded_window_of_the_status(loaded, mode):
    nodes = await plan(
        loaded, bulk_sql.ERROR_GROUPS, "text, text, int, int", ("big", "dead", WINDOW, 20), mode
    )
    scans = task_scans(nodes)
    assert {n["Index Name"] for n in scans} == {INDEX}, describe(nodes)
    assert rows_read(nodes, INDEX) == WINDOW, describe(nodes)


async def test_error_groups_count_every_dead_task_however_old(loaded):
    rows = await loaded.fetch(bulk_sql.ERROR_GROUPS, "big", "dead", HISTORY_ROWS, 20)
    # As many of each: in the order of their lines.
    assert [(r["line"], r["n"]) for r in rows] == [
        (f"TimeoutError: {i}", DEAD // 3) for i in range(3)
    ]
    assert {r["read"] for r in rows} == {DEAD}
