"""`--scenario schedules`: whether 10,000 schedules tick on time, and exactly once.

One gateway, as it ships. Over `--schedule-connections` (32) connections, the harness
creates `--schedules` (10,000) schedules spread over 1,000 runtimes with `PUT
/v1/runtimes/{rt}/schedules/{name}` (`every_seconds` 10, `overlap: allow`, jitter 0),
lets them tick for `--schedule-seconds` (40), then waits until every tick of that
window is decided (recorded in `schedule_ticks`, as a task or a skip), at most
SETTLE_LIMIT_SECONDS, before anything is counted. Meanwhile `--schedule-workers` (4)
workers drain the tasks: each walks its share of the runtimes, claims up to MAX_TASKS
tasks of each (`wait_seconds` 0) and completes them in one `POST /v1/tasks:complete`;
ten 10 s schedules on each of 1,000 runtimes are 1,000 tasks/s.

Every figure is read from Postgres afterwards, not from the gateway:

- lag: when a task became claimable, the later of its `created_at` (the insert's
  clock) and its `run_at` (its tick's time, as jitter is 0), minus its `scheduled_for`
  (its tick's time), over every tick of the window. A tick decided ahead of its time
  (overlap allow, up to 2 s ahead) has lag 0: its task waits, stored, until its tick;
  `decided_ahead_share` is the share of such ticks;
- ticks expected against made: each schedule's ticks from its first (its PUT's
  `next_run_at`) to the window's end, every 10 s, against its tasks and
  the skips recorded in `schedule_ticks`; a tick with neither is a silent gap;
- duplicates: tasks beyond the first with the same (runtime, schedule,
  `scheduled_for`); the guarantee is none;
- the tick pass's Postgres cost: each tick's write span, from its first task's insert
  to its last (all 10,000 schedules share a tick, so this is the passes that tick
  took), beside the gateway's own `gateway_schedule_lag_seconds` and
  `gateway_schedule_pass_seconds` (the passes that found schedules due: how many, and
  their mean).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from . import client
from .client import Api, Tally
from .infra import Servers, log, log_name, serving
from .scenarios import HANG_GRACE_SECONDS, RETRY_PAUSE_SECONDS, check_tally, finish
from .stats import Result, percentile

RUNTIMES = 1_000
EVERY_SECONDS = 10
MAX_TASKS = 10
# After the window, how long the window's ticks may take to be decided. Past the
# schedules' catch_up_seconds (60 by default) a live tick pass has decided every one,
# as a task or as skipped_late: one still missing then is a silent gap.
SETTLE_LIMIT_SECONDS = 90.0
SETTLE_POLL_SECONDS = 0.5
# A worker whose whole walk found nothing rests this long before the next one.
IDLE_PAUSE_SECONDS = 0.2
LAG_BUCKET = 'gateway_schedule_lag_seconds_bucket{le="1.0"}'
LAG_COUNT = "gateway_schedule_lag_seconds_count"
PASS_COUNT = "gateway_schedule_pass_seconds_count"
PASS_SUM = "gateway_schedule_pass_seconds_sum"
TICKS_ENQUEUED = 'gateway_schedule_ticks_total{outcome="enqueued"}'

TICKS_DECIDED = "SELECT count(*) FROM schedule_ticks WHERE tick_at <= $1"
TASKS_OF_THE_WINDOW = """
SELECT runtime_id, schedule, scheduled_for,
       extract(epoch FROM greatest(created_at, run_at) - scheduled_for)::float8 AS lag,
       created_at < scheduled_for AS ahead
  FROM tasks
 WHERE schedule IS NOT NULL AND scheduled_for <= $1
"""
SKIPS_RECORDED = """
SELECT outcome, count(*) AS n
  FROM schedule_ticks
 WHERE tick_at <= $1 AND outcome <> 'enqueued'
 GROUP BY outcome
