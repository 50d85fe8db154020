"""The claim-throughput scenario and the helpers every scenario shares. Each run has a
gateway process of its own on a fresh database, and every loop in it stops at the
duration.

claim-throughput: tasks are enqueued first (one by one, or in batches), then pollers
long-poll for batches and complete every task (one request per task, or one batch
acknowledgement per claim); each task must be handed out and completed exactly once.
The drain and workers scenarios (suite.py) run it with their own sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg

from . import client
from .client import Api, Tally
from .infra import GatewayProcess, Servers, delete_redis_keys, fresh_database, log, log_name
from .stats import SAMPLES, Result, ms, percentile, ratio
from .watch import Watchdog

# Requests still running this long after their loop's deadline count as hung.
HANG_GRACE_SECONDS = 10.0
# A long poll ends this close to the deadline at the latest; shorter waits are not sent.
MIN_WAIT_SECONDS = 0.1
RETRY_PAUSE_SECONDS = 0.05


Scenario = Callable[[argparse.Namespace, Servers, bool, Path], Awaitable[Result]]
# One simulated daemon: (api, opts, runtime, worker id, deadline, state).
Daemon = Callable[
    [Api, argparse.Namespace, str, str, float, "ThroughputState"], Coroutine[Any, Any, None]
]


@contextlib.asynccontextmanager
async def running_gateway(
    opts: argparse.Namespace, servers: Servers, cache: bool, log_path: Path
) -> AsyncIterator[tuple[GatewayProcess, str]]:
    """A fresh database and a gateway process on it; both gone afterwards."""
    async with fresh_database(servers.database_url) as database_url:
        gw = GatewayProcess(
            database_url,
            servers.redis_url,
            cache,
            log_path,
            extra_env=opts.gateway_env,
            workers=getattr(opts, "workers", 0),
        )
        try:
            await gw.start()
            log(
                f"gateway pid {gw.pid} ready at {gw.url} (GATEWAY_CACHE={'on' if cache else 'off'})"
            )
            yield gw, database_url
        finally:
            code = await gw.stop()
            if code not in (0, None, -15):
                log(f"gateway pid {gw.pid} exited with code {code}")
            with contextlib.suppress(Exception):
                await delete_redis_keys(servers.redis_url, gw.prefix)


async def run_bounded(
    coros: list[Coroutine[Any, Any, None]],
    hard_deadline: float,
    abort: asyncio.Event | None = None,
) -> int:
    """Run the coroutines as tasks until all are done, `abort` is set, or hard_deadline
    (perf_counter time) passes; cancel the rest and return how many were cancelled."""
    tasks = [asyncio.create_task(c) for c in coros]
    pending: set[asyncio.Task[Any]] = set(tasks)
    aborted = asyncio.create_task(abort.wait()) if abort is not None else None
    try:
        while pending and not (abort is not None and abort.is_set()):
            left = hard_deadline - time.perf_counter()
            if left <= 0:
                break
            waits: set[asyncio.Task[Any]] = {*pending, aborted} if aborted else set(pending)
            _, pending = await asyncio.wait(
                waits, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if aborted is not None:
                pending.discard(aborted)
    finally:
        # Also when this coroutine is cancelled (Ctrl-C, SIGTERM): no orphan requests.
        for task in [*tasks, *([aborted] if aborted else [])]:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)
    for task in tasks:
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc  # a bug in the bench itself, not in the gateway
    return len(pending)


def gateway_log_problems(gw: GatewayProcess) -> list[str]:
    """Error lines and tracebacks the gateway wrote while under load."""
    lines = gw.log_text().splitlines()
    bad = [ln for ln in lines if "Traceback" in ln or "ERROR" in ln or "CRITICAL" in ln]
    return bad[:10]


def check_tally(result: Result, name: str, tally: Tally) -> int:
    """Record the tally under `name`; unexpected outcomes become failures. Returns their count."""
    result.requests[name] = tally.summary()
    unexpected = tally.unexpected()
    total = sum(unexpected.values())
    if total:
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(unexpected.items()))
        samples = "; ".join(
            f"{k}: {v}" for k, v in tally.samples.items() if k.split(" (")[0] in unexpected
        )
        result.failures.append(
            f"{name}: {detail}" + (f" (first bodies: {samples})" if samples else "")
        )
    rejected = tally.statuses.get(429, 0)
    if rejected:
        result.notes.append(f"{name}: {rejected} answered 429 (overload, per design I9)")
    return total


def finish(result: Result, gw: GatewayProcess) -> None:
    problems = gateway_log_problems(gw)
    if problems:
        result.failures.append(
            "the gateway logged errors: " + " | ".join(p.strip() for p in problems)
        )


# -- claim-throughput ---------------------------------------------------------


class ThroughputState:
    def __init__(self, enqueued: dict[str, float]) -> None:
        self.enqueued = enqueued  # task id -> perf_counter time its 201 arrived
        self.delivered: Counter[str] = Counter()
        self.completed: Counter[str] = Counter()
        self.unknown: set[str] = set()
        self.claim_to_done: list[float] = []
        self.enqueue_to_done: list[float] = []
        self.empty_claims = 0
        self.completes_sent = 0
        self.last_done = 0.0
        self.all_done = asyncio.Event()
        self.stop = asyncio.Event()  # all done, or the gateway stalled
        self.claims = Tally()
        self.completes = Tally()
        # Batch acknowledgement (POST /v1/tasks:complete) answered 404: not built yet.
        self.batch_ack_missing = False
        self.ack_outcomes: Counter[str] = Counter()
        # Completes carried by claims (bench/carried.py): sent (a claim sent again
        # counts again), answered in `acks`, and whether the gateway ignored or refused
        # them (a claim's `complete` not built yet).
        self.carried_sent = 0
        self.carried_acked = 0
        self.carried_missing = False

    def done(self, task_ids: list[str], claimed_at: float) -> None:
        """Records tasks reported completed now, claimed at `claimed_at` (perf_counter);
        once every enqueued task is done, the run stops."""
        now = time.perf_counter()
        for task_id in task_ids:
            self.completed[task_id] += 1
            self.claim_to_done.append(now - claimed_at)
            if task_id in self.enqueued:
                self.enqueue_to_done.append(now - self.enqueued[task_id])
        self.last_done = now
        if len(self.completed) >= len(self.enqueued):
            self.all_done.set()
            self.stop.set()


async def _enqueue(
    api: Api,
    opts: argparse.Namespace,
    runtimes: list[str],
    deadline: float,
    tally: Tally,
    abort: asyncio.Event,
) -> tuple[dict[str, float], int]:
    """Enqueue task n on runtime n % R, until --tasks or the deadline. Returns
    ({task id: time its 201 arrived}, enqueuers cancelled)."""
    enqueued: dict[str, float] = {}
    numbers = itertools.count()
    batch = getattr(opts, "enqueue_batch", 0)

    async def batch_filler() -> None:
        # One runtime's tasks per request, `batch` at a time (POST .../tasks:batch).
        while time.perf_counter() < deadline:
            first = next(numbers) * batch
            if first >= opts.tasks:
                return
            count = min(batch, opts.tasks - first)
            runtime = runtimes[(first // batch) % len(runtimes)]
            items = [
                {"payload": {"n": first + k, "runtime": runtime, "kind": "bench"}}
                for k in range(count)
            ]
            got = await api.post(
                f"/v1/runtimes/{runtime}/tasks:batch", {"tasks": items}, tally, seconds=60.0
            )
            if got is not None and got[0] in (200, 201) and got[1]:
                now = time.perf_counter()
                for task in got[1].get("tasks", []):
                    enqueued[task["id"]] = now
            else:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)

    async def filler() -> None:
        while time.perf_counter() < deadline:
            n = next(numbers)
            if n >= opts.tasks:
                return
            runtime = runtimes[n % len(runtimes)]
            body = {"payload": {"n": n, "runtime": runtime, "kind": "bench"}}
            got = await api.post(f"/v1/runtimes/{runtime}/tasks", body, tally, seconds=30.0)
            if got is None:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            status, data = got
            if status == 201 and data and "id" in data:
                enqueued[data["id"]] = time.perf_counter()
            else:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)

    make = batch_filler if batch else filler
    cancelled = await run_bounded(
        [make() for _ in range(opts.enqueue_concurrency)], deadline + HANG_GRACE_SECONDS, abort
    )
    return enqueued, cancelled


async def _complete(api: Api, task: dict[str, Any], claimed_at: float, st: ThroughputState) -> None:
    task_id = str(task.get("id"))
    st.delivered[task_id] += 1
    if task_id not in st.enqueued:
        st.unknown.add(task_id)
    body = {"lease_id": task.get("lease_id"), "result": {"ok": True}}
    st.completes_sent += 1
    got = await api.post(f"/v1/tasks/{task_id}/complete", body, st.completes, seconds=30.0)
    if got is None or got[0] != 200:
        return
    st.done([task_id], claimed_at)


async def _complete_batch(
    api: Api, tasks: list[dict[str, Any]], claimed_at: float, st: ThroughputState
) -> None:
    """One POST /v1/tasks:complete for a claimed batch; each outcome must be `completed`."""
    for task in tasks:
        task_id = str(task.get("id"))
        st.delivered[task_id] += 1
        if task_id not in st.enqueued:
            st.unknown.add(task_id)
    body = {
        "tasks": [
            {"id": t.get("id"), "lease_id": t.get("lease_id"), "result": {"ok": True}}
            for t in tasks
        ]
    }
    st.completes_sent += len(tasks)
    got = await api.post("/v1/tasks:complete", body, st.completes, seconds=30.0)
    if got is not None and got[0] == 404:
        st.batch_ack_missing = True
        st.stop.set()
        return
    if got is None or got[0] != 200:
        return
    completed = []
    for item in (got[1] or {}).get("results", []):
        outcome = str(item.get("outcome"))
        st.ack_outcomes[outcome] += 1
        if outcome == "completed":
            completed.append(str(item.get("id")))
    st.done(completed, claimed_at)


async def _daemon(
    api: Api,
    opts: argparse.Namespace,
    runtime: str,
    worker: str,
    deadline: float,
    st: ThroughputState,
) -> None:
    """One simulated daemon: long-poll for a batch, acknowledge it (one complete per
    task, concurrently, or one batch acknowledgement), and claim the next batch without
    waiting for the answer, as the client's worker loop does. At most one batch's
    acknowledgement is in flight: the next waits for the previous one's answer."""
    path = f"/v1/runtimes/{runtime}/claim"
    acking: asyncio.Task[None] | None = None
    try:
        while not st.stop.is_set():
            remaining = deadline - time.perf_counter()
            if remaining < MIN_WAIT_SECONDS:
                break
            # Never wait past the deadline, so that no lease is handed to a cancelled poll.
            wait = round(min(opts.wait_seconds, remaining), 3)
            body = {"worker_id": worker, "wait_seconds": wait, "max_tasks": opts.max_tasks}
            started = time.perf_counter()
            got = await api.post(path, body, st.claims, seconds=wait + 30.0)
            if got is None or got[0] != 200:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            tasks = (got[1] or {}).get("tasks") or []
            if not tasks:
                st.empty_claims += 1
                continue
            if acking is not None:
                await acking
            acking = asyncio.create_task(_acknowledge(api, opts, tasks, started, st))
        if acking is not None:
            await acking
    finally:
        # Cancelled (all done, a stall, the hard deadline): no orphan request.
        if acking is not None and not acking.done():
            acking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acking


