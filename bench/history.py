"""What the per-runtime history costs at fleet size: the table's size for a synthetic
fleet's retention, the janitor's rollup of one bucket over every runtime, and the
history's reads, measured with the gateway's own statements.

    python -m bench.history --runtimes 10000 --days 7 --active 0.1
    python -m bench.history --statements 2000

The rollup is timed on two minutes loaded alike, each read just after it ended: first
with the fold and the depth as they were before the fleet's rollups (BASELINE_FOLD,
BASELINE_DEPTH), then with the janitor's own statements, which also keep the rollups;
the difference is what the rollups add to a pass. The fleet's reads are timed for a
token covering every runtime (answered from the rollups) and for tokens limited to
patterns (each covered runtime's own rows).

With --statements, it measures instead what the history's triggers add to the hot
path: that many enqueues, claims and completes of one task each, through the gateway's
Store, in rounds that turn the triggers off and on in turn (the same load sees both),
and the median of each statement with and without them.

The fleet: --runtimes runtimes, each with a point in a share --active of the buckets
(minutes) of --days days, folded as the janitor leaves them; then one bucket that has
just ended in which every runtime was active, its counts in the rows of 4 backends (as
4 gateway connections leave them), and --queued queued tasks per runtime. The rollup
is the janitor's history step (fold, depth, retention) run until it has nothing left,
timed step by step. It creates a database of its own on the Postgres server of
TEST_DATABASE_URL (or --admin-url), migrates it with this checkout's migrations, and
drops it. The rollups of the loaded week are built as migration 0017 builds them from
the history already kept, and timed: that is what the migration costs on such a table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import asyncpg

from bench.measure import scratch_database
from gateway.api.requests import parse_enqueue
from gateway.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.history import HISTORY_ROLLUPS
from gateway.store.sql.runtimes import QUEUED_LATERALS

ZEROS = "'{0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::bigint[]"
MINUTE = "to_timestamp(floor(extract(epoch FROM now()) / 60) * 60)"
# Points of the retention: each runtime in a share $3 of the minutes of $2 days, the
# bucket before the current one and the current one left out (FILL_ENDED's).
FILL_HISTORY = f"""
INSERT INTO task_history (runtime_id, at, backend, enqueued, claimed, completed, failed,
                          waits, depth, oldest_queued_age_seconds)
SELECT 'rt-' || r, {MINUTE} - make_interval(mins => m), 0, 20, 20, 19, 1,
       '{{5,10,3,2,0,0,0,0,0,0,0,0,0,0}}'::bigint[], 7, 1.5
  FROM generate_series(1, $1) AS r, generate_series(2, $2 * 1440) AS m
 WHERE random() < $3
"""
# The bucket that has just ended: every runtime active, on 4 backends, unfolded.
FILL_ENDED = f"""
INSERT INTO task_history (runtime_id, at, backend, enqueued, claimed, completed, waits)
SELECT 'rt-' || r, {MINUTE} - interval '1 minute', b, 5, 5, 5, {ZEROS}
  FROM generate_series(1, $1) AS r, generate_series(1, 4) AS b
"""
# The rollups of migration 0017 for folded rows loaded as above, as the fold and the
# depth would have left them (the migration's own start from the history kept).
ROLLUPS_FROM_FOLDED = (
    """
INSERT INTO task_history_fleet (at, enqueued, claimed, completed, failed, dead, expired,
                                cancelled, waits, depth, oldest_queued_age_seconds)
SELECT at, sum(enqueued), sum(claimed), sum(completed), sum(failed), sum(dead),
       sum(expired), sum(cancelled),
       ARRAY[sum(waits[1]), sum(waits[2]), sum(waits[3]), sum(waits[4]), sum(waits[5]),
             sum(waits[6]), sum(waits[7]), sum(waits[8]), sum(waits[9]), sum(waits[10]),
             sum(waits[11]), sum(waits[12]), sum(waits[13]), sum(waits[14])]::bigint[],
       sum(depth), max(oldest_queued_age_seconds)
  FROM task_history WHERE backend = 0 GROUP BY at
""",
    """
