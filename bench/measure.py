"""Measurements at scale, on a database of their own (dropped afterwards):

    python -m bench.measure stats    [--finished 1000000]
    python -m bench.measure janitor  [--runtimes 100000 --per-runtime 10 --passes 5 --interval 5]
    python -m bench.measure drain    [--tasks 20000 --completers 8 --rounds 3]
    python -m bench.measure hotpath  [--tasks 5000 --clients 8 --rounds 3]
    python -m bench.measure results  [--tasks 2000 --completers 8 --rounds 3]
    python -m bench.measure controls [--tasks 3000 --clients 4 --rounds 3]

`stats`: the stats of a runtime with `--finished` finished tasks against those of a
runtime with ten tasks, with the statements before migration 0005 and with today's, in
one run (median of 50 calls each). `janitor`: the duration of janitor passes over
`--runtimes` runtimes holding `--per-runtime` queued tasks each. `drain`: completions
per second of one runtime's claimed tasks by `--completers` concurrent connections,
with the finished-task counters' triggers on and off, alternating, in one run.
`hotpath`: enqueues and single-task claims per second by `--clients` concurrent
callers, with tasks_live_idx and without it, alternating, in one run.
`results`: completions per second through the HTTP API by `--completers` concurrent
clients, with the wake-up publish for waits on a task's result and without it,
alternating, in one run. `controls`: single-task claims per second of one runtime by
`--clients` concurrent callers, without runtime controls (the one-statement claim) and
with a max_in_flight no claim reaches (the limited claim's transaction under the
runtime's row lock), alternating, in one run.

Postgres from TEST_DATABASE_URL (a URL on which databases may be created), Redis from
TEST_REDIS_URL (keys under a prefix of the run's own). Absolute times depend on the
machine and its load; compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from gateway.store.migrate import apply_migrations
from gateway.store.sql import leases as lease_sql
from gateway.store.sql import tasks as task_sql
from gateway.store.sql.fragments import EFFECTIVE_STATUS

# The statements the stats ran before migration 0005, for the comparison.
OLD_STATS_COUNTS = f"""
SELECT {EFFECTIVE_STATUS} AS status, count(*) AS n FROM tasks WHERE runtime_id = $1 GROUP BY 1
"""
OLD_OLDEST_QUEUED_AGE = """
SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8
  FROM tasks
 WHERE runtime_id = $1 AND status = 'queued' AND run_at <= now()
   AND (expires_at IS NULL OR expires_at > now())