"""
# The tick pass's transactions: a tick row is written once (a backfill alone rewrites
# one), so its xmin names the transaction that decided it, and recorded_at (the
# statement's clock for that row) when.
TICK_BATCHES = """
SELECT tick_at, count(*) AS ticks,
       extract(epoch FROM min(recorded_at))::float8 AS first,
       extract(epoch FROM max(recorded_at))::float8 AS last
  FROM schedule_ticks
 WHERE tick_at <= $1 AND source = 'schedule'
 GROUP BY tick_at, xmin::text
 ORDER BY tick_at, first
"""
TASKS_BY_STATUS = "SELECT status, count(*) AS n FROM tasks GROUP BY status"
REFUSED = (429, 503)  # shed with Retry-After: sent again


def schedule_body(i: int) -> dict[str, Any]:
    """Schedule i's definition: every 10 s, every tick runs, none delayed."""
    return {
        "every_seconds": EVERY_SECONDS,
        "overlap": "allow",
        "jitter_seconds": 0,
        "payload": {"schedule": i},
    }


def schedule_paths(count: int) -> list[str]:
    """The schedules' paths, spread evenly over RUNTIMES runtimes."""
    return [
        f"/v1/runtimes/bench-sched-{i % RUNTIMES:04d}/schedules/every-10s-{i // RUNTIMES:03d}"
        for i in range(count)
    ]


def count_ticks(
    keys: list[tuple[str, str, datetime]], expected: int, skipped: int
) -> tuple[int, int, int]:
    """From the tasks' (runtime, schedule, tick time): the ticks made (distinct keys),
    the duplicates (tasks beyond the first of a key), and the silent gaps (ticks
    expected with neither a task nor one of the `skipped` recorded)."""
    made = len(set(keys))
    return made, len(keys) - made, max(expected - made - skipped, 0)


def expected_ticks(first_ticks: list[datetime], end: datetime) -> int:
    """The ticks due by `end` of schedules ticking every EVERY_SECONDS from each of
    `first_ticks` (their first tick, as their PUT answered it)."""
    return sum(
        int((end - first).total_seconds() // EVERY_SECONDS) + 1
        for first in first_ticks
        if first <= end
    )


async def _create(api: Api, paths: list[str], connections: int, tally: Tally) -> list[datetime]:
    """PUT every schedule; the first tick of each one created (its `next_run_at`)."""
    pending = list(enumerate(paths))
    pending.reverse()
    first_ticks: list[datetime] = []

    async def one() -> None:
        while pending:
            i, path = pending.pop()
            got = await api.send("PUT", path, schedule_body(i), tally)
            if got is not None and got[0] in REFUSED:
                # Shed under load (a busy machine): a PUT is idempotent, so it is sent
                # again after a pause, as a well-behaved client does.
                pending.append((i, path))
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
            elif got is not None and got[0] == 201:
                first_ticks.append(datetime.fromisoformat(got[1]["next_run_at"]))

    await asyncio.gather(*(one() for _ in range(connections)))
    return first_ticks


class Drain:
    """The workers: claims in batches, completes in batches, until told to stop."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.stop = asyncio.Event()
        self.claims = Tally()
        self.completes = Tally()
        self.outcomes: Counter[str] = Counter()  # the completes' outcomes, per task

    async def worker(self, k: int, runtimes: list[str]) -> None:
        body = {"worker_id": f"bench-sched-{k}", "wait_seconds": 0, "max_tasks": MAX_TASKS}
        while not self.stop.is_set():
            found = 0
            for rt in runtimes:
                if self.stop.is_set():
                    return
                got = await self.api.post(f"/v1/runtimes/{rt}/claim", body, self.claims)
                if got is None or got[0] != 200:
                    await asyncio.sleep(RETRY_PAUSE_SECONDS)
                    continue
                tasks = (got[1] or {}).get("tasks") or []
                found += len(tasks)
                if tasks:
                    await self._complete(tasks)
            if not found:
                await asyncio.sleep(IDLE_PAUSE_SECONDS)

    async def _complete(self, tasks: list[dict[str, Any]]) -> None:
        items = [{"id": t.get("id"), "lease_id": t.get("lease_id")} for t in tasks]
        got = await self.api.post("/v1/tasks:complete", {"tasks": items}, self.completes)
        if got is None or got[0] != 200:
            return
        for item in (got[1] or {}).get("results", []):
            self.outcomes[str(item.get("outcome"))] += 1


async def _settle(database_url: str, first_ticks: list[datetime]) -> tuple[datetime, float]:
    """The window's end (the database's clock now), and how long its ticks then took
    to be decided, up to SETTLE_LIMIT_SECONDS."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        window_end: datetime = await conn.fetchval("SELECT clock_timestamp()")
        want = expected_ticks(first_ticks, window_end)
        started = time.perf_counter()
        while time.perf_counter() - started < SETTLE_LIMIT_SECONDS:
            if await conn.fetchval(TICKS_DECIDED, window_end) >= want:
                break
            await asyncio.sleep(SETTLE_POLL_SECONDS)
        return window_end, time.perf_counter() - started
    finally:
        await conn.close()


