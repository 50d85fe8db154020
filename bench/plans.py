"""A claim statement's time under Postgres's default plan choice and under its generic
plan, on a task table with statistics.

    .venv/bin/python -m bench.plans [--executions 300] [--database-url URL]

On a database of its own (bench_<random>, dropped afterwards), with the gateway's
migrations: one runtime's 60,000 queued tasks and 200,000 finished tasks over 50 other
runtimes, then `ANALYZE tasks`, as autovacuum leaves the table of a gateway that has
been up a while (autovacuum is then turned off on this table, so that no new statistics
replan the statements midway). On one connection per plan mode, with asyncpg's statement
cache as the gateway's pool keeps it, the claim (`CLAIM`, the gateway's first window:
k + CLAIM_WINDOW) of k slots, and the claim carrying the completes of the k tasks the
last one leased (`CLAIM_ACKED`), each run `--executions` times per k; the two modes take
turns going first. Prints each one's median and 90th percentile in ms, wall time on the
client with the statement's commit, and how often Postgres planned it afresh (custom
plans) or ran the plan it kept (generic plans), from `pg_prepared_statements`.

`--database-url` names the server (its database is only used to create the scratch
one); default BENCH_DATABASE_URL, then TEST_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import asyncpg

from gateway.store.leases import CLAIM_WINDOW
from gateway.store.sql import leases as lease_sql

from .infra import fresh_database

RUNTIME = "plans-hot"
QUEUED = """
INSERT INTO tasks (runtime_id, payload, created_at)
SELECT $1, jsonb_build_object('n', n), now() - interval '1 day' + make_interval(secs => n)
  FROM generate_series(1, 60000) AS n
"""
FINISHED = """
INSERT INTO tasks (runtime_id, status, payload, finished_at)
SELECT 'plans-' || (n % 50), 'completed', jsonb_build_object('n', n), now()
  FROM generate_series(1, 200000) AS n
"""
MODES = ("auto", "force_generic_plan")
SLOTS = (1, 10, 63)
HEADER = (
    "| statement | slots | plan_cache_mode | median ms | p90 ms | custom plans | generic plans |"
)
RELEASE = """
UPDATE tasks SET status = 'queued', lease_id = NULL, lease_expires_at = NULL, worker_id = NULL
 WHERE id = ANY ($1::uuid[])
"""
PLANS = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1"


def _claim_args(k: int) -> list[Any]:
    return [RUNTIME, ["w"] * k, [60.0] * k, k + CLAIM_WINDOW]


def _leased(rows: list[Any], k: int) -> list[Any]:
    held = [r for r in rows if r["slot"]]
    if len(held) != k:
        raise RuntimeError(f"a claim of {k} leased {len(held)}: the backlog ran out")
    return held


async def _time(conn: asyncpg.Connection, k: int, executions: int, acked: bool) -> list[float]:
    """Wall seconds of each execution. With `acked`, each claim carries the completes of
    the tasks the one before it leased (the first claim is a plain one, untimed)."""
    held: list[Any] = []
    if acked:
        held = _leased(await conn.fetch(lease_sql.CLAIM, *_claim_args(k)), k)
    took = []
    for _ in range(executions):
        started = time.perf_counter()
        if acked:
            ids = [r["id"] for r in held]
            leases = [r["lease_id"] for r in held]
            results = ['{"ok":true}'] * len(ids)
            rows = await conn.fetch(
                lease_sql.CLAIM_ACKED, *_claim_args(k), ids, leases, results, [None] * len(ids)
            )
            held = _leased(rows, k)
            took.append(time.perf_counter() - started)
        else:
            rows = await conn.fetch(lease_sql.CLAIM, *_claim_args(k))
            took.append(time.perf_counter() - started)
            # Queued again, untimed, so that every claim finds the same backlog.
            await conn.execute(RELEASE, [r["id"] for r in _leased(rows, k)])
    return took


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f}"


async def run(admin_url: str, executions: int) -> None:
    async with fresh_database(admin_url) as url:
        setup = await asyncpg.connect(url)
        try:
            await setup.execute(QUEUED, RUNTIME)
            await setup.execute(FINISHED)
            await setup.execute("ANALYZE tasks")
            await setup.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
        finally:
            await setup.close()
        print(HEADER)
        print("|---|---|---|---|---|---|---|")
        for acked, query in ((False, lease_sql.CLAIM), (True, lease_sql.CLAIM_ACKED)):
            name = "CLAIM_ACKED" if acked else "CLAIM"
            for turn, k in enumerate(SLOTS):
                for mode in MODES if turn % 2 == 0 else MODES[::-1]:
                    conn = await asyncpg.connect(url)
                    try:
                        await conn.execute(f"SET plan_cache_mode = {mode}")
                        took = await _time(conn, k, executions, acked)
                        plans = await conn.fetchrow(PLANS, query)
                    finally:
                        await conn.close()
                    p90 = sorted(took)[int(0.9 * len(took))]
                    print(
                        f"| {name} | {k} | {mode} | {_ms(statistics.median(took))} | {_ms(p90)}"
                        f" | {plans['custom_plans']} | {plans['generic_plans']} |",
                        flush=True,
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=300, help="per statement, mode and k")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL") or os.environ.get("TEST_DATABASE_URL"),
    )
    args = parser.parse_args()
    if args.executions < 1 or args.executions > 300:
        parser.error("--executions: 1 to 300 (the backlog holds 60,000 tasks)")
    if not args.database_url:
        parser.error("give --database-url, or set BENCH_DATABASE_URL")
    asyncio.run(run(args.database_url, args.executions))


if __name__ == "__main__":
    main()
