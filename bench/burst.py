"""The scale scenario's burst step: what an operator sees after a burst of completions.

The scale steps before it settle the table with `VACUUM (ANALYZE)` after each load, which
isolates growth. This step shows the other case. One runtime, `scale-burst`, is given
`--scale-burst` queued tasks (settled like the other loads, so that the table is clean
before the burst); then the gateway's own statements claim and complete every one of
them: `Store.claim` in batches of BURST_BATCH, each batch completed by
`Store.complete_group`, the statement the gateway's completes run. The bench runs no
VACUUM or ANALYZE from then on: whatever cleans up is the gateway (its janitor) or
Postgres (autovacuum, with the table's own settings).

Then, once a second for BURST_WATCH_SECONDS, it times over HTTP:

- a claim right after enqueueing one task (then its complete), and the stats, on the
  burst runtime and on a quiet one (`scale-fresh`, which has had no burst), so that
  both see the same requests; which of the two goes first alternates from one sample
  to the next, the burst runtime first in the first.

The first claim and the first stats after the burst are reported on their own: they are
what a worker's next poll and a dashboard's next read wait for. The burst runtime is
judged against the quiet one on the medians of the samples in the last
BURST_JUDGE_SECONDS of the watch, i.e. at about 90 s after the burst.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import aiohttp
import asyncpg

from gateway.metrics import Metrics
from gateway.store import Store

from .client import Api, Tally, scrape
from .infra import log
from .stats import Result, ms, percentile

BURST_RUNTIME = "scale-burst"
QUIET_RUNTIME = "scale-fresh"
BURST_BATCH = 1000  # tasks per claim and per grouped complete
BURST_LEASE_SECONDS = 600.0
BURST_WATCH_SECONDS = 90.0
BURST_JUDGE_SECONDS = 15.0  # the last part of the watch that the targets judge
BURST_SAMPLE_SECONDS = 1.0
REQUEST_TIMEOUT_SECONDS = 30.0
LOAD_TIMEOUT_SECONDS = 900.0
# Bounds the burst itself: past this the step stops completing and reports what it did.
BURST_MAX_SECONDS = 300.0

# Vacuums and analyzes of the task table, and whether one is running now: the watch
# shows when the cleanup came (the gateway's janitor runs a plain VACUUM, autovacuum
# its own).
TABLE_ACTIVITY = """
SELECT s.n_dead_tup, s.vacuum_count, s.autovacuum_count, s.analyze_count,
       s.autoanalyze_count,
       (SELECT count(*) FROM pg_stat_progress_vacuum p WHERE p.relid = s.relid) AS vacuuming
  FROM pg_stat_user_tables s
 WHERE s.relid = 'tasks'::regclass
"""


async def load_burst(conn: asyncpg.Connection, rows: int) -> float:
    """`rows` queued tasks in BURST_RUNTIME, with the gateway's own ids; seconds taken."""
    t0 = time.perf_counter()
    await conn.execute(
        "INSERT INTO tasks (runtime_id, payload) "
        "SELECT $1, '{\"bulk\": true}'::jsonb FROM generate_series(1, $2::int)",
        BURST_RUNTIME,
        rows,
        timeout=LOAD_TIMEOUT_SECONDS,
    )
    return time.perf_counter() - t0


async def complete_burst(database_url: str, rows: int) -> tuple[int, float]:
    """Claims and completes the burst runtime's tasks through the gateway's Store, one
    batch of BURST_BATCH at a time, until none is left, `rows` are done or
    BURST_MAX_SECONDS have passed; (tasks completed, seconds taken)."""
    store = Store(database_url, Metrics(), min_size=1, max_size=2, statement_timeout_ms=60_000)
    await store.open()
    done = 0
    t0 = time.perf_counter()
    try:
        while done < rows and time.perf_counter() - t0 < BURST_MAX_SECONDS:
            want = min(BURST_BATCH, rows - done)
            leased, _ = await store.claim(
                BURST_RUNTIME, ["burst"] * want, [BURST_LEASE_SECONDS] * want
            )
            if not leased:
                break
            ids: list[uuid.UUID] = [x.task.id for x in leased]
            leases: list[uuid.UUID] = [x.task.lease_id for x in leased]  # type: ignore[misc]
            finished = await store.complete_group(ids, leases, [None] * len(ids))
            done += len(finished)
    finally:
        await store.close()
    return done, time.perf_counter() - t0


async def _timed_claim(api: Api, runtime_id: str, tallies: dict[str, Tally]) -> float | None:
    """Seconds of a claim right after enqueueing one task (the task is completed)."""
    claim = {"worker_id": "scale", "wait_seconds": 0, "max_tasks": 1}
    t = await api.post(f"/v1/runtimes/{runtime_id}/tasks", {"payload": {}}, tallies["e"])
    if t is None or t[0] != 201:
        return None
    t0 = time.perf_counter()
    c = await api.post(f"/v1/runtimes/{runtime_id}/claim", claim, tallies["c"])
    took = time.perf_counter() - t0
    for task in ((c or (0, {}))[1] or {}).get("tasks") or []:
        await api.post(
            f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"]}, tallies["d"]
        )
    return took


async def _timed_stats(api: Api, runtime_id: str, tally: Tally) -> float | None:
    t0 = time.perf_counter()
    try:
        async with api.session.get(
            f"{api.base_url}/v1/runtimes/{runtime_id}/stats",
            headers=api.headers,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
        ) as resp:
            body = await resp.read()
            tally.record(resp.status, time.perf_counter() - t0, body)
            return time.perf_counter() - t0 if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.failed(exc)
        return None