"""


def admin_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if not url:
        raise SystemExit("set TEST_DATABASE_URL to a Postgres URL that may create databases")
    return url


def with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


async def scratch_database(
    admin: str | None = None, prefix: str = "gwtest_scale_"
) -> tuple[str, Callable[[], Awaitable[None]]]:
    """A migrated database of the run's own, made through `admin` (a URL that may
    create databases; default TEST_DATABASE_URL), and a function that drops it."""
    admin = admin or admin_url()
    name = prefix + secrets.token_hex(4)
    conn = await asyncpg.connect(admin)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = with_database(admin, name)
    await apply_migrations(url, log=lambda _line: None)

    async def drop() -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()

    return url, drop


async def timed(n: int, fn: Callable[[], Awaitable[Any]]) -> float:
    """Median seconds of `n` calls, after two warm-up calls."""
    for _ in range(2):
        await fn()
    times = []
    for _ in range(n):
        started = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def bulk_finished(conn: asyncpg.Connection, runtime_id: str, n: int) -> None:
    """`n` completed tasks for `runtime_id`, counted the way migration 0005 counts the
    rows it finds (before migration 0011 the insert trigger counted row by row, and
    updated one counter row `n` times in one transaction)."""
    async with conn.transaction():
        await conn.execute("ALTER TABLE tasks DISABLE TRIGGER task_counts_insert")
        await conn.execute(
            """
            INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at)
            SELECT $1, 'completed', '{}'::jsonb, 1, now() FROM generate_series(1, $2)
            """,
            runtime_id,
            n,
        )
        await conn.execute("ALTER TABLE tasks ENABLE TRIGGER task_counts_insert")
        await conn.execute(
            "INSERT INTO task_counts (runtime_id, status, backend, n) "
            "VALUES ($1, 'completed', 0, $2)",
            runtime_id,
            n,
        )


async def measure_stats(finished: int) -> None:
    url, drop = await scratch_database()
    try:
        conn = await asyncpg.connect(url)
        try:
            started = time.monotonic()
            await bulk_finished(conn, "big", finished)
            await conn.execute(
                """
                INSERT INTO tasks (runtime_id, payload)
                SELECT rt, '{}'::jsonb FROM unnest(ARRAY['big', 'small']) AS rt,
                       generate_series(1, 10)
                """
            )
            await conn.execute("VACUUM ANALYZE tasks")
            await conn.execute("VACUUM ANALYZE task_counts")
            print(f"loaded {finished:,} finished tasks in {time.monotonic() - started:.1f} s")
            results = {}
            for label, counts, oldest in (
                ("before 0005", OLD_STATS_COUNTS, OLD_OLDEST_QUEUED_AGE),
                ("now", task_sql.STATS_COUNTS, task_sql.OLDEST_QUEUED_AGE),
            ):
                for runtime in ("small", "big"):

                    async def stats(
                        runtime: str = runtime, c: str = counts, o: str = oldest
                    ) -> None:
                        await conn.fetch(c, runtime)
                        await conn.fetchval(o, runtime)

                    results[label, runtime] = await timed(50, stats)
                small, big = results[label, "small"], results[label, "big"]
                print(
                    f"{label:>12}: small runtime {small * 1000:.2f} ms, runtime with "
                    f"{finished:,} finished {big * 1000:.2f} ms, ratio {big / small:.1f}x"
                )
        finally:
            await conn.close()
    finally:
        await drop()


async def measure_janitor(runtimes: int, per_runtime: int, passes: int, interval: float) -> None:
    from bench.gateways import make_settings, running_gateway

    url, drop = await scratch_database()
    try:
        conn = await asyncpg.connect(url)
        try:
            started = time.monotonic()
            await conn.execute(
                """
                INSERT INTO tasks (runtime_id, payload, run_at, created_at, updated_at)
                SELECT 'rt-' || lpad(r::text, 6, '0'), '{}'::jsonb,
                       now() - interval '1 minute', now() - interval '1 minute',
                       now() - interval '1 minute'
                  FROM generate_series(1, $1) AS r, generate_series(1, $2) AS k
                """,
                runtimes,
                per_runtime,
            )
            await conn.execute("VACUUM ANALYZE tasks")
            print(
                f"loaded {runtimes:,} runtimes x {per_runtime} queued tasks in "
                f"{time.monotonic() - started:.1f} s"
            )
        finally:
            await conn.close()
        redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        settings = make_settings(
            url, redis_url, "gwscale" + secrets.token_hex(4), janitor_interval_seconds=3600.0
        )
        async with running_gateway(settings) as gw:
            janitor = gw.gateway.janitor
            while not janitor.is_leader:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            for n in range(passes):
                await asyncio.sleep(interval)  # as the loop waits between passes
                started = time.perf_counter()
                report = await janitor.run_once()
                took = time.perf_counter() - started
                steps = getattr(report, "seconds", {})
                shown = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in steps.items())
                print(
                    f"pass {n + 1}: {took * 1000:.0f} ms; woke {len(report.woken):,} runtimes"
                    + (f"; {shown}" if shown else "")
                )
    finally:
        await drop()


async def measure_drain(tasks: int, completers: int, rounds: int) -> None:
    url, drop = await scratch_database()
    try:
        conn = await asyncpg.connect(url)
        pool = await asyncpg.create_pool(url, min_size=completers, max_size=completers)
        try:
            rates: dict[str, list[float]] = {"triggers on": [], "triggers off": []}
            for n in range(rounds):
                for label in (
                    ("triggers on", "triggers off")
                    if n % 2 == 0
                    else (
                        "triggers off",
                        "triggers on",
                    )
                ):
                    switch = "ENABLE" if label == "triggers on" else "DISABLE"
                    await conn.execute(f"ALTER TABLE tasks {switch} TRIGGER task_counts_moved")
                    await conn.execute("TRUNCATE tasks")
                    rows = await conn.fetch(
                        """
                        INSERT INTO tasks (runtime_id, status, payload, attempts, lease_id,
                                           lease_expires_at, worker_id)
                        SELECT 'drain', 'claimed', '{}'::jsonb, 1, gen_random_uuid(),
                               now() + interval '1 hour', 'w'
                          FROM generate_series(1, $1)
                        RETURNING id, lease_id
                        """,
                        tasks,
                    )
                    await conn.execute("VACUUM ANALYZE tasks")
                    todo = [(r["id"], r["lease_id"]) for r in rows]

                    async def completer(mine: list[tuple[Any, Any]]) -> None:
                        async with pool.acquire() as c:
                            for task_id, lease_id in mine:
                                await c.execute(lease_sql.COMPLETE, task_id, lease_id, None)

                    started = time.perf_counter()
                    await asyncio.gather(
                        *(completer(todo[i::completers]) for i in range(completers))
                    )
                    rate = tasks / (time.perf_counter() - started)
                    rates[label].append(rate)
                    done = await conn.fetchval(
                        "SELECT count(*) FROM tasks WHERE status = 'completed'"
                    )
                    assert done == tasks, done
            for label, found in rates.items():
                shown = ", ".join(f"{r:,.0f}" for r in found)
                print(f"{label}: {statistics.median(found):,.0f} completions/s (rounds: {shown})")
            on, off = (statistics.median(rates[k]) for k in ("triggers on", "triggers off"))
            print(f"with the triggers: {on / off:.2f}x the completion rate without")
        finally:
            await pool.close()
            await conn.close()
    finally:
        await drop()


async def measure_hotpath(tasks: int, clients: int, rounds: int) -> None:
    from gateway.api.requests import parse_enqueue
    from gateway.metrics import Metrics
    from gateway.store import Store

    url, drop = await scratch_database()
    conn = await asyncpg.connect(url)
    store = Store(url, Metrics(), min_size=clients, max_size=clients)
    await store.open()
    live_idx = await conn.fetchval("SELECT pg_get_indexdef('tasks_live_idx'::regclass)")
    req = parse_enqueue({"payload": {"n": 1}}, None, 1_000_000)
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for n in range(rounds):
            order = ("with", "without") if n % 2 == 0 else ("without", "with")
            for label in order:
                await conn.execute("TRUNCATE tasks")
                await conn.execute("DROP INDEX IF EXISTS tasks_live_idx")
                if label == "with":
                    await conn.execute(live_idx)
                runtimes = [f"rt-{i}" for i in range(clients)]

                async def enqueuer(runtime_id: str) -> None:
                    for _ in range(tasks // clients):
                        await store.enqueue(runtime_id, req)

                async def claimer(runtime_id: str) -> None:
                    for _ in range(tasks // clients):
                        await store.claim(runtime_id, ["w"], [60.0])

                for kind, fn in (("enqueue", enqueuer), ("claim", claimer)):
                    started = time.perf_counter()
                    await asyncio.gather(*(fn(rt) for rt in runtimes))
                    rate = (tasks // clients * clients) / (time.perf_counter() - started)
                    rates.setdefault((kind, label), []).append(rate)
        for kind in ("enqueue", "claim"):
            with_, without = (statistics.median(rates[kind, x]) for x in ("with", "without"))
            print(
                f"{kind}: {with_:,.0f}/s with tasks_live_idx, {without:,.0f}/s without "
                f"({with_ / without:.2f}x); rounds with "
                + ", ".join(f"{r:,.0f}" for r in rates[kind, "with"])
                + "; without "
                + ", ".join(f"{r:,.0f}" for r in rates[kind, "without"])
            )
    finally:
        await store.close()
        await conn.close()
        await drop()


async def measure_results(tasks: int, completers: int, rounds: int) -> None:
    """Completions per second through the HTTP API, with the wake-up publish for waits on
    a task's result (results.py) and without it, alternating, in one run."""
    from bench.gateways import make_settings, running_gateway

    url, drop = await scratch_database()
    redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = make_settings(
        url, redis_url, "gwscale" + secrets.token_hex(4), janitor_interval_seconds=3600
    )
    rates: dict[str, list[float]] = {}

    async def skip_publish(finished: Any) -> None:
        return None

    try:
        async with running_gateway(settings) as gw:
            results = gw.gateway.results
            publish = results.finished
            for n in range(rounds):
                order = ("with", "without") if n % 2 == 0 else ("without", "with")
                for label in order:
                    runtime_id = f"rt-{n}-{label}"
                    for first in range(0, tasks, 1000):
                        items = [{"payload": i} for i in range(first, min(tasks, first + 1000))]
                        await gw.call(
                            "POST", f"/v1/runtimes/{runtime_id}/tasks:batch", {"tasks": items}
                        )
                    leased: list[dict[str, Any]] = []
                    while got := await gw.claim(runtime_id, "w", max_tasks=100):
                        leased.extend(got)
                    results.finished = publish if label == "with" else skip_publish  # type: ignore[method-assign,assignment]

                    async def completer(share: list[dict[str, Any]]) -> None:
                        for task in share:
                            status, _ = await gw.complete(task, result=1)
                            assert status == 200

                    shares = [leased[i::completers] for i in range(completers)]
                    started = time.perf_counter()
                    await asyncio.gather(*(completer(share) for share in shares))
                    rates.setdefault(label, []).append(
                        len(leased) / (time.perf_counter() - started)
                    )
            with_, without = (statistics.median(rates[x]) for x in ("with", "without"))
            print(
                f"complete: {with_:,.0f}/s with the result publish, {without:,.0f}/s without "
                f"({with_ / without:.2f}x); rounds with "
                + ", ".join(f"{r:,.0f}" for r in rates["with"])
                + "; without "
                + ", ".join(f"{r:,.0f}" for r in rates["without"])
            )
    finally:
        await drop()


