"""The claim is one statement in one round trip (no BEGIN, no COMMIT), and every row it
locks it leases. Rows other claims hold count against its candidate window; when they
fill it, it runs again, wider, for the slots left, and if they still fill it, the poll
is told to look again soon rather than trust an empty verdict.

Runs on the session's shared database, on runtime ids of its own, removed after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.store import Store
from gateway.store import leases as store_leases
from gateway.store.leases import CLAIM_WINDOW, CONTENDED_RECHECK_SECONDS
from gateway.store.sql import leases as lease_sql

pytestmark = pytest.mark.integration

# Priority 90 rows first, then priority 10 rows, each FIFO by created_at.
FILL = """
INSERT INTO tasks (runtime_id, status, priority, payload, run_at, created_at)
SELECT $1, $4, $3, jsonb_build_object('n', n), now() + make_interval(secs => $5::float8),
       now() - interval '1 hour' + make_interval(secs => n)
  FROM generate_series(1, $2) AS n
"""
# The first $2 of the runtime's due tasks in claim order, locked by another client.
HOLD = """
SELECT id FROM tasks
 WHERE runtime_id = $1 AND status = 'queued'
 ORDER BY priority DESC, created_at
 LIMIT $2
   FOR UPDATE
"""


@pytest.fixture
async def other(database_url: str, runtime_id: str) -> AsyncIterator[asyncpg.Connection]:
    """Another client; removes the runtime's rows afterwards."""
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.execute("DELETE FROM tasks WHERE runtime_id = $1", runtime_id)
        await conn.close()


async def statements_of(store: Store, runtime_id: str) -> list[str]:
    """The statements the store's one connection sends from now on. A first claim (on
    a runtime with no tasks) lets the driver look up its types beforehand."""
    seen: list[str] = []

    async def log_queries(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: seen.append(record.query))

    await store.claim(runtime_id + "-warm-up", ["w"], [1.0])
    await store.run(log_queries)
    return seen


async def test_a_claim_is_one_statement_and_reports_the_next_due_time(
    store: Store, other: asyncpg.Connection, runtime_id: str
) -> None:
    await other.execute(FILL, runtime_id, 2, 50, "queued", -1.0)
    await other.execute(FILL, runtime_id, 1, 50, "scheduled", 100.0)
    seen = await statements_of(store, runtime_id)

    rows, due_in = await store.claim(runtime_id, ["a", "b"], [30.0, 30.0])
    assert [r.slot for r in rows] == [1, 2] and due_in is None
    assert seen == [lease_sql.CLAIM]

    # Fewer than wanted: the due time of the scheduled task comes with the answer.
    seen.clear()
    rows, due_in = await store.claim(runtime_id, ["a"], [30.0])
    assert rows == []
    assert due_in is not None and 90 < due_in <= 100
    assert seen == [lease_sql.CLAIM], "the empty claim took more than one statement"


async def test_rows_other_claims_hold_beyond_the_window_are_still_reached(
    store: Store, other: asyncpg.Connection, runtime_id: str
) -> None:
    """Another client holds more of the best rows than one window offers: the claim
    runs again, wider, and leases the next free ones, in order."""
    held_count = 1 + CLAIM_WINDOW + 10
    await other.execute(FILL, runtime_id, held_count, 90, "queued", -1.0)
    await other.execute(FILL, runtime_id, 3, 10, "queued", -1.0)
    free = [
        r["id"]
        for r in await other.fetch(
            "SELECT id FROM tasks WHERE runtime_id = $1 AND priority = 10 ORDER BY created_at",
            runtime_id,
        )
    ]
    seen = await statements_of(store, runtime_id)
    async with other.transaction():
        held = await other.fetch(HOLD, runtime_id, held_count)
        assert len(held) == held_count
        rows, due_in = await store.claim(runtime_id, ["a", "b", "c"], [30.0] * 3)
    assert [r.task.id for r in rows] == free
    assert [r.slot for r in rows] == [1, 2, 3]
    assert due_in is None
    assert seen == [lease_sql.CLAIM, lease_sql.CLAIM], "the wider second round did not run"


async def test_when_held_rows_fill_every_round_the_poll_looks_again_soon(
    store: Store, other: asyncpg.Connection, runtime_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one round only (so that the test needs few rows): the free row behind the
    held ones is not reached, and the answer says to look again soon instead of
    letting an empty verdict stand over it for its whole life."""
    monkeypatch.setattr(store_leases, "CLAIM_ROUNDS", 1)
    held_count = 1 + CLAIM_WINDOW + 10
    await other.execute(FILL, runtime_id, held_count + 1, 90, "queued", -1.0)
    async with other.transaction():
        await other.fetch(HOLD, runtime_id, held_count)
        rows, due_in = await store.claim(runtime_id, ["a"], [30.0])
    assert rows == []
    assert due_in == CONTENDED_RECHECK_SECONDS
    # Once the other client lets go, the same claim leases the first row.
    rows, due_in = await store.claim(runtime_id, ["a"], [30.0])
    assert len(rows) == 1 and due_in is None


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
async def test_each_slot_gets_the_task_of_its_rank_with_its_own_worker_and_lease(
    store: Store, other: asyncpg.Connection, runtime_id: str, mode: str
) -> None:
    """One claim serves several polls (I9), each with its worker and lease length: slot
    k gets the k-th task in claim order (priority, then age; a due delayed task takes
    its place among the queued ones), and slot k's worker and lease length. The slots
    past the last task get nothing. Under both plans a prepared statement may run."""
    await other.execute(FILL, runtime_id, 2, 10, "queued", -1.0)
    await other.execute(FILL, runtime_id, 2, 90, "queued", -1.0)
    await other.execute(FILL, runtime_id, 1, 50, "scheduled", -1.0)
    order = [
        r["id"]
        for r in await other.fetch(
            "SELECT id FROM tasks WHERE runtime_id = $1 ORDER BY priority DESC, created_at",
            runtime_id,
        )
    ]

    async def plan_mode(conn: asyncpg.Connection) -> None:
        await conn.execute(f"SET plan_cache_mode = {mode}")

    await store.run(plan_mode)
    workers = ["a", "b", "c", "d", "e", "f"]
    rows, due_in = await store.claim(runtime_id, workers, [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert [r.slot for r in rows] == [1, 2, 3, 4, 5]
    assert [r.task.id for r in rows] == order
    assert [r.task.worker_id for r in rows] == workers[:5]
    lengths = await other.fetch(
        "SELECT id, round(extract(epoch FROM lease_expires_at - updated_at))::int AS s"
        " FROM tasks WHERE runtime_id = $1",
        runtime_id,
    )
    by_id = {r["id"]: r["s"] for r in lengths}
    assert [by_id[r.task.id] for r in rows] == [10, 20, 30, 40, 50]
    assert due_in is None
