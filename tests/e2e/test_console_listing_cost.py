"""GET /v1/runtimes reads the live rows' partial indexes and task_counts only: its two
statements touch about as many buffers with 200,000 finished tasks in the table as with
none, and the dead count comes from task_counts, not from the history."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from gateway.store.sql import runtimes as runtime_sql
from tests.support.databases import migrate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUNTIMES = 40
HISTORY_PER_RUNTIME = 5000  # 200,000 finished rows in all


async def buffers(conn: asyncpg.Connection, query: str, *args: Any) -> int:
    """Shared buffers the statement touched (hit or read), from EXPLAIN ANALYZE."""
    raw = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, *args)
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def costs(conn: asyncpg.Connection) -> dict[str, int]:
    ids = [f"rt-{i:03d}" for i in range(RUNTIMES)]
    return {
        "walk": await buffers(conn, runtime_sql.RUNTIMES_WALK, "", 101, None),
        "walk from a prefix": await buffers(conn, runtime_sql.RUNTIMES_WALK, "", 101, ["rt-02"]),
        "summary": await buffers(conn, runtime_sql.RUNTIMES_SUMMARY, ids),
    }


@pytest.mark.timeout(120)
async def test_the_listing_does_not_read_the_finished_history(fresh_database_url):
    conn = await asyncpg.connect(await migrate(fresh_database_url))
    try:
        # Live rows: per runtime, 2 queued, 1 scheduled (not yet due) and 1 claimed.
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, run_at, lease_id, lease_expires_at,
                               worker_id, attempts)
            SELECT 'rt-' || lpad(r::text, 3, '0'),
                   CASE WHEN k = 4 THEN 'claimed' WHEN k = 3 THEN 'scheduled' ELSE 'queued' END,
                   '{}'::jsonb,
                   CASE WHEN k = 3 THEN now() + interval '1 hour' ELSE now() END,
                   CASE WHEN k = 4 THEN gen_random_uuid() END,
                   CASE WHEN k = 4 THEN now() + interval '1 hour' END,
                   CASE WHEN k = 4 THEN 'w' END,
                   CASE WHEN k = 4 THEN 1 ELSE 0 END
              FROM generate_series(0, $1::int - 1) AS r, generate_series(1, 4) AS k
            """,
            RUNTIMES,
        )
        await conn.execute("ANALYZE tasks")
        before = await costs(conn)
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, result)
            SELECT 'rt-' || lpad(r::text, 3, '0'),
                   CASE WHEN k % 10 = 0 THEN 'dead' ELSE 'completed' END,
                   '{"job": "done"}'::jsonb, 1, now(), '{"ok": true}'::jsonb
              FROM generate_series(0, $1::int - 1) AS r, generate_series(1, $2::int) AS k
            """,
            RUNTIMES,
            HISTORY_PER_RUNTIME,
        )
        await conn.execute("VACUUM ANALYZE tasks")
        # The row-at-a-time upserts of the history's counters leave dead versions in
        # task_counts, as any write load does until autovacuum; the listing reads the
        # few live rows per runtime, which this measures.
        await conn.execute("VACUUM ANALYZE task_counts")
        after = await costs(conn)
        rows = await conn.fetch(
            runtime_sql.RUNTIMES_SUMMARY, [f"rt-{i:03d}" for i in range(RUNTIMES)]
        )
    finally:
        await conn.close()
    assert [(r["queued"], r["claimed"]) for r in rows] == [(3, 1)] * RUNTIMES
    assert [r["dead"] for r in rows] == [HISTORY_PER_RUNTIME // 10] * RUNTIMES
    # The history's heap alone is thousands of pages; an index over it, hundreds.
    for name, cost in after.items():
        assert cost <= 2 * before[name] + 20, (name, before, after)