async def _read_back(
    database_url: str, window_end: datetime, first_ticks: list[datetime], result: Result
) -> dict[str, Any]:
    """The window's figures, from Postgres."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        tasks = await conn.fetch(TASKS_OF_THE_WINDOW, window_end)
        skips = {r["outcome"]: int(r["n"]) for r in await conn.fetch(SKIPS_RECORDED, window_end)}
        batches = [
            (r["tick_at"], int(r["ticks"]), float(r["first"]), float(r["last"]))
            for r in await conn.fetch(TICK_BATCHES, window_end)
        ]
        statuses = {r["status"]: int(r["n"]) for r in await conn.fetch(TASKS_BY_STATUS)}
    finally:
        await conn.close()
    lags = [float(r["lag"]) for r in tasks]
    want = expected_ticks(first_ticks, window_end)
    keys = [(r["runtime_id"], r["schedule"], r["scheduled_for"]) for r in tasks]
    made, dup, gaps = count_ticks(keys, want, sum(skips.values()))
    schedules = len(first_ticks)
    cost = pass_cost(batches, schedules)
    if dup:
        result.failures.append(f"{dup} duplicate tick(s): a tick made more than one task")
    if gaps:
        result.failures.append(
            f"{gaps} of {want:,} ticks have neither a task nor a recorded skip "
            f"{SETTLE_LIMIT_SECONDS:g} s after the window's end"
        )
    return {
        "schedules": schedules,
        "ticks_expected": want,
        "ticks_made": made,
        "ticks_skipped": skips,
        "silent_gaps": gaps,
        "duplicate_ticks": dup,
        "decided_ahead_share": round(sum(1 for r in tasks if r["ahead"]) / len(tasks), 4)
        if tasks
        else None,
        "lag_p50_ms": _ms(percentile(lags, 50)),
        "lag_p99_ms": _ms(percentile(lags, 99)),
        "lag_max_ms": _ms(max(lags) if lags else None),
        **cost,
        "tasks_by_status_at_end": statuses,
    }


def pass_cost(batches: list[tuple[datetime, int, float, float]], schedules: int) -> dict[str, Any]:
    """The tick pass's Postgres cost, from its transactions (tick time, ticks written,
    first and last row's clock in epoch seconds, in order): over the ticks every
    schedule had (after the last PUT; the earlier ones are partial), the transactions
    each took, the time from the first row written to the last (`tick_write`), the time
    inside the recording statements (first row to last of each transaction, summed)
    and what the rest of it is per transaction (`between_batches`: the next batch's
    select, the advance, the commit, the Redis announcements, the pass's pause)."""
    by_tick: dict[datetime, list[tuple[int, float, float]]] = {}
    for tick, n, first, last in batches:
        by_tick.setdefault(tick, []).append((n, first, last))
    full = [b for b in by_tick.values() if sum(n for n, _, _ in b) >= schedules]
    writes = [max(x[2] for x in b) - min(x[1] for x in b) for b in full]
    inside = [sum(last - first for _, first, last in b) for b in full]
    per_batch = [i / len(b) for i, b in zip(inside, full, strict=True)]
    between = [
        (w - i) / (len(b) - 1) for w, i, b in zip(writes, inside, full, strict=True) if len(b) > 1
    ]
    return {
        "full_ticks": len(full),
        "batches_per_tick": max((len(b) for b in full), default=None),
        "tick_write_p50_ms": _ms(percentile(writes, 50)),
        "tick_write_max_ms": _ms(max(writes, default=None)),
        "insert_per_batch_p50_ms": _ms(percentile(per_batch, 50)),
        "between_batches_p50_ms": _ms(percentile(between, 50)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


async def schedules(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    result = Result("schedules", f"{opts.schedules:,} schedules")
    paths = schedule_paths(opts.schedules)
    runtimes = sorted({p.split("/")[3] for p in paths})
    log_path = workdir / log_name("schedules", "gateway")
    async with (
        serving(opts, servers, log_path) as (gw, database_url),
        client.session(opts.schedule_connections + opts.schedule_workers) as http,
    ):
        api = Api(http, gw.url, gw.token)
        drain = Drain(api)
        workers = [
            asyncio.create_task(drain.worker(k, runtimes[k :: opts.schedule_workers]))
            for k in range(opts.schedule_workers)
        ]
        puts = Tally()
        try:
            log(
                f"schedules: {opts.schedules:,} schedules over {len(runtimes):,} runtimes, "
                f"{opts.schedule_connections} connections"
            )
            started = time.perf_counter()
            first_ticks = await asyncio.wait_for(
                _create(api, paths, opts.schedule_connections, puts),
                opts.schedules / 10 + 60,
            )
            put_seconds = time.perf_counter() - started
            log(f"schedules: created in {put_seconds:.1f} s; ticking {opts.schedule_seconds:g} s")
            await asyncio.sleep(opts.schedule_seconds)
            window_end, settle_seconds = await _settle(database_url, first_ticks)
        finally:
            drain.stop.set()
            if workers:
                _, late = await asyncio.wait(workers, timeout=HANG_GRACE_SECONDS)
                for task in late:
                    task.cancel()
        metrics = await client.scrape(http, gw.url)
        result.numbers.update(await _read_back(database_url, window_end, first_ticks, result))
        lagged = metrics.get(LAG_COUNT) or 0.0
        passes = metrics.get(PASS_COUNT) or 0.0
        result.numbers.update(
            put_seconds=round(put_seconds, 2),
            puts_per_second=round(opts.schedules / put_seconds, 1) if put_seconds else None,
            window_seconds=opts.schedule_seconds,
            settle_seconds=round(settle_seconds, 1),
            workers=opts.schedule_workers,
            tasks_completed=drain.outcomes["completed"],
            gateway_ticks_enqueued=int(metrics.get(TICKS_ENQUEUED, 0.0)),
            gateway_lag_within_1s_share=(
                round(metrics.get(LAG_BUCKET, 0.0) / lagged, 4) if lagged else None
            ),
            gateway_passes=int(passes),
            gateway_pass_mean_ms=(_ms(metrics.get(PASS_SUM, 0.0) / passes) if passes else None),
        )
        check_tally(result, "put schedule", puts)
        check_tally(result, "claim", drain.claims)
        check_tally(result, "complete", drain.completes)
        created = puts.statuses.get(201, 0)
        if created != opts.schedules:
            result.failures.append(f"{created:,} of {opts.schedules:,} PUTs answered 201")
        finish(result, gw)
    return [result]