INSERT INTO task_history_runtimes (runtime_id, last_at, depth_at, depth)
SELECT DISTINCT ON (runtime_id) runtime_id, at, at, depth FROM task_history
 WHERE backend = 0 ORDER BY runtime_id, at DESC
""",
    """
INSERT INTO task_history_failures (runtime_id, hour, failed, dead)
SELECT runtime_id, history_hour(at), sum(failed), sum(dead) FROM task_history
 WHERE backend = 0 AND failed + dead > 0 GROUP BY runtime_id, history_hour(at)
""",
)
# The fold and the depth as they were before the rollups of migration 0017: the janitor's
# statements without their writes to task_history_fleet, task_history_failures and
# task_history_runtimes, to measure what those add to a pass.
_COUNTERS = ("enqueued", "claimed", "completed", "failed", "dead", "expired", "cancelled")
BASELINE_FOLD = f"""
WITH picked AS (
    SELECT runtime_id, at, backend FROM task_history
     WHERE backend <> 0 AND at < history_bucket()
     ORDER BY at LIMIT $1 FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM task_history h USING picked p
     WHERE (h.runtime_id, h.at, h.backend) = (p.runtime_id, p.at, p.backend)
    RETURNING h.*
), folded AS (
    INSERT INTO task_history AS h (runtime_id, at, backend, {", ".join(_COUNTERS)}, waits)
    SELECT runtime_id, at, 0, {", ".join(f"sum({c})" for c in _COUNTERS)},
           ARRAY[{", ".join(f"sum(waits[{i}])" for i in range(1, 15))}]::bigint[]
      FROM moved GROUP BY runtime_id, at ORDER BY runtime_id, at
    ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
        {", ".join(f"{c} = h.{c} + EXCLUDED.{c}" for c in _COUNTERS)},
        waits = history_waits_add(h.waits, EXCLUDED.waits)
)
SELECT count(*) FROM moved
"""
_ENDED = "SELECT history_bucket() - make_interval(secs => interval_seconds) FROM history_settings"
BASELINE_DEPTH = f"""
WITH r AS (
    SELECT h.runtime_id FROM task_history h
     WHERE h.at = ({_ENDED}) AND h.backend = 0 AND h.depth IS NULL
     ORDER BY h.runtime_id LIMIT $1 FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT r.runtime_id, q.n + s.n AS depth,
           extract(epoch FROM clock_timestamp() - least(q.oldest, s.oldest))::float8 AS oldest
      FROM r
{QUEUED_LATERALS}
), filled AS (
    UPDATE task_history h
       SET depth = counted.depth, oldest_queued_age_seconds = counted.oldest
      FROM counted
     WHERE (h.runtime_id, h.at, h.backend) = (counted.runtime_id, ({_ENDED}), 0)
    RETURNING 1
)
SELECT count(*) FROM filled
"""
FILL_QUEUED = """
INSERT INTO tasks (runtime_id, payload)
SELECT 'rt-' || (n % $1::int + 1), '{}'::jsonb FROM generate_series(1, $1::int * $2::int) AS n
"""
ROLLUP_TABLES = ("task_history_fleet", "task_history_runtimes", "task_history_failures")
ROLLUP_SIZE = """
SELECT (SELECT count(*) FROM {table}) AS rows,
       pg_size_pretty(pg_total_relation_size('{table}')) AS size
"""
SIZES = """
SELECT pg_size_pretty(pg_table_size('task_history')) AS heap,
       pg_size_pretty(pg_indexes_size('task_history')) AS indexes,
       pg_size_pretty(pg_total_relation_size('task_history')) AS total,
       pg_total_relation_size('task_history') AS total_bytes,
       (SELECT count(*) FROM task_history) AS rows
