"""The schedules' hot statements keep their indexes, under custom and generic plans: the
tick pass's scan of due schedules walks schedules_due_idx (its cost follows the due
schedules it takes, not every schedule), a schedule's tasks are listed from
tasks_schedule_idx, and the tick record's retention walks schedule_ticks_age_idx. On the
realistic task table (tests/support/plans.py) with thousands of schedules and ticks
added, in a transaction that is rolled back afterwards."""

from __future__ import annotations

import asyncpg
import pytest

from gateway.store.sql import schedules as schedule_sql
from gateway.store.sql import tasks as task_sql
from tests.support.plans import MODES, describe, explain, indexes, plan_of

pytestmark = pytest.mark.integration

SCHEDULES = 5000
DUE = 20


async def add_schedules(conn: asyncpg.Connection, prefix: str) -> None:
    """SCHEDULES schedules over the runtimes, DUE of them due, the rest over the next
    day; a tick record of 20 ticks each; 300 tasks of one schedule on one runtime."""
    await conn.execute(
        """
        INSERT INTO schedules (runtime_id, name, every_seconds, payload, next_tick_at)
        SELECT $1 || '-' || (n % 200), 's' || n, 60, '{}'::jsonb,
               CASE WHEN n < $3 THEN now() - interval '1 second'
                    ELSE now() + make_interval(secs => n * 17) END
          FROM generate_series(0, $2 - 1) AS n
        """,
        prefix,
        SCHEDULES,
        DUE,
    )
    await conn.execute(
        """
        INSERT INTO schedule_ticks (schedule_id, tick_at, outcome, version, source)
        SELECT s.id, now() - make_interval(days => k), 'skipped_late', 1, 'schedule'
          FROM schedules s, generate_series(1, 20) AS k
        """
    )
    await conn.execute(
        """
        INSERT INTO tasks (runtime_id, status, payload, schedule, scheduled_for, created_at)
        SELECT $1 || '-7', 'completed', '{}'::jsonb, 'nightly',
               now() - make_interval(days => n), now() - make_interval(days => n)
          FROM generate_series(1, 300) AS n
        """,
        prefix,
    )
    await conn.execute("ANALYZE schedules")
    await conn.execute("ANALYZE schedule_ticks")
    await conn.execute("ANALYZE tasks")


@pytest.mark.parametrize("mode", MODES)
async def test_the_tick_pass_reads_due_schedules_from_their_index(
    conn: asyncpg.Connection, filled: str, mode: str
) -> None:
    await add_schedules(conn, filled)
    nodes = await explain(
        conn, schedule_sql.DUE_SCHEDULES, "int, float8", (500, 2.0), mode, analyze=True
    )
    shown = describe(nodes)
    scans = [n for n in nodes if n.get("Relation Name") == "schedules"]
    assert [n.get("Index Name") for n in scans] == ["schedules_due_idx"], shown
    # Only the due schedules are read, not the thousands ticking later.
    assert [n["Actual Rows"] for n in scans] == [DUE], shown
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], shown


@pytest.mark.parametrize("mode", MODES)
async def test_the_next_ticks_time_is_one_probe_of_the_due_index(
    conn: asyncpg.Connection, filled: str, mode: str
) -> None:
    await add_schedules(conn, filled)
    nodes = await explain(conn, schedule_sql.NEXT_DUE_IN, "", (), mode, analyze=True)
    shown = describe(nodes)
    scans = [n for n in nodes if n.get("Relation Name") == "schedules"]
    assert [n.get("Index Name") for n in scans] == ["schedules_due_idx"], shown
    assert [n["Actual Rows"] for n in scans] == [1], shown  # the earliest, not all


@pytest.mark.parametrize("mode", MODES)
async def test_a_schedules_tasks_are_listed_from_their_index(
    conn: asyncpg.Connection, filled: str, mode: str
) -> None:
    await add_schedules(conn, filled)
    args = [
        (filled + "-7", "text"),
        (None, "text"),
        (None, "timestamptz"),
        (None, "uuid"),
        (100, "int"),
        ("nightly", "text"),
    ]
    nodes = await plan_of(conn, mode, task_sql.LIST_SCHEDULE_TASKS, args)
    assert "tasks_schedule_idx" in indexes(nodes), describe(nodes)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], describe(nodes)


@pytest.mark.parametrize("mode", MODES)
async def test_tick_retention_walks_the_oldest_ticks_by_their_index(
    conn: asyncpg.Connection, filled: str, mode: str
) -> None:
    await add_schedules(conn, filled)
    nodes = await explain(conn, schedule_sql.PURGE_TICKS, "int, int", (30, 1000), mode)
    ticks = [n for n in nodes if n.get("Relation Name") == "schedule_ticks"]
    assert "schedule_ticks_age_idx" in indexes(ticks), describe(nodes)