async def watch(
    api: Api, conn: asyncpg.Connection, tallies: dict[str, Tally]
) -> list[dict[str, Any]]:
    """One sample a second for BURST_WATCH_SECONDS from now: the four timings (ms) and
    the task table's vacuum activity, each with its time since the watch began (s)."""
    series: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    while (at := time.perf_counter() - t0) < BURST_WATCH_SECONDS:
        sample: dict[str, Any] = {"t": round(at, 1)}
        # The burst runtime first in the first sample: its first claim after the burst
        # is the one a worker's next poll would make. Then in turns, so that neither
        # side is always the one to find the machine idle.
        sides = [("", BURST_RUNTIME), ("quiet_", QUIET_RUNTIME)]
        for prefix, runtime_id in sides if len(series) % 2 == 0 else sides[::-1]:
            sample[prefix + "claim_ms"] = ms(await _timed_claim(api, runtime_id, tallies))
            sample[prefix + "stats_ms"] = ms(await _timed_stats(api, runtime_id, tallies["s"]))
        row = await conn.fetchrow(TABLE_ACTIVITY)
        if row is not None:
            sample.update(dict(row))
        series.append(sample)
        rest = BURST_SAMPLE_SECONDS - (time.perf_counter() - t0 - at)
        if rest > 0:
            await asyncio.sleep(rest)
    return series


def _median(series: list[dict[str, Any]], key: str) -> float | None:
    return percentile([s[key] for s in series if s.get(key) is not None], 50)


def summarize(
    series: list[dict[str, Any]], burst_tasks: int, burst_seconds: float, load_seconds: float
) -> Result:
    """The step's result: the first sample, the judged medians and the whole series."""
    r = Result("scale", "burst")
    first = series[0] if series else {}
    end = series[-1]["t"] if series else 0.0
    judged = [s for s in series if s["t"] >= end - BURST_JUDGE_SECONDS]
    vacuums = [
        s["t"]
        for prev, s in itertools.pairwise(series)
        if s.get("vacuuming") and not prev.get("vacuuming")
    ]
    if first.get("vacuuming"):
        vacuums.insert(0, first["t"])
    r.numbers = {
        "burst_tasks": burst_tasks,
        "burst_seconds": round(burst_seconds, 1),
        "load_seconds": round(load_seconds, 1),
        "watch_seconds": BURST_WATCH_SECONDS,
        "judge_seconds": BURST_JUDGE_SECONDS,
        "first_claim_ms": first.get("claim_ms"),
        "first_quiet_claim_ms": first.get("quiet_claim_ms"),
        "first_stats_ms": first.get("stats_ms"),
        "first_quiet_stats_ms": first.get("quiet_stats_ms"),
        "end_claim_p50_ms": _median(judged, "claim_ms"),
        "end_quiet_claim_p50_ms": _median(judged, "quiet_claim_ms"),
        "end_stats_p50_ms": _median(judged, "stats_ms"),
        "end_quiet_stats_p50_ms": _median(judged, "quiet_stats_ms"),
        "vacuum_started_at_s": vacuums,
        "vacuums": (series[-1].get("vacuum_count") if series else None),
        "autovacuums": (series[-1].get("autovacuum_count") if series else None),
        "series": series,
    }
    return r


async def burst_step(
    api: Api, conn: asyncpg.Connection, database_url: str, rows: int, tallies: dict[str, Tally]
) -> Result:
    """Load, settle (the caller's `settle`), complete and watch; see the module's doc."""
    from .scale import settle

    began = time.perf_counter()
    log(f"scale: burst: loading {rows:,} queued tasks in {BURST_RUNTIME}")
    t = await load_burst(conn, rows)
    await settle(conn)
    log("scale: burst: claiming and completing them through the gateway's statements")
    done, took = await complete_burst(database_url, rows)
    log(f"scale: burst: {done:,} completed in {took:.1f} s; watching for {BURST_WATCH_SECONDS:g} s")
    series = await watch(api, conn, tallies)
    result = summarize(series, done, took, t)
    metrics = await scrape(api.session, api.base_url, result.notes)
    # The janitor's VACUUMs over the whole scenario, by outcome (its counter).
    result.numbers["step_seconds"] = round(time.perf_counter() - began, 1)
    result.numbers["janitor_vacuums"] = {
        outcome: int(metrics.get(f'gateway_janitor_vacuums_total{{outcome="{outcome}"}}', 0))
        for outcome in ("done", "skipped", "failed", "cancelled")
    }
    if done < rows:
        result.notes.append(
            f"burst: {done:,} of {rows:,} tasks completed within {BURST_MAX_SECONDS:g} s"
        )
    n = result.numbers
    summary = (
        f"burst: {done:,} tasks of {BURST_RUNTIME} completed in {took:.1f} s, then no "
        f"VACUUM from the bench. First claim after it {n['first_claim_ms']} ms (quiet "
        f"runtime {n['first_quiet_claim_ms']}), first stats {n['first_stats_ms']} ms (quiet "
        f"{n['first_quiet_stats_ms']}); medians of the last {BURST_JUDGE_SECONDS:g} s of "
        f"{BURST_WATCH_SECONDS:g}: claim {n['end_claim_p50_ms']} ms (quiet "
        f"{n['end_quiet_claim_p50_ms']}), stats {n['end_stats_p50_ms']} ms (quiet "
        f"{n['end_quiet_stats_p50_ms']}); VACUUMs of the table began at "
        f"{n['vacuum_started_at_s']} s of the watch; the janitor's: {n['janitor_vacuums']}; "
        f"the whole step took {n['step_seconds']} s"
    )
    result.notes.append(summary)
    log("scale: " + summary)
    return result