"""


async def load(url: str, runtimes: int, days: int, active: float, queued: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        await conn.execute("SET synchronous_commit = off")
        await conn.execute(FILL_HISTORY, runtimes, days, active)
        # The queued tasks are the depth's to count, not activity: the history's insert
        # trigger is off while they are loaded.
        await conn.execute("ALTER TABLE tasks DISABLE TRIGGER task_history_inserted")
        await conn.execute(FILL_QUEUED, runtimes, queued)
        await conn.execute("ALTER TABLE tasks ENABLE TRIGGER task_history_inserted")
        loaded = time.monotonic()
        for statement in ROLLUPS_FROM_FOLDED:
            await conn.execute(statement)
        built = time.monotonic() - loaded
        for table in ("task_history", "tasks", *ROLLUP_TABLES):
            await conn.execute(f"VACUUM ANALYZE {table}")
        sizes = await conn.fetchrow(SIZES)
        print(
            f"loaded {sizes['rows']:,} history rows ({runtimes:,} runtimes, {days} days, "
            f"{active:.0%} of the minutes active) and {runtimes * queued:,} queued tasks in "
            f"{loaded - started:.0f} s"
        )
        print(
            f"task_history: {sizes['heap']} table + {sizes['indexes']} indexes = "
            f"{sizes['total']} ({sizes['total_bytes'] / max(1, sizes['rows']):.0f} bytes a row)"
        )
        print(f"rollups built from it (as migration 0017 does) in {built:.1f} s")
        for table in ROLLUP_TABLES:
            row = await conn.fetchrow(ROLLUP_SIZE.format(table=table))
            print(f"{table}: {row['rows']:,} rows, {row['size']}")
    finally:
        await conn.close()


async def batches(name: str, run: Callable[[int], Awaitable[int]], batch: int) -> float:
    """`run(batch)` until a batch comes back short; prints and returns its seconds."""
    started, rows, count = time.perf_counter(), 0, 0
    while True:
        n = await run(batch)
        rows, count = rows + n, count + 1
        if n < batch:
            break
    took = time.perf_counter() - started
    print(f"rollup {name}: {rows:,} rows in {count} batches of {batch}, {took:.2f} s")
    return took


async def minute_begun(conn: asyncpg.Connection) -> None:
    """Sleeps until just after the database's clock begins a minute, so that a phase
    that reads the minute that has just ended finds it so for the whole next minute."""
    left = await conn.fetchval("SELECT 60 - (extract(epoch FROM clock_timestamp()) % 60)::float8")
    await asyncio.sleep(float(left) + 0.5)


def on(conn: asyncpg.Connection, statement: str) -> Callable[[int], Awaitable[int]]:
    """A batch of `statement` (one limit parameter, one count answered) on `conn`."""

    async def run_batch(limit: int) -> int:
        n: int = await conn.fetchval(statement, limit)
        return n

    return run_batch


async def rollup(url: str, store: Store, runtimes: int, batch: int) -> None:
    """The fold and the depth of a minute that has just ended, in which every runtime
    was active on 4 connections: first as they were before the rollups, then, a minute
    later and on a minute loaded alike, as the janitor runs them now; then retention,
    timed statement by statement until it is done."""
    conn = await asyncpg.connect(url)
    try:
        await minute_begun(conn)
        await conn.execute(FILL_ENDED, runtimes)
        before = await batches("fold, before the rollups", on(conn, BASELINE_FOLD), batch)
        before += await batches("depth, before the rollups", on(conn, BASELINE_DEPTH), batch)
        await minute_begun(conn)
        await conn.execute(FILL_ENDED, runtimes)
    finally:
        await conn.close()
    now = await batches("fold", store.fold_history, batch)
    now += await batches("depth", store.fill_history_depth, batch)
    print(
        f"rollup fold and depth: {now:.2f} s with the rollups, {before:.2f} s without: "
        f"{now - before:+.2f} s for a minute of {runtimes:,} active runtimes"
    )
    await batches("retention", lambda limit: store.purge_history(7, limit), batch)
    for name in HISTORY_ROLLUPS:
        purge = functools.partial(store.purge_history_rollup, name, 7)
        await batches(f"retention of {name}", purge, batch)


async def reads(store: Store, repeat: int) -> None:
    page = [f"rt-{n}" for n in range(1, 51)]
    for name, read in (
        ("one runtime, 1h", lambda: store.runtime_history("rt-1", 3600)),
        ("one runtime, 7d", lambda: store.runtime_history("rt-1", 7 * 86400)),
        ("sparklines, a page of 50", lambda: store.depth_sparklines(page, 3600)),
        ("fleet, 1h, every runtime", lambda: store.fleet_history(3600, None)),
        ("fleet, 24h, every runtime", lambda: store.fleet_history(86400, None)),
        ("fleet, 7d, every runtime", lambda: store.fleet_history(7 * 86400, None)),
        ("fleet, 1h, a token of rt-1*", lambda: store.fleet_history(3600, ["rt-1*"])),
        ("fleet, 24h, a token of rt-1*", lambda: store.fleet_history(86400, ["rt-1*"])),
        ("fleet, 7d, a token of rt-1*", lambda: store.fleet_history(7 * 86400, ["rt-1*"])),
        ("fleet, 7d, a token of rt-12*", lambda: store.fleet_history(7 * 86400, ["rt-12*"])),
        ("fleet, 7d, a token of rt-1", lambda: store.fleet_history(7 * 86400, ["rt-1"])),
    ):
        seconds, failed = [], 0
        for _ in range(repeat):
            started = time.perf_counter()
            try:
                await read()
            except StoreUnavailable:  # past the statement timeout: the API answers 503
                failed += 1
                continue
            seconds.append(time.perf_counter() - started)
        median = f"median {statistics.median(seconds) * 1000:.1f} ms" if seconds else "no answer"
        timeouts = f", {failed} of {repeat} past the statement timeout" if failed else ""
        print(f"read {name}: {median}{timeouts}")


async def statement_cost(url: str, statements: int, rounds: int = 10) -> None:
    """Median enqueue, claim and complete, with the history's triggers and without."""
    store = Store(url, Metrics(), min_size=1, max_size=1)
    admin = await asyncpg.connect(url)
    await store.open()
    seconds: dict[tuple[str, bool], list[float]] = {}
    request = parse_enqueue({"payload": {"n": 1}}, None, 1_000_000)
    try:
        for turn in range(2 * rounds):
            on = turn % 2 == 1
            switch = "ENABLE" if on else "DISABLE"
            for trigger in ("task_history_moved", "task_history_inserted"):
                await admin.execute(f"ALTER TABLE tasks {switch} TRIGGER {trigger}")
            for _ in range(statements // rounds):
                started = time.perf_counter()
                await store.enqueue("hot", request)
                seconds.setdefault(("enqueue", on), []).append(time.perf_counter() - started)
                started = time.perf_counter()
                [leased], _ = await store.claim("hot", ["w"], [600.0])
                seconds.setdefault(("claim", on), []).append(time.perf_counter() - started)
                assert leased.task.lease_id is not None
                started = time.perf_counter()
                await store.complete(leased.task.id, leased.task.lease_id, None)
                seconds.setdefault(("complete", on), []).append(time.perf_counter() - started)
    finally:
        await store.close()
        await admin.close()
    for name in ("enqueue", "claim", "complete"):
        without, with_ = (statistics.median(seconds[(name, f)]) * 1000 for f in (False, True))
        print(f"{name}: median {without:.3f} ms without the triggers, {with_:.3f} ms with them")


async def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.history", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runtimes", type=int, default=10_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--active", type=float, default=0.1, help="share of active minutes")
    parser.add_argument("--queued", type=int, default=10, help="queued tasks per runtime")
    parser.add_argument("--batch", type=int, default=1000, help="GATEWAY_JANITOR_BATCH_SIZE")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each read")
    parser.add_argument(
        "--statements", type=int, default=0, help="measure the triggers' cost instead"
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("TEST_DATABASE_URL"),
        help="a Postgres URL that may create databases (default: TEST_DATABASE_URL)",
    )
    args = parser.parse_args()
    if not args.admin_url:
        raise SystemExit("give --admin-url or set TEST_DATABASE_URL")
    url, drop = await scratch_database(args.admin_url, "gwtest_history_")
    try:
        if args.statements:
            await statement_cost(url, args.statements)
            return
        await load(url, args.runtimes, args.days, args.active, args.queued)
        store = Store(url, Metrics(), min_size=1, max_size=1)
        await store.open()
        try:
            await rollup(url, store, args.runtimes, args.batch)
            await reads(store, args.repeat)
        finally:
            await store.close()
    finally:
        await drop()


if __name__ == "__main__":
    asyncio.run(main())
