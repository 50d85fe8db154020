"""The history's rollups (migration 0017, store/sql/history.py) against the raw rows:
the fleet's points, the top runtimes by depth and by failures, for a token covering
every runtime and for a limited one, equal what summing every covered runtime's rows
of task_history gives (the statements GET /v1/history ran before the rollups), after
a burst from concurrent clients, a row written late into a bucket already folded, and
a re-run of the rollup; and the rollups' retention.

The raw statements run in the same transaction as the rollups' reads (one now()), so
both read the same window. Buckets are 2 s wide, as in test_history.py; each test has a
freshly migrated database of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from gateway.store.history import fleet_rows
from gateway.store.sql.acks import RUNTIME_COVERED
from tests.support.databases import execute, fetch
from tests.support.gateways import running_gateway
from tests.support.janitor import first_pass_done, janitor_settings, next_history_bucket
from tests.support.lifecycle import lease_op

pytestmark = pytest.mark.integration

INTERVAL = 2
COUNTS = ("enqueued", "claimed", "completed", "failed", "dead", "expired", "cancelled")
WINDOWS = (3600, 86400, 7 * 86400)

_SUMS = ", ".join(f"sum({c})::bigint AS {c}" for c in COUNTS)
_WAITS = "ARRAY[" + ", ".join(f"sum(waits[{i}])::bigint" for i in range(1, 15)) + "]::bigint[]"
_COVERED = RUNTIME_COVERED.format(patterns="$2", runtime="runtime_id")
# What GET /v1/history read before the rollups: every covered runtime's rows of the
# window, every backend's.
RAW_POINTS = f"""
SELECT at, {_SUMS}, {_WAITS} AS waits, sum(depth)::bigint AS depth,
       max(oldest_queued_age_seconds) AS oldest_queued_age_seconds
  FROM task_history
 WHERE at > now() - make_interval(secs => $1) AND {_COVERED}
 GROUP BY at ORDER BY at
"""
RAW_TOP_BY_DEPTH = f"""
SELECT runtime_id, depth FROM (
    SELECT DISTINCT ON (runtime_id) runtime_id, depth FROM task_history
     WHERE at > now() - make_interval(secs => $1) AND backend = 0 AND depth IS NOT NULL
       AND {_COVERED}
     ORDER BY runtime_id, at DESC
) latest
 WHERE depth > 0 ORDER BY depth DESC, runtime_id LIMIT 10
"""
# Failures over the last hour by the minute, over longer windows in whole hours (UTC)
# from the hour the window begins in.
RAW_TOP_BY_FAILURES = f"""
SELECT runtime_id, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead
  FROM task_history
 WHERE CASE WHEN $1 > 3600
            THEN at >= to_timestamp(floor(extract(epoch FROM now() - make_interval(secs => $1))
                                          / 3600) * 3600)
            ELSE at > now() - make_interval(secs => $1) END
   AND {_COVERED}
 GROUP BY runtime_id HAVING sum(failed) + sum(dead) > 0
 ORDER BY sum(failed) + sum(dead) DESC, runtime_id LIMIT 10
"""


def settings(url: str, redis_url: str, prefix: str, **overrides: Any) -> Any:
    return janitor_settings(url, redis_url, prefix, history_interval_seconds=INTERVAL, **overrides)


async def next_bucket(url: str, after: datetime | None = None) -> Any:
    return await next_history_bucket(url, INTERVAL, after)


def records(rows: Sequence[asyncpg.Record]) -> list[dict[str, Any]]:
    return [dict(r) for r in rows]


async def rollup_reads(
    url: str, seconds: int, patterns: list[str] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rollups' three reads for `patterns` (None: every runtime) and the raw ones,
    in one transaction."""
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            raw = {
                "points": records(await conn.fetch(RAW_POINTS, seconds, patterns)),
                "depth": records(await conn.fetch(RAW_TOP_BY_DEPTH, seconds, patterns)),
                "failures": records(await conn.fetch(RAW_TOP_BY_FAILURES, seconds, patterns)),
            }
            points, deepest, failing = await fleet_rows(conn, seconds, patterns)
            rolled = {
                "points": records(points),
                "depth": records(deepest),
                "failures": records(failing),
            }
    finally:
        await conn.close()
    return rolled, raw


