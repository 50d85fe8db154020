"""A bulk statement never waits for a row another transaction holds: it skips it, says
`more`, and leaves it to its holder, so that it can neither deadlock with nor undo a
single retry, a cancel or a claim; run again once the holder committed, it acts on what
matches then. Store.retry_matching and Store.cancel_queued against a transaction held
open on one of their rows (a single retry's statement, or a claim's lock).
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gateway.store.sql import tasks as task_sql
from tests.support.stores import enqueue_request, open_store

pytestmark = pytest.mark.integration


async def dead_tasks(conn: asyncpg.Connection, runtime_id: str, n: int) -> list[str]:
    rows = await conn.fetch(
        "INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, last_error) "
        "SELECT $1, 'dead', '{}'::jsonb, 5, now(), 'e' FROM generate_series(1, $2) "
        "RETURNING id",
        runtime_id,
        n,
    )
    return [r["id"] for r in rows]


async def test_a_bulk_retry_skips_a_task_a_single_retry_holds(database_url, runtime_id, conn):
    ids = await dead_tasks(conn, runtime_id, 3)
    other = await asyncpg.connect(database_url)
    try:
        async with open_store(database_url) as store:
            async with other.transaction():
                held = await other.fetchrow(task_sql.RETRY, ids[0])
                assert held["status"] == "queued"
                change = await asyncio.wait_for(
                    store.retry_matching(runtime_id, "dead", None, 10), 5
                )
                assert (change.count, change.more) == (2, True)
            # The holder committed: nothing is left, and its task was retried once.
            change = await store.retry_matching(runtime_id, "dead", None, 10)
            assert (change.count, change.more) == (0, False)
            rows = await conn.fetch(
                "SELECT status, attempts FROM tasks WHERE runtime_id = $1", runtime_id
            )
            assert [(r["status"], r["attempts"]) for r in rows] == [("queued", 0)] * 3
            counted = await conn.fetchval(
                "SELECT coalesce(sum(n), 0) FROM task_counts "
                "WHERE runtime_id = $1 AND status = 'dead'",
                runtime_id,
            )
            assert counted == 0
    finally:
        await other.close()


async def test_a_bulk_cancel_skips_a_task_a_claim_holds(database_url, runtime_id, conn):
    async with open_store(database_url) as store:
        made = [(await store.enqueue(runtime_id, enqueue_request(i)))[0] for i in range(3)]
        other = await asyncpg.connect(database_url)
        try:
            async with other.transaction():
                await other.execute("SELECT 1 FROM tasks WHERE id = $1 FOR UPDATE", made[0].id)
                change = await asyncio.wait_for(store.cancel_queued(runtime_id, 10), 5)
                assert (change.count, change.more) == (2, True)
                assert sorted(change.task_ids) == sorted(t.id for t in made[1:])
        finally:
            await other.close()
        change = await store.cancel_queued(runtime_id, 10)
        assert (change.count, change.more, list(change.task_ids)) == (1, False, [made[0].id])
