"""The stats and the janitor's counting statements read live rows and counters, never a
runtime's finished history: STATS_COUNTS and OLDEST_QUEUED_AGE walk tasks_live_idx for
one runtime and task_counts by its primary key, QUEUE_DEPTH walks tasks_live_idx, and
FOLD_TASK_COUNTS finds unfolded rows through task_counts_unfolded_idx.

The data has a history: one runtime with 150,000 finished tasks and a few live ones,
and 2,000 others with a few rows each, mostly finished; the counters are folded, as the
janitor leaves them, plus a few unfolded rows. A database of the module's own, loaded
once; the planner chooses on its own (no enable_seqscan).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from bench.measure import bulk_finished
from gateway.store.sql import janitor as janitor_sql
from gateway.store.sql import tasks as task_sql
from tests.support.plans import MODES, describe, explain, task_scans, walk

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

HISTORY = 150_000
OTHERS = 2_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def loaded(module_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(module_database_url)
    try:
        await bulk_finished(conn, "big", HISTORY)
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, lease_id,
                               lease_expires_at, worker_id)
            SELECT 'rt-' || (n % $1), s, '{}'::jsonb, 1,
                   CASE WHEN s IN ('completed', 'dead') THEN now() END,
                   CASE WHEN s = 'claimed' THEN gen_random_uuid() END,
                   CASE WHEN s = 'claimed' THEN now() + interval '1 hour' END,
                   CASE WHEN s = 'claimed' THEN 'w' END
              FROM generate_series(0, $1 * 10 - 1) AS n,
                   LATERAL (SELECT CASE WHEN n / $1 = 0 THEN 'queued'
                                        WHEN n / $1 = 1 AND n % 3 = 0 THEN 'claimed'
                                        WHEN n / $1 = 2 THEN 'dead'
                                        ELSE 'completed' END AS s) AS pick
            """,
            OTHERS,
        )
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, run_at, lease_id,
                               lease_expires_at, worker_id)
            SELECT 'big', s, '{}'::jsonb, now() - interval '1 minute',
                   CASE WHEN s = 'claimed' THEN gen_random_uuid() END,
                   CASE WHEN s = 'claimed' THEN now() + interval '1 hour' END,
                   CASE WHEN s = 'claimed' THEN 'w' END
              FROM generate_series(1, 60) AS n,
                   LATERAL (SELECT CASE WHEN n <= 50 THEN 'queued' ELSE 'claimed' END AS s) p
            """
        )
        # Counters of 100,000 more runtimes, as a long-lived installation has (their
        # rows are not loaded: only the counters' table size matters to the fold's plan).
        await conn.execute(
            "INSERT INTO task_counts (runtime_id, status, backend, n) "
            "SELECT 'gone-' || n, 'completed', 0, 1 FROM generate_series(1, 100000) AS n"
        )
        # Fold everything, then leave a few unfolded rows behind, as between two passes.
        while await conn.fetch(janitor_sql.FOLD_TASK_COUNTS, 100_000):
            pass
        await conn.execute(
            "UPDATE tasks SET status = 'dead', finished_at = now() "
            "WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' LIMIT 20)"
        )
        await conn.execute("VACUUM ANALYZE tasks")
        await conn.execute("VACUUM ANALYZE task_counts")
        yield conn
    finally:
        await conn.close()


def scans_of(nodes: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    return [n for n in nodes if n.get("Relation Name") == table and "Scan" in n["Node Type"]]


async def test_the_data_has_a_history(loaded: asyncpg.Connection) -> None:
    counts = {r["status"]: r["n"] for r in await loaded.fetch(task_sql.STATS_COUNTS, "big")}
    assert counts["completed"] == HISTORY and sum(counts.values()) == HISTORY + 60
    assert await loaded.fetchval("SELECT count(*) FROM task_counts WHERE backend <> 0") > 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["big", "rt-17"])
async def test_stats_read_live_rows_and_counters_only(
    loaded: asyncpg.Connection, mode: str, runtime: str
) -> None:
    async with loaded.transaction():
        nodes = await explain(loaded, task_sql.STATS_COUNTS, "text", (runtime,), mode)
    shown = f"{mode}, {runtime}: {describe(nodes)}"
    [tasks] = scans_of(nodes, "tasks") or [None]
    assert tasks is not None, shown
    assert tasks["Node Type"] in ("Index Only Scan", "Index Scan"), shown
    assert tasks["Index Name"] == "tasks_live_idx", shown
    assert "runtime_id" in tasks.get("Index Cond", ""), shown
    counters = scans_of(nodes, "task_counts")
    assert counters and all(n["Node Type"] != "Seq Scan" for n in counters), shown
    assert all("runtime_id" in n.get("Index Cond", "") for n in counters), shown


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("runtime", ["big", "rt-17"])
async def test_oldest_queued_age_reads_live_rows_only(
    loaded: asyncpg.Connection, mode: str, runtime: str
) -> None:
    async with loaded.transaction():
        nodes = await explain(loaded, task_sql.OLDEST_QUEUED_AGE, "text", (runtime,), mode)
    shown = f"{mode}, {runtime}: {describe(nodes)}"
    scans = task_scans(nodes)
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), shown
    # Only a partial index over live rows, seeking on the runtime.
    assert {n.get("Index Name") for n in scans} <= {"tasks_live_idx"}, shown
    assert all("runtime_id" in n.get("Index Cond", "") for n in scans), shown


async def test_queue_depth_reads_live_rows_not_the_history(loaded: asyncpg.Connection) -> None:
    raw = await loaded.fetchval("EXPLAIN (FORMAT JSON) " + janitor_sql.QUEUE_DEPTH)
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = describe(nodes)
    scans = scans_of(nodes, "tasks")
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), shown
    # An index scan of tasks_live_idx, or a bitmap heap scan fed by one.
    used = {n["Index Name"] for n in nodes if "Index Name" in n and "tasks" in n["Index Name"]}
    assert used == {"tasks_live_idx"}, shown


async def test_the_fold_reads_only_unfolded_rows(loaded: asyncpg.Connection) -> None:
    async with loaded.transaction():
        raw = await loaded.fetchval("EXPLAIN (FORMAT JSON) " + janitor_sql.FOLD_TASK_COUNTS, 1000)
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = describe(nodes)
    picked = [
        n for n in scans_of(nodes, "task_counts") if n.get("Index Name") != "task_counts_pkey"
    ]
    assert picked and all(n["Node Type"] != "Seq Scan" for n in picked), shown
    assert {n.get("Index Name") for n in picked} == {"task_counts_unfolded_idx"}, shown


async def test_the_repair_page_walks_live_indexes_only(loaded: asyncpg.Connection) -> None:
    raw = await loaded.fetchval("EXPLAIN (FORMAT JSON) " + janitor_sql.CLAIMABLE_RUNTIMES, 1000, "")
    nodes = list(walk((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]))
    shown = describe(nodes)
    scans = task_scans(nodes)
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), shown
    used = {n["Index Name"] for n in nodes if "Index Name" in n}
    assert used and used <= {"tasks_claim_idx", "tasks_scheduled_idx", "tasks_live_idx"}, shown