async def assert_rollups_match(url: str, patterns_list: list[list[str] | None]) -> None:
    for patterns in patterns_list:
        for seconds in WINDOWS:
            rolled, raw = await rollup_reads(url, seconds, patterns)
            assert rolled == raw, (patterns, seconds)


async def fleet_table(url: str) -> list[dict[str, Any]]:
    return records(await fetch(url, "SELECT * FROM task_history_fleet ORDER BY at"))


async def test_a_concurrent_burst_and_a_late_row_roll_up_exactly_and_once(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url = own_database_url
    runtimes = [f"{runtime_id}-{n}" for n in range(4)]
    async with running_gateway(settings(url, redis_url, redis_prefix, db_pool_min=8)) as gw:
        await first_pass_done(gw)
        janitor = gw.gateway.janitor
        await next_bucket(url)
        # A transaction that begins in this bucket and commits after the bucket was
        # folded: its counts land late, in a bucket the fleet row already sums.
        late = await asyncpg.connect(url)
        late_tx = late.transaction()
        await late_tx.start()
        await late.execute(
            "INSERT INTO tasks (runtime_id, payload) VALUES ($1, '{}'::jsonb)", runtimes[0]
        )
        [late_at] = [r["at"] for r in await late.fetch("SELECT history_bucket() AS at")]

        # 8 concurrent producers over the four runtimes; odd tasks die at their first
        # failure, even ones are retried once.
        async def producer(c: int) -> None:
            for n in range(12):
                rt = runtimes[(c + n) % 4]
                await gw.enqueue(rt, {"n": n}, max_attempts=1 + (n + 1) % 2)

        await asyncio.gather(*(producer(c) for c in range(8)))

        # 6 concurrent workers on three of the runtimes (the fourth keeps a queue):
        # every third task fails, the others complete.
        async def worker(name: str) -> None:
            for rt in runtimes[:3]:
                while tasks := await gw.claim(rt, name, max_tasks=2, wait_seconds=0):
                    for task in tasks:
                        if task["payload"]["n"] % 3 == 0:
                            resp = await lease_op(
                                gw, "fail", task, error="boom", retry_after_seconds=0
                            )
                            assert resp.status == 200, resp.body
                        else:
                            assert (await gw.complete(task))[0] == 200

        await asyncio.gather(*(worker(f"w{i}") for i in range(6)))
        backends = await fetch(url, "SELECT count(DISTINCT backend) AS n FROM task_history")
        assert backends[0]["n"] > 2, "the statements ran on one connection only"
        # Activity in the bucket that ends next, whose depths the pass reads.
        await gw.enqueue(runtimes[3], {"n": 99})

        await next_bucket(url)
        report = await janitor.run_once()  # folds the burst, reads the depths
        assert report.errors == [] and report.history_folded > 0, report
        assert report.history_depths > 0, report
        folded = await fetch(url, "SELECT 1 FROM task_history_fleet WHERE at = $1", late_at)
        assert folded, "the late row's bucket was not folded before it"
        await late_tx.commit()
        await late.close()
        waiting = await fetch(
            url, "SELECT count(*) AS n FROM task_history WHERE backend <> 0 AND at = $1", late_at
        )
        assert waiting[0]["n"] == 1, "no row came late into the folded bucket"
        report = await janitor.run_once()  # folds the late row
        assert report.errors == [] and report.history_folded >= 1, report

        await assert_rollups_match(url, [None, [runtimes[0]], [f"{runtime_id}-1*", "nobody"]])
        # Every count is folded: the fleet table alone is what summing backend 0 gives.
        summed = records(
            await fetch(
                url,
                f"SELECT at, {', '.join(COUNTS)}, waits, depth, oldest_queued_age_seconds"
                f"  FROM (SELECT at, {_SUMS}, {_WAITS} AS waits, sum(depth)::bigint AS depth,"
                "               max(oldest_queued_age_seconds) AS oldest_queued_age_seconds"
                "          FROM task_history GROUP BY at) s ORDER BY at",
            )
        )
        table = await fleet_table(url)
        assert table == summed
        assert sum(r["enqueued"] for r in table) == 8 * 12 + 2
        assert any(r["depth"] for r in table), table  # the fourth runtime's queue

        # The rollup again, twice: nothing moves, nothing is added.
        report = await janitor.run_once()
        assert (report.history_folded, report.history_depths) == (0, 0), report
        assert await gw.gateway.store.fold_history(1000) == 0
        assert await gw.gateway.store.fill_history_depth(1000) == 0
        assert await fleet_table(url) == table


async def test_the_top_lists_from_the_rollups_equal_the_raw_rows(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    # Batches of 5: the 12 depths below reach their fleet row in three statements.
    async with running_gateway(settings(url, redis_url, redis_prefix, janitor_batch_size=5)) as gw:
        await first_pass_done(gw)
        store = gw.gateway.store
        # A day and more of per-backend rows of 14 runtimes, failures in some minutes,
        # away from the windows' edges (minutes 2 to 1,570 ago, but for 55 to 65 and
        # 1,435 to 1,445): as connections leave them, for the fold to roll up.
        await execute(
            url,
            """
            INSERT INTO task_history (runtime_id, at, backend, enqueued, claimed, completed,
                                      failed, dead, waits)
            SELECT $1 || '-' || r, to_timestamp(floor(extract(epoch FROM now()) / 60) * 60)
                       - make_interval(mins => m), b,
                   (r * m + b) % 7, (r + m) % 5, (r * b) % 4,
                   CASE WHEN (r * 7 + m) % 11 < 3 THEN (r + b + m) % 4 ELSE 0 END,
                   CASE WHEN (r * 5 + m) % 13 < 2 THEN (r + b) % 3 ELSE 0 END,
                   ARRAY[r % 3, b, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, m % 2]::bigint[]
              FROM generate_series(1, 14) AS r, generate_series(2, 1570, 7) AS m,
                   generate_series(1, 3) AS b
             WHERE NOT (m BETWEEN 55 AND 65 OR m BETWEEN 1435 AND 1445)
               AND (r + m) % 3 <> 0
            """,
            rt,
        )
        while await store.fold_history(500):
            pass
        # Late rows, into buckets folded already, with failures.
        await execute(
            url,
            "INSERT INTO task_history (runtime_id, at, backend, failed, dead, waits)"
            " SELECT runtime_id, at, 99, 3, 1, waits FROM task_history"
            "  WHERE backend = 0 AND runtime_id IN ($1 || '-2', $1 || '-9')",
            rt,
        )
        while await store.fold_history(500):
            pass
        # Queues of 12 runtimes, deepest first from -1 (two of them tied), and their
        # depths read once their bucket has ended.
        [made] = await fetch(
            url,
            "WITH made AS (INSERT INTO tasks (runtime_id, payload)"
            " SELECT $1 || '-' || r, '{}'::jsonb FROM generate_series(1, 12) AS r,"
            "        generate_series(1, 30 - 2 * r + CASE WHEN r = 4 THEN 2 ELSE 0 END)"
            " RETURNING 1) SELECT now() AS at, count(*) FROM made",
            rt,
        )
        await next_bucket(url, after=made["at"])
        report = await gw.gateway.janitor.run_once()
        assert report.errors == [] and report.history_depths == 12, report
        unfolded = await fetch(url, "SELECT count(*) AS n FROM task_history WHERE backend <> 0")
        assert unfolded[0]["n"] == 0

        # Rows not folded yet count too: a failure in the current bucket.
        await execute(
            url,
            "INSERT INTO task_history (runtime_id, at, backend, failed, dead, waits)"
            " VALUES ($1 || '-13', history_bucket(), 42, 500, 0, $2)",
            rt,
            [0] * 14,
        )
        await assert_rollups_match(url, [None, [f"{rt}-1*"], [f"{rt}-2", f"{rt}-9"]])
        rolled, _ = await rollup_reads(url, 3600, None)
        assert [r["depth"] for r in rolled["depth"]] == [28, 26, 24, 24, 20, 18, 16, 14, 12, 10]
        assert len(rolled["failures"]) == 10 and rolled["failures"][0]["runtime_id"] == f"{rt}-13"

        # A pattern of `*` alone covers every runtime: the rollups answer it as the admin.
        every = await store.fleet_history(86400, None)
        assert every.points and every.top_by_failures
        assert await store.fleet_history(86400, ["nobody", "*"]) == every
        assert await store.fleet_history(86400, ["**"]) == every


async def test_the_rollups_retention_deletes_their_old_rows_in_batches(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    url, rt = own_database_url, runtime_id
    async with running_gateway(
        settings(url, redis_url, redis_prefix, history_days=2, janitor_batch_size=10)
    ) as gw:
        await first_pass_done(gw)
        zeros = "'{0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::bigint[]"
        await execute(
            url,
            f"""
            INSERT INTO task_history_fleet (at, enqueued, waits)
            SELECT now() - make_interval(days => 3, secs => n * 60), 1, {zeros}
              FROM generate_series(1, 115) AS n
            UNION ALL
            SELECT now() - make_interval(days => 1, secs => n * 60), 1, {zeros}
              FROM generate_series(1, 5) AS n
            """,
        )
        # Hours of failures: 30 runtimes' hour three days back, and the hour that holds
        # the cutoff (kept whole) and a recent one of one runtime.
        await execute(
            url,
            """
            INSERT INTO task_history_failures (runtime_id, hour, failed, dead)
            SELECT $1 || '-' || n, history_hour(now() - interval '3 days'), 1, 0
              FROM generate_series(1, 30) AS n
            UNION ALL
            SELECT $1, history_hour(now() - interval '2 days'), 1, 0
            UNION ALL
            SELECT $1, history_hour(now() - interval '1 day'), 1, 0
            """,
            rt,
        )
        await execute(
            url,
            "INSERT INTO task_history_runtimes (runtime_id, last_at)"
            " SELECT $1 || '-' || n, now() - make_interval(days => 3, secs => n)"
            "   FROM generate_series(1, 25) AS n"
            " UNION ALL SELECT $1, now() - interval '1 day'",
            rt,
        )
        # Ten batches of ten a pass at most, for each table: the rest waits.
        janitor = gw.gateway.janitor
        assert (await janitor.run_once()).history_rollups_purged == 100 + 30 + 25
        assert (await janitor.run_once()).history_rollups_purged == 15
        assert (await janitor.run_once()).history_rollups_purged == 0
        left = await fetch(
            url,
            "SELECT (SELECT count(*) FROM task_history_fleet) AS fleet,"
            " (SELECT array_agg(hour ORDER BY hour) FROM task_history_failures) AS hours,"
            " (SELECT array_agg(runtime_id) FROM task_history_runtimes) AS runtimes,"
            " history_hour(now() - interval '2 days') AS cutoff_hour",
        )
        assert left[0]["fleet"] == 5
        assert left[0]["hours"][0] == left[0]["cutoff_hour"] and len(left[0]["hours"]) == 2
        assert left[0]["runtimes"] == [rt]


async def test_a_limited_token_is_answered_from_its_runtimes_rows_alone(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """The fleet row sums every runtime: a limited token's answer must not move when a
    runtime it does not cover gets history."""
    url, rt = own_database_url, runtime_id
    async with running_gateway(settings(url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        store = gw.gateway.store
        await next_bucket(url)
        for n in range(3):
            await gw.enqueue(f"{rt}-mine", {"n": n})
        await next_bucket(url)
        await gw.gateway.janitor.run_once()
        before = await store.fleet_history(3600, [f"{rt}-mine"])
        assert sum(p.enqueued for p in before.points) == 3
        assert [r.depth for r in before.top_by_depth] == [3]

        await gw.enqueue(f"{rt}-other", {"n": 0})
        await next_bucket(url)
        await gw.gateway.janitor.run_once()
        assert await store.fleet_history(3600, [f"{rt}-mine"]) == before
        every = await store.fleet_history(3600, None)
        assert sum(p.enqueued for p in every.points) == 4