async def _acknowledge(
    api: Api,
    opts: argparse.Namespace,
    tasks: list[dict[str, Any]],
    claimed_at: float,
    st: ThroughputState,
) -> None:
    if getattr(opts, "batch_ack", False):
        await _complete_batch(api, tasks, claimed_at, st)
    else:
        await asyncio.gather(*(_complete(api, t, claimed_at, st) for t in tasks))


async def _analyze(database_url: str) -> None:
    """Statistics on the task table, as autovacuum gathers them on a live gateway: with
    them, Postgres plans each small claim afresh at every execution (bench/README.md,
    "A claim planned afresh at every execution")."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()


async def _database_counts(database_url: str) -> dict[str, Any]:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n, count(*) FILTER (WHERE attempts > 1) AS again "
            "FROM tasks GROUP BY status"
        )
    finally:
        await conn.close()
    return {
        "by_status": {r["status"]: r["n"] for r in rows},
        "claimed_more_than_once": sum(r["again"] for r in rows),
    }


def _connections(opts: argparse.Namespace) -> int:
    """Room for every request a daemon has in flight at once: its claim for the next
    batch, beside the acknowledgement of the last (one complete per task of a batch, or
    one batch acknowledgement). With fewer, the completes queue for a connection in the
    load generator, not in the gateway."""
    if getattr(opts, "carried", False):
        per_daemon = 1  # its claim carries the last task's complete
    else:
        per_daemon = 2 if getattr(opts, "batch_ack", False) else 1 + opts.max_tasks
    return int(max(opts.pollers * per_daemon, opts.enqueue_concurrency)) + 10


async def claim_throughput(
    opts: argparse.Namespace,
    servers: Servers,
    cache: bool,
    workdir: Path,
    *,
    daemon: Daemon | None = None,
) -> Result:
    """`daemon`: each simulated daemon's loop (`_daemon` unless given: the drain's
    one-at-a-time mode passes bench/carried.py's)."""
    # The drain and workers scenarios run this one under their own names and labels.
    run_daemon = daemon or _daemon
    # Statistics on the task table before the workers start (--drain-analyze).
    analyze = bool(getattr(opts, "drain_analyze", False))
    result = Result(
        getattr(opts, "result_scenario", "claim-throughput"),
        getattr(opts, "result_label", None) or ("on" if cache else "off"),
    )
    runtimes = [f"bench-work-{i:03d}" for i in range(opts.runtimes)]
    log_path = workdir / log_name(result.scenario, result.cache)
    async with (
        running_gateway(opts, servers, cache, log_path) as (gw, database_url),
        client.session(_connections(opts)) as http,
    ):
        api = Api(http, gw.url, gw.token)
        log(f"claim-throughput: enqueuing up to {opts.tasks} tasks")
        enqueue_tally = Tally()
        enqueue_started = time.perf_counter()
        async with Watchdog(gw.url, gw.pid) as enqueue_watch:
            enqueued, enqueue_cancelled = await _enqueue(
                api,
                opts,
                runtimes,
                enqueue_started + opts.duration_seconds,
                enqueue_tally,
                enqueue_watch.stalled,
            )
        enqueue_seconds = time.perf_counter() - enqueue_started
        st = ThroughputState(enqueued)
        claim_cancelled = 0
        claim_watch: Watchdog | None = None
        started = ended = time.perf_counter()
        before: dict[str, float] = {}
        if enqueue_watch.stalled.is_set():
            st.stop.set()
        else:
            if not enqueued:
                st.all_done.set()
                st.stop.set()
            if analyze:
                await _analyze(database_url)
            before = await client.scrape(http, gw.url)
            log(
                f"claim-throughput: {len(enqueued)} tasks queued in {enqueue_seconds:.1f} s; "
                f"{opts.pollers} daemons claiming (max {opts.duration_seconds:g} s)"
            )
            async with Watchdog(gw.url, gw.pid, also_set=st.stop) as claim_watch:
                started = time.perf_counter()
                deadline = started + opts.duration_seconds
                coros = [
                    run_daemon(api, opts, runtimes[i % len(runtimes)], f"bench-{i}", deadline, st)
                    for i in range(opts.pollers)
                ]
                # After the last completion nothing is claimable: parked polls may go.
                claim_cancelled = await run_bounded(
                    coros, deadline + opts.wait_seconds + HANG_GRACE_SECONDS, st.stop
                )
                ended = time.perf_counter()
        after = await client.scrape(http, gw.url, result.failures) if before else {}
        db = await _database_counts(database_url)
        finish(result, gw)

    if st.batch_ack_missing:
        result.numbers = {"available": False}
        result.notes.append(
            "POST /v1/tasks:complete answered 404: batch acknowledgement is not available "
            "in this gateway, so this row was not measured"
        )
        return result
    if st.carried_missing:
        result.numbers = {"available": False}
        result.notes.append(
            "a claim carrying a complete was refused (422) or answered without its acks: "
            "this gateway does not take reports with a claim, so this row was not measured"
        )
        return result
    errors = check_tally(result, "enqueue", enqueue_tally)
    errors += check_tally(result, "claim", st.claims)
    errors += check_tally(result, "complete", st.completes)
    for watch, phase in ((enqueue_watch, "enqueue phase"), (claim_watch, "claim phase")):
        stalled = watch.failure(phase) if watch is not None else None
        if stalled:
            result.failures.append(stalled)
    if enqueue_cancelled and not enqueue_watch.stalled.is_set():
        result.failures.append(
            f"{enqueue_cancelled} enqueue requests were still unanswered "
            f"{HANG_GRACE_SECONDS:g} s after the enqueue deadline (cancelled)"
        )
    if claim_cancelled and not st.all_done.is_set() and not st.stop.is_set():
        result.failures.append(
            f"{claim_cancelled} daemons were still waiting for an answer {HANG_GRACE_SECONDS:g} s "
            "after their last long poll should have ended (cancelled)"
        )
    delivered_twice = {t: n for t, n in st.delivered.items() if n > 1}
    completed_twice = {t: n for t, n in st.completed.items() if n > 1}
    completed = len(st.completed)
    by_status = db["by_status"]
    if delivered_twice:
        sample = ", ".join(f"{t} x{n}" for t, n in list(delivered_twice.items())[:5])
        result.failures.append(
            f"{len(delivered_twice)} tasks were handed out more than once (e.g. {sample})"
        )
    if completed_twice:
        result.failures.append(f"{len(completed_twice)} tasks were completed more than once")
    other_outcomes = {k: n for k, n in st.ack_outcomes.items() if k != "completed"}
    if other_outcomes:
        result.failures.append(
            "batch acknowledgements (or a claim's acks) answered outcomes other than "
            "completed for leases the bench held: "
            f"{other_outcomes}"
        )
    if st.unknown:
        result.failures.append(f"{len(st.unknown)} claimed tasks were never enqueued by the bench")
    unanswered = st.completes_sent - st.completes.responses + st.carried_sent - st.carried_acked
    if by_status.get("completed", 0) != completed:
        result.failures.append(
            f"Postgres has {by_status.get('completed', 0)} completed tasks, but the bench "
            f"saw {completed} completions answered 200 ({unanswered} complete requests were "
            "never answered)"
        )
    if sum(by_status.values()) != len(enqueued):
        result.failures.append(
            f"Postgres holds {sum(by_status.values())} tasks, but {len(enqueued)} enqueues "
            "were answered 201"
        )
    leased = by_status.get("claimed", 0)
    if leased:
        never_reached = leased + by_status.get("completed", 0) - len(st.delivered)
        result.failures.append(
            f"{leased} tasks were still leased in Postgres after every daemon had stopped; "
            f"{max(never_reached, 0)} of them were leased but never reached a daemon"
        )
    if db["claimed_more_than_once"]:
        result.failures.append(
            f"{db['claimed_more_than_once']} tasks have attempts > 1 (claimed more than once)"
        )
    if len(enqueued) < opts.tasks:
        result.notes.append(
            f"only {len(enqueued)} of {opts.tasks} tasks were enqueued within "
            f"{opts.duration_seconds:g} s"
        )
    left = by_status.get("queued", 0)
    if left:
        result.notes.append(
            f"{left} tasks were still queued when the claim phase ended: tasks/s is the rate "
            "reached, not a completed drain"
        )
    claim_seconds = (st.last_done or ended) - started
    SAMPLES[f"{result.scenario}/{result.cache}"] = list(st.claim_to_done)
    pg_claims = client.delta(before, after, client.PG_CLAIMS)
    pg_completes = client.delta(before, after, client.PG_COMPLETES)
    pg_claim_seconds = client.seconds_delta(before, after, client.PG_CLAIM_SECONDS)
    long_poll_seconds = client.seconds_delta(before, after, client.LONG_POLL_SECONDS)
    long_polls = client.delta(before, after, client.LONG_POLLS)
    result.numbers = {
        "pollers": opts.pollers,
        "table_analyzed": analyze,
        "runtimes": opts.runtimes,
        "max_tasks": opts.max_tasks,
        "wait_seconds": opts.wait_seconds,
        "tasks_requested": opts.tasks,
        "enqueued": len(enqueued),
        "enqueue_seconds": round(enqueue_seconds, 3),
        "enqueues_per_second": round(len(enqueued) / enqueue_seconds, 1)
        if enqueue_seconds
        else None,
        "enqueue_p50_ms": ms(percentile(enqueue_tally.latencies, 50)),
        "enqueue_p99_ms": ms(percentile(enqueue_tally.latencies, 99)),
        "enqueue_gateway_cpu_percent": enqueue_watch.numbers()["gateway_cpu_percent"],
        "completed": completed,
        "delivered": len(st.delivered),
        "claim_phase_seconds": round(claim_seconds, 3),
        "tasks_per_second": round(completed / claim_seconds, 1)
        if claim_seconds > 0 and (st.all_done.is_set() or not st.stop.is_set())
        else None,  # not when the phase was aborted
        "claim_to_done_p50_ms": ms(percentile(st.claim_to_done, 50)),
        "claim_to_done_p99_ms": ms(percentile(st.claim_to_done, 99)),
        "enqueue_to_done_p50_ms": ms(percentile(st.enqueue_to_done, 50)),
        "enqueue_to_done_p99_ms": ms(percentile(st.enqueue_to_done, 99)),
        # A claim request's latency at the load generator (with the acks it carries).
        "claim_request_p50_ms": ms(percentile(st.claims.latencies, 50)),
        "claim_request_mean_ms": ms(ratio(sum(st.claims.latencies), len(st.claims.latencies))),
        "complete_p50_ms": ms(percentile(st.completes.latencies, 50)),
        "complete_p99_ms": ms(percentile(st.completes.latencies, 99)),
        "claim_requests": st.claims.responses,
        "empty_claim_responses": st.empty_claims,
        "pg_claims": pg_claims,
        "pg_claims_per_task": ratio(pg_claims, completed),
        # Statements that served the completes or batch acknowledgements (grouped).
        "pg_complete_statements": pg_completes,
        "pg_complete_statements_per_task": ratio(pg_completes, completed),
        # The share of the claim phase a claim statement was running (summed over
        # statements): one runtime has one in flight per process at a time (I9), so
        # near 1 the claims pace the drain.
        "pg_claim_busy": None
        if (busy := ratio(pg_claim_seconds, claim_seconds)) is None
        else round(busy, 3),
        "pg_claim_mean_ms": ms(ratio(pg_claim_seconds, pg_claims or 0)),
        # A claim's time in the gateway, from its arrival to its answer.
        "claim_in_gateway_mean_ms": ms(ratio(long_poll_seconds, long_polls or 0)),
        "verdict_hits": client.delta(before, after, client.VERDICT_HIT),
        "verdict_misses": client.delta(before, after, client.VERDICT_MISS),
        "leases_returned": client.delta(before, after, client.LEASES_RETURNED),
        "batch_ack_outcomes": dict(st.ack_outcomes),
        # Completes carried by claims and answered in their acks (one-at-a-time mode).
        "carried_completes_sent": st.carried_sent,
        "carried_completes_acked": st.carried_acked,
        "duplicates": len(delivered_twice) + len(completed_twice),
        "errors": errors,
        "postgres_by_status": by_status,
        **(claim_watch.numbers() if claim_watch is not None else {}),
    }
    return result


SCENARIOS: dict[str, Scenario] = {
    "claim-throughput": claim_throughput,
}
