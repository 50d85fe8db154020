"""The stats' counts (STATS_COUNTS: live rows from tasks_live_idx, finished ones from
task_counts kept by triggers) equal a count of the rows themselves after every kind of
transition, under concurrent completers, across the janitor's fold and retention, and
after migration 0005 counted the rows that were there before it.

Each test has a freshly migrated database of its own (the `own_database_url` fixture), so the whole
task table is the test's and the counts are exact.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.migrate import apply_migrations, migrations_dir
from gateway.store.sql import acks as ack_sql
from gateway.store.sql import leases as lease_sql
from gateway.store.sql.fragments import EFFECTIVE_STATUS
from tests.support.databases import execute, fetch
from tests.support.stores import enqueue_request, open_store

pytestmark = pytest.mark.integration

# What the stats answered before migration 0005: a count of the runtime's rows by the
# status the API reports. The counts under test must always equal it.
TRUTH = f"""
SELECT {EFFECTIVE_STATUS} AS status, count(*) AS n FROM tasks WHERE runtime_id = $1 GROUP BY 1
"""


@pytest.fixture
async def store(own_database_url: str) -> AsyncIterator[Store]:
    """Not the shared `store`: on a database of the test's own (its counts are exact),
    with room for the concurrent calls of the tests below."""
    async with open_store(own_database_url, max_size=12) as opened:
        yield opened


async def truth(database_url: str, runtime_id: str) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await fetch(database_url, TRUTH, runtime_id)}


async def counts(store: Store, runtime_id: str) -> dict[str, int]:
    found, _oldest = await store.stats(runtime_id)
    return {status: n for status, n in found.items() if n}


async def check(store: Store, database_url: str, runtime_id: str) -> dict[str, int]:
    expected = await truth(database_url, runtime_id)
    assert await counts(store, runtime_id) == expected
    return expected


async def enqueue(store: Store, runtime_id: str, n: int, **fields: Any) -> list[uuid.UUID]:
    ids = []
    for i in range(n):
        row, _ = await store.enqueue(runtime_id, enqueue_request(i, **fields))
        ids.append(row.id)
    return ids


async def claim(store: Store, runtime_id: str, n: int, lease: float = 60.0) -> list[Any]:
    leased, _ = await store.claim(runtime_id, [f"w{i}" for i in range(n)], [lease] * n)
    return [x.task for x in leased]


async def test_every_transition_moves_the_counts(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    other = runtime_id + "-other"  # a neighbour whose counts must not leak in
    await enqueue(store, other, 2)
    [done] = await claim(store, other, 1)
    await store.complete(done.id, done.lease_id, None)

    queued = await enqueue(store, runtime_id, 12, max_attempts=1)
    await enqueue(store, runtime_id, 2, delay_seconds=3600)
    expiring = await enqueue(store, runtime_id, 1, ttl_seconds=60)
    assert await check(store, own_database_url, runtime_id) == {"queued": 15}
    await execute(
        own_database_url,
        "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE id = $1",
        expiring[0],
    )
    # Past expires_at it reads as expired before the janitor marks it.
    assert await check(store, own_database_url, runtime_id) == {"queued": 14, "expired": 1}

    held = await claim(store, runtime_id, 8, lease=0.01)
    assert len(held) == 8
    await check(store, own_database_url, runtime_id)
    await store.complete(held[0].id, held[0].lease_id, '{"ok": true}')
    await store.complete(held[0].id, held[0].lease_id, '{"ok": true}')  # a replay
    await store.fail(held[1].id, held[1].lease_id, "boom", True, None)  # max_attempts 1: dead
    await store.release(held[2].id, held[2].lease_id)
    await store.cancel(held[3].id)  # flagged; ends cancelled when its holder reports
    await store.complete(held[3].id, held[3].lease_id, None)
    await store.bury(held[4].id, held[4].lease_id, "cannot be answered")
    await check(store, own_database_url, runtime_id)
    await store.cancel(queued[-1])  # queued: cancelled at once
    assert await store.expire_tasks(100) == 1
    await check(store, own_database_url, runtime_id)

    await asyncio.sleep(0.05)  # the other three leases lapse: max_attempts 1, so dead
    assert len(await store.reclaim_leases(100)) == 3
    expected = await check(store, own_database_url, runtime_id)
    assert expected == {"queued": 6, "completed": 1, "dead": 5, "cancelled": 2, "expired": 1}

    # Retry takes a task out of its finished status again.
    dead = await fetch(
        own_database_url,
        "SELECT id FROM tasks WHERE runtime_id = $1 AND status = 'dead'",
        runtime_id,
    )
    for row in dead[:2]:
        await store.retry(row["id"])
    await store.retry(expiring[0])
    await check(store, own_database_url, runtime_id)

    # Retention deletes finished rows: they leave the counts (as they leave a listing).
    await execute(own_database_url, "UPDATE tasks SET finished_at = now() - interval '2 days'")
    assert await store.purge_finished(["completed", "cancelled", "expired"], 86400, 1000) == 4
    await check(store, own_database_url, runtime_id)
    assert await store.purge_finished(["dead"], 86400, 1000) == 3
    assert await check(store, own_database_url, runtime_id) == {"queued": 9}
    assert await counts(store, other) == {"queued": 1}  # its completed one was purged too


async def test_the_fold_keeps_a_row_per_runtime_and_status(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    await enqueue(store, runtime_id, 30)
    # Completions from several pooled connections: one counter row per backend.
    held = await claim(store, runtime_id, 30)
    await asyncio.gather(*(store.complete(t.id, t.lease_id, None) for t in held))
    rows = await fetch(
        own_database_url, "SELECT backend, n FROM task_counts WHERE runtime_id = $1", runtime_id
    )
    assert sum(r["n"] for r in rows) == 30 and all(r["backend"] != 0 for r in rows)
    assert await store.fold_counts(1000) == 1  # one (runtime, status) row written
    rows = await fetch(
        own_database_url, "SELECT backend, n FROM task_counts WHERE runtime_id = $1", runtime_id
    )
    assert [(r["backend"], r["n"]) for r in rows] == [(0, 30)]
    assert await store.fold_counts(1000) == 0  # idempotent: nothing left to fold
    assert await check(store, own_database_url, runtime_id) == {"completed": 30}

    # Everything purged: the backend-0 row reaches zero and is dropped by the fold.
    await execute(own_database_url, "UPDATE tasks SET finished_at = now() - interval '2 days'")
    assert await store.purge_finished(["completed"], 86400, 1000) == 30
    assert await store.fold_counts(1000) == 1
    assert (
        await fetch(own_database_url, "SELECT * FROM task_counts WHERE runtime_id = $1", runtime_id)
        == []
    )
    assert await check(store, own_database_url, runtime_id) == {}


async def test_a_batch_writes_one_counter_change_per_runtime_and_status(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    # Migration 0008: one statement that finishes many tasks writes one net delta per
    # runtime and status. A row trigger upserted the counter row once per task, and each
    # upsert walked the versions the earlier ones had left in the transaction.
    other = runtime_id + "-b"
    await enqueue(store, runtime_id, 300)
    await enqueue(store, other, 200)
    held = await claim(store, runtime_id, 300) + await claim(store, other, 200)
    assert len(held) == 500
    conn = await asyncpg.connect(own_database_url)
    try:
        async with conn.transaction():
            rows = await conn.fetch(
                ack_sql.BATCH_COMPLETE,
                [t.id for t in held],
                None,
                [t.lease_id for t in held],
                [None] * len(held),
            )
            assert len(rows) == 500
            # Counter rows written by this transaction, read before it commits (the
            # transaction's own statistics are exact at once).
            writes = await conn.fetchval(
                "SELECT pg_stat_get_xact_tuples_inserted('task_counts'::regclass)"
                " + pg_stat_get_xact_tuples_updated('task_counts'::regclass)"
            )
            assert writes == 2
            # Claims and heartbeats move no finished row and write no counter.
            await conn.execute(
                "UPDATE tasks SET updated_at = clock_timestamp() WHERE runtime_id = $1", other
            )
            assert (
                await conn.fetchval(
                    "SELECT pg_stat_get_xact_tuples_inserted('task_counts'::regclass)"
                    " + pg_stat_get_xact_tuples_updated('task_counts'::regclass)"
                )
                == 2
            )
    finally:
        await conn.close()
    assert await check(store, own_database_url, runtime_id) == {"completed": 300}
    assert await check(store, own_database_url, other) == {"completed": 200}
    # A statement that moves rows both into and out of finished statuses nets them.
    await execute(
        own_database_url,
        "UPDATE tasks SET status = CASE WHEN status = 'completed' THEN 'cancelled' END,"
        " finished_at = now() WHERE runtime_id = $1",
        other,
    )
    assert await check(store, own_database_url, other) == {"cancelled": 200}


# Counter rows this transaction inserted or updated, read before it commits: a
# transaction's own table statistics are exact at once (pg_stat_database is not).
COUNTER_WRITES = """
SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'task_counts'::regclass
"""

# One statement inserting $2 tasks spread over 3 runtimes ($1 || 0..2) and the four
# finished statuses, every seventh task queued instead (not counted).
INSERT_FINISHED = """
INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at)
SELECT $1 || (n % 3), CASE WHEN n % 7 = 0 THEN 'queued' ELSE s END, '{}'::jsonb, 1,
       CASE WHEN n % 7 <> 0 THEN now() END
  FROM generate_series(1, $2::int) AS n,
       LATERAL (SELECT (ARRAY['completed', 'dead', 'expired', 'cancelled'])[1 + n % 4] AS s) x