async def measure_controls(tasks: int, clients: int, rounds: int) -> None:
    from gateway.api.requests import parse_enqueue
    from gateway.metrics import Metrics
    from gateway.rows import ControlsChange
    from gateway.store import Store

    url, drop = await scratch_database()
    conn = await asyncpg.connect(url)
    store = Store(url, Metrics(), min_size=clients, max_size=clients)
    await store.open()
    req = parse_enqueue({"payload": {"n": 1}}, None, 1_000_000)
    rates: dict[str, list[float]] = {}
    try:
        for n in range(rounds):
            order = ("unlimited", "limited") if n % 2 == 0 else ("limited", "unlimited")
            for label in order:
                await conn.execute("TRUNCATE tasks, runtime_controls")
                runtime_id = f"rt-{label}-{n}"
                if label == "limited":
                    await store.set_controls(
                        runtime_id, ControlsChange(max_in_flight=100_000, sets_max_in_flight=True)
                    )
                await store.enqueue_batch(runtime_id, [req] * tasks)

                async def claimer(runtime_id: str, limited: bool) -> None:
                    for _ in range(tasks // clients):
                        if limited:
                            await store.claim_limited(runtime_id, ["w"], [60.0])
                        else:
                            await store.claim(runtime_id, ["w"], [60.0])

                started = time.perf_counter()
                limited = label == "limited"
                await asyncio.gather(*(claimer(runtime_id, limited) for _ in range(clients)))
                rate = (tasks // clients * clients) / (time.perf_counter() - started)
                rates.setdefault(label, []).append(rate)
        unlimited_rate, limited_rate = (
            statistics.median(rates[x]) for x in ("unlimited", "limited")
        )
        print(
            f"claims of one runtime by {clients} concurrent caller(s): "
            f"{unlimited_rate:,.0f}/s without controls, {limited_rate:,.0f}/s with a "
            f"max_in_flight ({limited_rate / unlimited_rate:.2f}x); rounds "
            "without "
            + ", ".join(f"{r:,.0f}" for r in rates["unlimited"])
            + "; with "
            + ", ".join(f"{r:,.0f}" for r in rates["limited"])
        )
    finally:
        await store.close()
        await conn.close()
        await drop()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.measure", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    stats = sub.add_parser("stats", help="stats on a long history against a small runtime")
    stats.add_argument("--finished", type=int, default=1_000_000)
    janitor = sub.add_parser("janitor", help="janitor pass durations with many runtimes")
    janitor.add_argument("--runtimes", type=int, default=100_000)
    janitor.add_argument("--per-runtime", type=int, default=10)
    janitor.add_argument("--passes", type=int, default=5)
    janitor.add_argument(
        "--interval", type=float, default=5.0, help="seconds between passes (the default's)"
    )
    drain = sub.add_parser("drain", help="completion rate with and without the count triggers")
    drain.add_argument("--tasks", type=int, default=20_000)
    drain.add_argument("--completers", type=int, default=8)
    drain.add_argument("--rounds", type=int, default=3)
    hotpath = sub.add_parser("hotpath", help="enqueue and claim rates with and without the index")
    hotpath.add_argument("--tasks", type=int, default=5000)
    hotpath.add_argument("--clients", type=int, default=8)
    hotpath.add_argument("--rounds", type=int, default=3)
    results = sub.add_parser("results", help="completion rate with and without result wake-ups")
    results.add_argument("--tasks", type=int, default=2000)
    results.add_argument("--completers", type=int, default=8)
    results.add_argument("--rounds", type=int, default=3)
    controls = sub.add_parser("controls", help="claim rates with and without runtime controls")
    controls.add_argument("--tasks", type=int, default=3000)
    controls.add_argument("--clients", type=int, default=4)
    controls.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "stats":
        asyncio.run(measure_stats(args.finished))
    elif args.what == "janitor":
        asyncio.run(measure_janitor(args.runtimes, args.per_runtime, args.passes, args.interval))
    elif args.what == "drain":
        asyncio.run(measure_drain(args.tasks, args.completers, args.rounds))
    elif args.what == "results":
        asyncio.run(measure_results(args.tasks, args.completers, args.rounds))
    elif args.what == "controls":
        asyncio.run(measure_controls(args.tasks, args.clients, args.rounds))
    else:
        asyncio.run(measure_hotpath(args.tasks, args.clients, args.rounds))


if __name__ == "__main__":
    main()
