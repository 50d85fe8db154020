"""What delayed tasks cost a claim: the median claim on a small runtime against the
median claim on a runtime with many delayed tasks of a higher priority ahead of its
due ones, measured in one run (absolute times vary with the machine's load; the
ratio is the figure).

    python -m bench.claim_delayed --delayed 1000000
    python -m bench.claim_delayed --delayed 1000000 --backlog 100000

With --backlog, the runtime with the delayed tasks also has that many more due tasks
(of the due tasks' low priority): then neither of a planner's ways through a single
index of waiting rows is cheap (walk the delayed ones, or read and sort the backlog).

It creates a database of its own on the Postgres server of TEST_DATABASE_URL (or
--admin-url), migrates it with this checkout's migrations, loads it, claims one task
at a time through the gateway's Store (each claim as the gateway sends it), and drops
the database. The two runtimes take turns, so that both see the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.migrate import apply_migrations

# Delayed tasks are written as the gateway writes them: `scheduled` where the schema
# has that status, else (before it) `queued` with a future run_at.
FILL_DELAYED = """
INSERT INTO tasks (runtime_id, status, priority, payload, run_at, created_at)
SELECT $1, $3, 900, '{}'::jsonb, now() + interval '1 hour' + make_interval(secs => n),
       now() - interval '1 hour'
  FROM generate_series(1, $2) AS n
"""
FILL_DUE = """
INSERT INTO tasks (runtime_id, priority, payload, run_at, created_at)
SELECT $1, 10, '{}'::jsonb, now() - interval '1 minute',
       now() - interval '30 minutes' + make_interval(secs => n)
  FROM generate_series(1, $2) AS n
"""
HAS_SCHEDULED = """
SELECT pg_get_constraintdef(oid) LIKE '%scheduled%' FROM pg_constraint
 WHERE conrelid = 'tasks'::regclass AND conname = 'tasks_status_check'
"""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def load(url: str, delayed: int, due: int, backlog: int) -> str:
    conn = await asyncpg.connect(url)
    try:
        status = "scheduled" if await conn.fetchval(HAS_SCHEDULED) else "queued"
        started = time.monotonic()
        await conn.execute(FILL_DELAYED, "big", delayed, status)
        await conn.execute(FILL_DUE, "big", due + backlog)
        await conn.execute(FILL_DUE, "small", due)
        await conn.execute("VACUUM ANALYZE tasks")
        print(
            f"loaded {delayed:,} delayed tasks (stored {status}), {due + backlog:,} due tasks "
            f"with them and {due:,} on the small runtime in {time.monotonic() - started:.1f} s"
        )
        return status
    finally:
        await conn.close()


async def measure(url: str, claims: int, warm_up: int) -> dict[str, list[float]]:
    store = Store(url, Metrics(), min_size=1, max_size=1)
    await store.open()
    seconds: dict[str, list[float]] = {"small": [], "big": []}
    try:
        for i in range(warm_up + claims):
            for runtime in ("small", "big"):
                started = time.perf_counter()
                rows, _ = await store.claim(runtime, ["w"], [600.0])
                elapsed = time.perf_counter() - started
                if len(rows) != 1:
                    raise SystemExit(f"claim {i} on {runtime} leased {len(rows)} tasks, not 1")
                if i >= warm_up:
                    seconds[runtime].append(elapsed)
    finally:
        await store.close()
    return seconds


async def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.claim_delayed", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--delayed", type=int, default=1_000_000, help="delayed tasks (big)")
    parser.add_argument("--backlog", type=int, default=0, help="more due tasks (big)")
    parser.add_argument("--claims", type=int, default=300, help="measured claims per runtime")
    parser.add_argument("--warm-up", type=int, default=20, help="unmeasured claims first")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("TEST_DATABASE_URL"),
        help="a Postgres URL that may create databases (default: TEST_DATABASE_URL)",
    )
    args = parser.parse_args()
    if not args.admin_url:
        raise SystemExit("give --admin-url or set TEST_DATABASE_URL")
    name = "gwtest_claimscale_" + secrets.token_hex(4)
    admin = await asyncpg.connect(args.admin_url)
    await admin.execute(f"CREATE DATABASE {name}")
    try:
        url = with_database(args.admin_url, name)
        await apply_migrations(url, log=lambda _line: None)
        await load(url, args.delayed, args.claims + args.warm_up, args.backlog)
        seconds = await measure(url, args.claims, args.warm_up)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()
    small, big = (statistics.median(seconds[k]) * 1000 for k in ("small", "big"))
    ahead = f"{args.delayed:,} delayed tasks ahead (backlog {args.backlog:,})"
    print(f"claim median, small runtime: {small:.3f} ms")
    print(f"claim median, {ahead}: {big:.3f} ms")
    print(f"ratio: {big / small:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