"""


async def test_an_insert_of_finished_rows_counts_once_per_statement(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    # Migration 0011: an import or a restore inserting many finished rows in one
    # statement writes one counter delta per runtime and status. The row trigger
    # before it upserted the counter row once per row, in time quadratic in the rows
    # (200,000 did not finish in a minute).
    conn = await asyncpg.connect(own_database_url)
    try:
        async with conn.transaction():
            assert await conn.fetchval(COUNTER_WRITES) == 0
            assert await conn.execute(INSERT_FINISHED, runtime_id, 50_000) == "INSERT 0 50000"
            # 3 runtimes x 4 finished statuses: 12 counter rows, whatever the row count.
            assert await conn.fetchval(COUNTER_WRITES) == 12
            assert await conn.execute(INSERT_FINISHED, runtime_id, 120) == "INSERT 0 120"
            assert await conn.fetchval(COUNTER_WRITES) == 24
            # Live rows alone, and an insert of nothing, write no counter.
            await conn.execute(
                "INSERT INTO tasks (runtime_id, payload) SELECT $1, '{}' "
                "FROM generate_series(1, 100)",
                runtime_id,
            )
            await conn.execute(
                "INSERT INTO tasks (runtime_id, payload) SELECT $1, '{}' WHERE false", runtime_id
            )
            assert await conn.fetchval(COUNTER_WRITES) == 24
    finally:
        await conn.close()
    by_count = await fetch(
        own_database_url,
        "SELECT runtime_id, status, count(*) AS n FROM tasks"
        " WHERE status IN ('completed', 'dead', 'expired', 'cancelled')"
        " GROUP BY runtime_id, status",
    )
    by_counter = await fetch(
        own_database_url,
        "SELECT runtime_id, status, sum(n)::bigint AS n FROM task_counts"
        " GROUP BY runtime_id, status",
    )
    expected = {(r["runtime_id"], r["status"]): r["n"] for r in by_count}
    assert len(expected) == 12 and sum(expected.values()) == 50_000 - 50_000 // 7 + 120 - 120 // 7
    assert {(r["runtime_id"], r["status"]): r["n"] for r in by_counter} == expected
    for i in range(3):
        await check(store, own_database_url, f"{runtime_id}{i}")


async def test_every_way_the_gateway_inserts_keeps_the_counts(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    """Enqueues insert live tasks only: single, keyed, replayed (nothing inserted),
    sync-matched (inserted already claimed), batches with and without keys. None
    writes a counter; their tasks are counted once they finish."""
    await enqueue(store, runtime_id, 3)
    await store.enqueue(runtime_id, enqueue_request(1, idempotency_key="k1"))
    _, created = await store.enqueue(runtime_id, enqueue_request(1, idempotency_key="k1"))
    assert not created  # a replay: the INSERT inserted nothing
    matched, _ = await store.enqueue(runtime_id, enqueue_request(2), lease=("w", 60.0))
    assert matched.status == "claimed"
    await store.enqueue_batch(runtime_id, [enqueue_request(i) for i in range(5)])
    await store.enqueue_batch(
        runtime_id, [enqueue_request(i, delay_seconds=3600) for i in range(2)]
    )
    keyed = [enqueue_request(i, idempotency_key=f"b{i}") for i in range(4)]
    await store.enqueue_batch(runtime_id, keyed)
    _, replayed = await store.enqueue_batch(runtime_id, keyed, ids_only=True)
    assert replayed
    assert await fetch(own_database_url, "SELECT * FROM task_counts") == []
    assert await check(store, own_database_url, runtime_id) == {"queued": 15, "claimed": 1}
    await store.complete(matched.id, matched.lease_id, None)
    held = await claim(store, runtime_id, 13)
    for task in held[:4]:
        await store.complete(task.id, task.lease_id, None)
    assert await check(store, own_database_url, runtime_id) == {
        "queued": 2,
        "claimed": 9,
        "completed": 5,
    }


async def test_truncate_takes_the_counts_with_it(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    await enqueue(store, runtime_id, 1)
    [task] = await claim(store, runtime_id, 1)
    await store.complete(task.id, task.lease_id, None)
    await execute(own_database_url, "TRUNCATE tasks")
    assert await counts(store, runtime_id) == {}


async def test_concurrent_completers_and_folds_count_exactly(
    store: Store, own_database_url: str, runtime_id: str
) -> None:
    """Ten connections complete one runtime's 600 tasks at once (each on its own
    connection, as replicas' pools would), failing every tenth to dead, while folds run
    alongside: nothing is lost or counted twice, and nobody deadlocks."""
    total = 600
    await execute(
        own_database_url,
        "INSERT INTO tasks (runtime_id, payload) SELECT $1, to_jsonb(n) "
        "FROM generate_series(1, $2) AS n",
        runtime_id,
        total,
    )
    held = [task for _ in range(total // 100) for task in await claim(store, runtime_id, 100)]
    assert len(held) == total
    buried = {task.id for k, task in enumerate(held) if k % 10 == 0}
    done = asyncio.Event()

    async def completer(mine: list[Any]) -> None:
        conn = await asyncpg.connect(own_database_url)
        try:
            for task in mine:
                if task.id in buried:
                    await conn.execute(lease_sql.BURY, task.id, task.lease_id, "every tenth")
                else:
                    await conn.execute(lease_sql.COMPLETE, task.id, task.lease_id, None)
        finally:
            await conn.close()

    async def folder() -> int:
        passes = 0
        while not done.is_set():
            await store.fold_counts(7)  # small batches: many folds meet the completers
            passes += 1
            await asyncio.sleep(0)
        return passes

    folding = asyncio.create_task(folder())
    await asyncio.gather(*(completer(held[i::10]) for i in range(10)))
    done.set()
    assert await folding > 0
    assert await check(store, own_database_url, runtime_id) == {"completed": 540, "dead": 60}
    while await store.fold_counts(1000):
        pass
    rows = await fetch(
        own_database_url,
        "SELECT status, backend, n FROM task_counts WHERE runtime_id = $1",
        runtime_id,
    )
    assert sorted((r["status"], r["backend"], r["n"]) for r in rows) == [
        ("completed", 0, 540),
        ("dead", 0, 60),
    ]


async def test_the_migration_counts_the_rows_already_there(
    fresh_database_url: str, tmp_path: Path, runtime_id: str
) -> None:
    url = fresh_database_url
    before = tmp_path / "before"
    before.mkdir()
    for path in sorted(migrations_dir().glob("*.sql")):
        if int(path.name.split("_")[0]) < 5:
            shutil.copy(path, before / path.name)
    await apply_migrations(url, before, log=lambda _line: None)
    await execute(
        url,
        """
        INSERT INTO tasks (runtime_id, status, payload, finished_at, lease_id,
                           lease_expires_at, expires_at)
        SELECT $1 || (n % 3), s, '{}'::jsonb,
               CASE WHEN s NOT IN ('queued', 'claimed') THEN now() END,
               CASE WHEN s = 'claimed' THEN gen_random_uuid() END,
               CASE WHEN s = 'claimed' THEN now() + interval '1 minute' END,
               CASE WHEN n % 7 = 0 THEN now() - interval '1 second' END
          FROM generate_series(1, 600) AS n,
               LATERAL (SELECT (ARRAY['queued', 'claimed', 'completed', 'dead', 'expired',
                                      'cancelled'])[1 + n % 6] AS s) AS pick
        """,
        runtime_id,
    )
    await apply_migrations(url, log=lambda _line: None)
    s = Store(url, Metrics(), min_size=1, max_size=2)
    await s.open()
    try:
        for i in range(3):
            expected = await truth(url, f"{runtime_id}{i}")
            assert sum(expected.values()) == 200
            assert await counts(s, f"{runtime_id}{i}") == expected
    finally:
        await s.close()
