"""`--scenario scale`: what each operation costs as the task table grows.

One gateway (its janitor on, at the default interval, so that retention and the other
janitor duties run while it is measured) on one fresh database. Each operation is first
measured on small runtimes (the baseline), then the table is grown to each
`--scale-sizes` step with one `INSERT ... SELECT generate_series` per shape, analyzed,
and everything measured again:

- delayed: N delayed tasks of priority 100 (ahead of the due ones) in runtime
  `scale-delayed`; measured: a claim right after enqueueing one due task there;
- finished: N completed tasks in runtime `scale-finished`; measured: its stats;
- runtimes: N queued tasks over N/10 runtimes (at most 100,000); measured: one janitor
  pass (`Janitor.run_once()` in this process, on the same database);
- table: enqueue and claim in a runtime of their own on a table of 3N rows.

Then, when `--scale-table-rows` is larger than the shapes' 3N rows, the table is grown
to it with history: completed tasks over 10,000 runtimes, finished over the last
fortnight, so that about half of them are past the default retention (7 days) and the
gateway's janitor is deleting them while everything is measured once more.

Each step is keyed by the rows in the table (0: the baseline, before any load). The
rows are valid for the schema's checks; delayed rows take the status `scheduled` when
the schema has it, `queued` otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from gateway.janitor import REPAIR_PAGES_PER_PASS

from . import client
from .burst import burst_step
from .client import Api, Tally
from .infra import Servers, log, serving
from .scenarios import check_tally, finish
from .stats import Result, ms, percentile

JANITOR_BATCH_SIZE = 1000  # the gateway's default GATEWAY_JANITOR_BATCH_SIZE

OPERATIONS = (
    "claim after enqueue, delayed ahead",
    "stats, finished tasks",
    "janitor pass",
    "enqueue",
    "claim",
)
MAX_RUNTIMES = 100_000
JANITOR_PASS_TIMEOUT_SECONDS = 120.0
# Passes timed at each step. The first of a fresh janitor also counts the queue depth
# (every live row; after that at most a tenth of the janitor's time): the median of five
# is the bounded pass, and the per-step medians show where the time goes.
JANITOR_PASSES = 5
SLOW_PASS_SECONDS = 10.0
MIN_SAMPLES = 5
REQUEST_TIMEOUT_SECONDS = 30.0
LOAD_TIMEOUT_SECONDS = 900.0  # one shape's rows at the largest size, on a busy machine


async def _delayed_status(conn: asyncpg.Connection) -> str:
    """`scheduled` when the task table's status check allows it, else `queued`."""
    defs = await conn.fetch(
        "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint "
        "WHERE conrelid = 'tasks'::regclass AND contype = 'c'"
    )
    return "scheduled" if any("'scheduled'" in r["d"] for r in defs) else "queued"


async def _load_bare(
    conn: asyncpg.Connection,
    rows: str,
    rows_args: tuple[Any, ...],
    counts: str,
    counts_args: tuple[Any, ...],
) -> None:
    """Rows inserted with the triggers off, as a restore loads them, and their counts
    then written as migration 0005's backfill writes them (folded: backend 0), in one
    transaction. `counts` selects (runtime_id, status, n), one row per pair."""
    async with conn.transaction():
        await conn.execute("SET LOCAL session_replication_role = replica")
        await conn.execute(rows, *rows_args, timeout=LOAD_TIMEOUT_SECONDS)
        if await conn.fetchval("SELECT to_regclass('task_counts') IS NOT NULL"):
            await conn.execute(
                "INSERT INTO task_counts (runtime_id, status, backend, n) "
                "SELECT c.runtime_id, c.status, 0, c.n "
                f"FROM ({counts}) AS c (runtime_id, status, n) "
                "ON CONFLICT (runtime_id, status, backend) "
                "DO UPDATE SET n = task_counts.n + EXCLUDED.n",
                *counts_args,
                timeout=LOAD_TIMEOUT_SECONDS,
            )


