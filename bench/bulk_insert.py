"""`--scenario bulk-insert`: one INSERT of many finished tasks, in time linear in its rows.

An import, a restore or a test's load inserts finished tasks (completed, dead, expired,
cancelled) in one statement, and the finished-task counters (`task_counts`) are kept by
a trigger in the same transaction. Counted once per row, such a statement took time
quadratic in its rows (each upsert of one counter row walked the versions the earlier
ones left: 200,000 rows did not finish in a minute); counted once per statement
(migration 0011), it writes one counter delta per runtime and status.

On a fresh database, for each of `--bulk-rows` (10^5 and 10^6 by default) on an empty
table: one `INSERT ... SELECT generate_series` of that many finished tasks over 4
runtimes and the 4 finished statuses, timed from the statement's start to its commit,
with the triggers on (as the gateway's schema has them) and, beside it, with them off
(`session_replication_role = replica`, which is how a restore skips them). It checks
that the counters then equal a `count(*)` of the rows by runtime and status, and that
the counter rows the statement wrote (its transaction's own statistics) do not grow
with the rows. The target: the largest insert takes at most 1.5 times its share of
the smallest's time (15x for 10x the rows).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import asyncpg

from .infra import Servers, fresh_database, log
from .stats import Result

RUNTIMES = 4
FINISHED = ("completed", "dead", "expired", "cancelled")
STATEMENT_TIMEOUT_SECONDS = 900.0
# How much more than linear the largest insert may take, per row, than the smallest.
LINEAR_SLACK = 1.5

INSERT_FINISHED = f"""
INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, result)
SELECT 'bulk-' || (g % {RUNTIMES}), (ARRAY{list(FINISHED)!r})[1 + (g / {RUNTIMES}) % 4],
       '{{"bulk": true}}'::jsonb, 1, now(), '{{"ok": true}}'::jsonb
  FROM generate_series(1, $1::int) AS g
"""

# Counter rows the current transaction inserted or updated: exact before it commits.
COUNTER_WRITES = """
SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'task_counts'::regclass
"""

BY_ROWS = f"""
SELECT runtime_id, status, count(*) AS n FROM tasks
 WHERE status IN {FINISHED!r} GROUP BY runtime_id, status
"""

BY_COUNTERS = """
SELECT runtime_id, status, sum(n)::bigint AS n FROM task_counts GROUP BY runtime_id, status
"""


async def _empty(conn: asyncpg.Connection) -> None:
    """An empty task table (its counters go with it), its space given back, and the
    dirty pages written, so that each insert starts from the same state."""
    await conn.execute("TRUNCATE tasks")
    await conn.execute("VACUUM (ANALYZE) tasks")
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT", timeout=STATEMENT_TIMEOUT_SECONDS)


async def _insert(conn: asyncpg.Connection, rows: int, triggers: bool) -> tuple[float, int]:
    """Seconds from the statement's start to its commit, and the counter rows written."""
    started = time.perf_counter()
    async with conn.transaction():
        if not triggers:
            await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(INSERT_FINISHED, rows, timeout=STATEMENT_TIMEOUT_SECONDS)
        writes = int(await conn.fetchval(COUNTER_WRITES) or 0)
    return time.perf_counter() - started, writes


async def _check_counts(conn: asyncpg.Connection, rows: int) -> list[str]:
    """What is wrong with the counters after `rows` were inserted (nothing: [])."""
    truth = {(r["runtime_id"], r["status"]): r["n"] for r in await conn.fetch(BY_ROWS)}
    counted = {(r["runtime_id"], r["status"]): r["n"] for r in await conn.fetch(BY_COUNTERS)}
    problems = []
    if sum(truth.values()) != rows:
        problems.append(f"{rows:,} rows inserted but {sum(truth.values()):,} found")
    if counted != truth:
        wrong = sorted(k for k in truth.keys() | counted.keys() if truth.get(k) != counted.get(k))
        problems.append(
            f"after {rows:,} rows the counters disagree with count(*) for {len(wrong)} "
            f"runtime and status pairs, e.g. {wrong[0]}: counted {counted.get(wrong[0])}, "
            f"stored {truth.get(wrong[0])}"
        )
    return problems


async def bulk_insert(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    """One Result, `all`: seconds and counter writes per size, triggers on and off."""
    del workdir  # no process of its own: nothing to log
    sizes = sorted(opts.bulk_rows)
    result = Result("bulk-insert", "all")
    on: list[float] = []
    off: list[float] = []
    writes: list[int] = []
    async with fresh_database(servers.database_url) as url:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            for rows in sizes:
                log(f"bulk-insert: {rows:,} finished tasks in one INSERT, triggers on and off")
                await _empty(conn)
                seconds, wrote = await _insert(conn, rows, triggers=True)
                on.append(round(seconds, 3))
                writes.append(wrote)
                result.failures += await _check_counts(conn, rows)
                await _empty(conn)
                seconds, _ = await _insert(conn, rows, triggers=False)
                off.append(round(seconds, 3))
        finally:
            await conn.close()
    groups = RUNTIMES * len(FINISHED)
    for rows, wrote in zip(sizes, writes, strict=True):
        if wrote != min(rows, groups):
            result.failures.append(
                f"the insert of {rows:,} rows wrote {wrote:,} counter rows; one per runtime "
                f"and status ({min(rows, groups)}) was expected"
            )
    result.numbers = {
        "rows": sizes,
        "seconds": on,
        "seconds_triggers_off": off,
        "x_triggers_off": [round(a / b, 2) if b else None for a, b in zip(on, off, strict=True)],
        "counter_writes": writes,
        "rows_per_second": [round(n / s) if s else None for n, s in zip(sizes, on, strict=True)],
    }
    return [result]


def linear_bound(rows: list[int]) -> float:
    """The most the largest insert may take, as a multiple of the smallest's time."""
    return LINEAR_SLACK * max(rows) / min(rows)
