"""The repair pass's query stays cheap with many runtimes and many finished rows: it
walks the claim index (a loose index scan) instead of reading the table.

Runs on the session's shared database with runtime ids of its own, removed after.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from gateway.store.sql import janitor as janitor_sql

pytestmark = pytest.mark.integration

RUNTIMES = 300
ROWS_PER_RUNTIME = 50
# How many of each runtime's rows are finished (completed, then one dead); of the
# rest, the last is scheduled for later and the others are queued and due.
FINISHED = {"mostly_finished": 48, "backlog": 10}


@pytest.fixture(params=list(FINISHED))
async def populated(
    database_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[asyncpg.Connection, str, str]]:
    shape = request.param
    finished = FINISHED[shape]
    prefix = "jcost" + secrets.token_hex(4)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, attempts, run_at, created_at,
                               finished_at)
            SELECT $1 || '-' || lpad(r::text, 3, '0'),
                   CASE WHEN k < $4 THEN 'completed'
                        WHEN k = $4 THEN 'dead'
                        WHEN k = $3 THEN 'scheduled'
                        ELSE 'queued' END,
                   '{}'::jsonb,
                   CASE WHEN k <= $4 THEN 1 ELSE 0 END,
                   CASE WHEN k = $3 THEN now() + interval '1 hour'
                        ELSE now() - interval '1 hour' END,
                   now() - interval '2 hours' + k * interval '1 second',
                   CASE WHEN k <= $4 THEN now() - interval '1 hour' END
              FROM generate_series(1, $2::int) AS r, generate_series(1, $3::int) AS k
            """,
            prefix,
            RUNTIMES,
            ROWS_PER_RUNTIME,
            finished,
        )
        await conn.execute("ANALYZE tasks")
        yield conn, prefix, shape
    finally:
        await conn.execute("DELETE FROM tasks WHERE runtime_id LIKE $1", prefix + "-%")
        await conn.close()


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


async def test_claimable_runtimes_uses_the_queued_indexes_not_the_table(
    populated: tuple[asyncpg.Connection, str, str],
) -> None:
    """No Seq Scan on tasks, whatever the shape of the data; every scan of tasks goes
    through one of the partial indexes over waiting (or live) rows led by runtime_id
    (tasks_claim_idx over queued ones, tasks_scheduled_idx over scheduled ones, or
    tasks_live_idx, equally cheap)."""
    conn, prefix, _shape = populated
    raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + janitor_sql.CLAIMABLE_RUNTIMES, 1000, "")
    plan = json.loads(raw) if isinstance(raw, str) else raw
    shown = json.dumps(plan, indent=1)
    nodes = list(plan_nodes(plan[0]["Plan"]))
    on_tasks = [n for n in nodes if n.get("Relation Name") == "tasks"]
    assert on_tasks, shown
    assert [n for n in on_tasks if n["Node Type"] == "Seq Scan"] == [], shown
    indexes = {n.get("Index Name") for n in nodes if "Index Name" in n}
    # All are partial indexes over waiting (or live) rows led by runtime_id; which one
    # the planner picks depends on the data and the Postgres version.
    wanted = {"tasks_claim_idx", "tasks_scheduled_idx", "tasks_live_idx"}
    assert indexes and indexes <= wanted, (indexes, shown)

    # Run, it probes each runtime a few times (one row each), whatever the backlog: it
    # never reads every due task (as a hashed EXISTS over all runtimes would).
    raw = await conn.fetchval(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + janitor_sql.CLAIMABLE_RUNTIMES, 100_000, ""
    )
    plan = json.loads(raw) if isinstance(raw, str) else raw
    scans = [n for n in plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "tasks"]
    read = sum(n["Actual Rows"] * n["Actual Loops"] for n in scans)
    waiting = await conn.fetchval(
        "SELECT count(DISTINCT runtime_id) FROM tasks WHERE status IN ('queued', 'scheduled')"
    )
    assert waiting >= RUNTIMES
    assert read <= 6 * waiting, (read, waiting, json.dumps(plan, indent=1))

    # And it answers right: every one of our runtimes has a due task.
    found = sorted(
        r["runtime_id"]
        for r in await conn.fetch(janitor_sql.CLAIMABLE_RUNTIMES, 100_000, "")
        if r["runtime_id"].startswith(prefix + "-") and r["claimable"]
    )
    assert found == [f"{prefix}-{i:03d}" for i in range(1, RUNTIMES + 1)]


async def test_claimable_runtimes_skips_runtimes_with_only_delayed_tasks(
    populated: tuple[asyncpg.Connection, str, str],
) -> None:
    conn, prefix, _shape = populated
    first = f"{prefix}-001"
    await conn.execute(
        "DELETE FROM tasks WHERE runtime_id = $1 AND status = 'queued' AND run_at <= now()",
        first,
    )
    page = {
        r["runtime_id"]: r["claimable"]
        for r in await conn.fetch(janitor_sql.CLAIMABLE_RUNTIMES, 100_000, "")
    }
    # Visited (it still has a delayed task) but not claimable.
    assert page[first] is False
    assert page[f"{prefix}-002"] is True


async def test_a_page_visits_at_most_its_limit_and_the_cursor_goes_on(
    populated: tuple[asyncpg.Connection, str, str],
) -> None:
    """A page stops after `limit` runtimes visited even when none of them is claimable
    (here: the first 150 hold only a delayed task), and the next page starts after the
    last one visited, so paging reaches every runtime once per round."""
    conn, prefix, _shape = populated
    await conn.execute(
        "DELETE FROM tasks WHERE runtime_id >= $1 AND runtime_id <= $2 AND status = 'queued' "
        "AND run_at <= now()",
        f"{prefix}-001",
        f"{prefix}-150",
    )
    start = f"{prefix}-"  # sorts before every runtime of ours, after any other's
    first = await conn.fetch(janitor_sql.CLAIMABLE_RUNTIMES, 100, start)
    assert [r["runtime_id"] for r in first] == [f"{prefix}-{i:03d}" for i in range(1, 101)]
    assert not any(r["claimable"] for r in first)
    second = await conn.fetch(janitor_sql.CLAIMABLE_RUNTIMES, 100, first[-1]["runtime_id"])
    assert [r["runtime_id"] for r in second] == [f"{prefix}-{i:03d}" for i in range(101, 201)]
    assert [r["runtime_id"] for r in second if r["claimable"]] == [
        f"{prefix}-{i:03d}" for i in range(151, 201)
    ]