async def load(conn: asyncpg.Connection, start: int, end: int, status: str) -> float:
    """Rows start+1..end of each shape; seconds taken."""
    t0 = time.perf_counter()
    runtimes = max(1, min(MAX_RUNTIMES, end // 10))
    await conn.execute(
        "INSERT INTO tasks (runtime_id, status, priority, payload, run_at) "
        "SELECT 'scale-delayed', $3, 100, '{\"bulk\": true}'::jsonb, now() + interval '1 day' "
        "FROM generate_series($1::int + 1, $2::int)",
        start,
        end,
        status,
        timeout=LOAD_TIMEOUT_SECONDS,
    )
    # Finished rows in bulk, as a restore loads them. (Through the insert trigger, once
    # per statement since migration 0011, the load is linear too; the bulk-insert
    # scenario measures it.)
    await _load_bare(
        conn,
        "INSERT INTO tasks (runtime_id, status, payload, attempts, finished_at, result) "
        "SELECT 'scale-finished', 'completed', '{\"bulk\": true}'::jsonb, 1, now(), "
        "'{\"ok\": true}'::jsonb FROM generate_series($1::int + 1, $2::int)",
        (start, end),
        "SELECT 'scale-finished', 'completed', $1::bigint",
        (end - start,),
    )
    # The queued rows over many runtimes in bulk too. The history trigger would write a
    # row per runtime into the current bucket, which the janitor folds once the bucket
    # ends: 100,000 of them at the 10^6 step, ten batches a pass for ten passes. When a
    # bucket ended while a step was measured (one run in three or four), its janitor
    # passes timed that fold (600 ms, against 50 ms), not the pass the target bounds. A
    # table that grew over time has had those folded as each bucket ended.
    await _load_bare(
        conn,
        "INSERT INTO tasks (runtime_id, payload) "
        "SELECT 'scale-rt-' || (g % $3::int), '{\"bulk\": true}'::jsonb "
        "FROM generate_series($1::int + 1, $2::int) AS g",
        (start, end, runtimes),
        "SELECT 'scale-rt-' || (g % $3::int), 'queued', count(*) "
        "FROM generate_series($1::int + 1, $2::int) AS g GROUP BY 1",
        (start, end, runtimes),
    )
    await settle(conn)
    return time.perf_counter() - t0


async def settle(conn: asyncpg.Connection) -> None:
    """After a bulk load, what a table that grew over time already has: its statistics,
    its visibility map (index-only scans), its pages on disk. Without it autovacuum and
    the checkpointer take the load on during the next measurement."""
    await conn.execute("VACUUM (ANALYZE) tasks", timeout=LOAD_TIMEOUT_SECONDS)
    try:
        await conn.execute("CHECKPOINT", timeout=LOAD_TIMEOUT_SECONDS)
    except asyncpg.InsufficientPrivilegeError:
        log("scale: CHECKPOINT needs a superuser or pg_checkpoint; measuring without it")


HISTORY_RUNTIMES = 10_000
HISTORY_DAYS = 14  # twice the default retention: about half the history is past it


async def load_history(conn: asyncpg.Connection, rows: int) -> float:
    """`rows` completed tasks (rounded down to a multiple of HISTORY_RUNTIMES), round
    robin over HISTORY_RUNTIMES runtimes, finished over the last HISTORY_DAYS days,
    loaded as `load` loads finished rows; seconds taken.

    Rows go in the order of their ids and finish times, which are made to ascend
    together, so that the load appends to those two indexes instead of writing all
    over them (twice as fast here). The ids are version 4 UUIDs from a counter."""
    t0 = time.perf_counter()
    per = rows // HISTORY_RUNTIMES
    await _load_bare(
        conn,
        "INSERT INTO tasks (id, runtime_id, status, payload, attempts, finished_at, result) "
        "SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, "
        "'scale-history-' || (g % $1::int), 'completed', '{\"bulk\": true}'::jsonb, 1, "
        "now() - make_interval(secs => ($2::bigint - g) * ($3::int * 86400.0) / $2), "
        "'{\"ok\": true}'::jsonb "
        "FROM generate_series(1, $2::bigint) AS g",
        (HISTORY_RUNTIMES, per * HISTORY_RUNTIMES, HISTORY_DAYS),
        "SELECT 'scale-history-' || r, 'completed', $2::bigint "
        "FROM generate_series(0, $1::int - 1) AS r",
        (HISTORY_RUNTIMES, per),
    )
    await settle(conn)
    return time.perf_counter() - t0


async def _janitor_passes(
    database_url: str, redis_url: str, prefix: str, token: str, n: int
) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds of `n` janitor passes run in this process against the database, and of
    each of their steps (by step name)."""
    from gateway.instance import Gateway
    from gateway.settings import Settings

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GATEWAY_REDIS_PREFIX": prefix,
        "GATEWAY_ADMIN_TOKEN": token,
        "GATEWAY_JANITOR_INTERVAL_SECONDS": "3600",
        # The served gateway's janitor runs the VACUUM after a burst; these passes,
        # timed for their bounded steps, leave it to that one.
        "GATEWAY_JANITOR_VACUUM_DEAD_ROWS": "0",
    }
    gw = Gateway(Settings.from_env(env))
    await gw.open()
    out = []
    steps: dict[str, list[float]] = {}
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            async with asyncio.timeout(JANITOR_PASS_TIMEOUT_SECONDS):
                report = await gw.janitor.run_once()
            out.append(time.perf_counter() - t0)
            for step, seconds in report.seconds.items():
                steps.setdefault(step, []).append(seconds)
            if out[-1] > SLOW_PASS_SECONDS:
                break  # one slow pass says enough, and keeps the run within its time
    finally:
        await gw.close()
    return out, steps


async def _measure(
    api: Api, opts: argparse.Namespace, tallies: dict[str, Tally]
) -> dict[str, list[float]]:
    """`--scale-samples` timings of each HTTP operation, in seconds."""
    got: dict[str, list[float]] = {op: [] for op in OPERATIONS if op != "janitor pass"}
    claim = {"worker_id": "scale", "wait_seconds": 0, "max_tasks": 1}
    stop_at = time.perf_counter() + opts.scale_seconds
    for i in range(opts.scale_samples):
        if i >= MIN_SAMPLES and time.perf_counter() > stop_at:
            break  # slow operations: fewer samples, so that the run keeps to its time
        t = await api.post("/v1/runtimes/scale-delayed/tasks", {"payload": {"i": i}}, tallies["e"])
        if t is not None and t[0] == 201:
            t0 = time.perf_counter()
            c = await api.post("/v1/runtimes/scale-delayed/claim", claim, tallies["c"])
            got[OPERATIONS[0]].append(time.perf_counter() - t0)
            await _complete(api, c, tallies["d"])
        t0 = time.perf_counter()
        try:
            async with api.session.get(
                api.base_url + "/v1/runtimes/scale-finished/stats",
                headers=api.headers,
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
            ) as resp:
                body = await resp.read()
                tallies["s"].record(resp.status, time.perf_counter() - t0, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            tallies["s"].failed(exc)
        got[OPERATIONS[1]].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        t = await api.post("/v1/runtimes/scale-fresh/tasks", {"payload": {"i": i}}, tallies["e"])
        got[OPERATIONS[3]].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        c = await api.post("/v1/runtimes/scale-fresh/claim", claim, tallies["c"])
        got[OPERATIONS[4]].append(time.perf_counter() - t0)
        await _complete(api, c, tallies["d"])
    return got


async def _complete(api: Api, claimed: tuple[int, Any] | None, tally: Tally) -> None:
    for task in ((claimed or (0, {}))[1] or {}).get("tasks") or []:
        await api.post(f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"]}, tally)


async def scale(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    shapes = sorted(opts.scale_sizes)
    # (rows of each shape, rows of history) at each step; the baseline loads nothing.
    steps = [(0, 0)] + [(n, 0) for n in shapes]
    history = (opts.scale_table_rows - 3 * shapes[-1]) // HISTORY_RUNTIMES * HISTORY_RUNTIMES
    if history > 0:
        steps.append((shapes[-1], history))
    timings: dict[str, dict[int, list[float]]] = {op: {} for op in OPERATIONS}
    tallies = {k: Tally() for k in "ecds"}
    notes: list[str] = []
    failures: list[str] = []
    load_seconds: dict[int, float] = {}
    shape_rows: list[int] = []
    janitor_steps: dict[int, dict[str, float | None]] = {}
    runtimes: list[int] = []
    burst: Result | None = None
    async with (
        serving(opts, servers, workdir / "scale.log") as (proc, db),
        client.session(8) as http,
    ):
        api = Api(http, proc.url, proc.token)
        conn = await asyncpg.connect(db, timeout=10)
        try:
            status = await _delayed_status(conn)
            loaded = loaded_history = 0
            for size, hist in steps:
                rows = 3 * size + hist
                t = 0.0
                if size > loaded:
                    log(f"scale: loading rows {loaded + 1:,}..{size:,} of each shape")
                    t += await load(conn, loaded, size, status)
                    loaded = size
                if hist > loaded_history:
                    log(f"scale: loading {hist:,} rows of history (completed, half past retention)")
                    t += await load_history(conn, hist)
                    loaded_history = hist
                if t:
                    load_seconds[rows] = round(t, 2)
                shape_rows.append(size)
                runtimes.append(max(1, min(MAX_RUNTIMES, size // 10)) if size else 0)
                log(f"scale: measuring on {rows:,} rows ({size:,} of each shape)")
                for op, values in (await _measure(api, opts, tallies)).items():
                    timings[op][rows] = values
                try:
                    passes, pass_steps = await _janitor_passes(
                        db, servers.redis_url, proc.prefix, proc.token, JANITOR_PASSES
                    )
                    timings["janitor pass"][rows] = passes
                    janitor_steps[rows] = {k: ms(percentile(v, 50)) for k, v in pass_steps.items()}
                except Exception as exc:
                    notes.append(f"janitor pass on {rows:,} rows: {type(exc).__name__}: {exc}")
            if loaded_history:
                left = await conn.fetchval(
                    "SELECT count(*) FROM tasks WHERE runtime_id LIKE 'scale-history-%'",
                    timeout=LOAD_TIMEOUT_SECONDS,
                )
                notes.append(
                    f"retention deleted {loaded_history - left:,} of the {loaded_history:,} "
                    "rows of history while the last step was measured; the janitor pass "
                    "there includes that deleting (at most 10 batches of 1,000 rows a "
                    "pass), so the janitor target compares the steps before it"
                )
            if opts.scale_burst:
                rows = 3 * loaded + loaded_history + opts.scale_burst
                log(f"scale: burst step on {rows:,} rows")
                try:
                    burst = await burst_step(api, conn, db, opts.scale_burst, tallies)
                except Exception as exc:
                    burst = Result("scale", "burst")
                    burst.failures.append(f"burst step: {type(exc).__name__}: {exc}")
                burst.numbers["table_rows"] = rows
        finally:
            await conn.close()
        probe = Result("scale", "all")
        finish(probe, proc)
        failures += probe.failures
    results = []
    for op in OPERATIONS:
        r = Result("scale", op)
        by_size = timings[op]
        base = percentile(by_size.get(0, []), 50)
        r.numbers = {
            "delayed_status": status,
            "sizes": sorted(by_size),
            "p50_ms": [ms(percentile(by_size[s], 50)) for s in sorted(by_size)],
            "p99_ms": [ms(percentile(by_size[s], 99)) for s in sorted(by_size)],
            "x_baseline_p50": [
                None if not base else round((percentile(by_size[s], 50) or 0) / base, 2)
                for s in sorted(by_size)
            ],
            "load_seconds": load_seconds,
            "shape_rows": shape_rows,
            "runtimes": runtimes,
            # The runtimes one pass's repair walk visits: below that, a pass grows with
            # the runtimes; from there on it is bounded.
            "walk_runtimes": REPAIR_PAGES_PER_PASS * JANITOR_BATCH_SIZE,
            # The median of each step of the janitor's passes, by table rows (ms).
            "janitor_step_p50_ms": janitor_steps if op == "janitor pass" else None,
        }
        results.append(r)
    first = results[0]
    first.notes += notes
    first.failures += failures
    for name, key in (("enqueue", "e"), ("claim", "c"), ("complete", "d"), ("stats", "s")):
        check_tally(first, name, tallies[key])
    if burst is not None:
        results.append(burst)
    return results
