"""The comparison scenarios: each puts the gateway beside its peers in the same run.

Every scenario returns a list of `Result`s (one per variant: the gateway with the
cache on, off, the bare Starlette floor, pgqueuer, ...); `targets.py` turns their
numbers into the PASS/MISS table. Every loop is bounded in count and in time, and
every process started here is stopped by pid in a `finally` block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import psutil
import redis.asyncio as aioredis

from . import client
from .carried import carried_daemon
from .client import Api, Tally
from .infra import (
    GATEWAY_APP,
    Servers,
    log,
    log_name,
    serving,
)
from .overload import overload
from .peers import run_pgqueuer
from .round_trips import round_trips
from .scenarios import (
    HANG_GRACE_SECONDS,
    RETRY_PAUSE_SECONDS,
    check_tally,
    claim_throughput,
    finish,
    run_bounded,
)
from .schedules import schedules
from .stats import SAMPLES, Result, ms, percentile, ratio
from .targets import ACCESS_LOG_LABEL
from .watch import Watchdog

FLOOR_APP = "bench.floor:create_app"
FLOOR_MGET_APP = "bench.floor:create_mget_app"
PARKED_GAUGE = "gateway_parked_polls"
PARK_TIMEOUT_SECONDS = 150.0
# Postgres 15 publishes an idle backend's transaction counts within about 10 s: the
# parking phase's claims must be published before the idle window starts.
PG_STATS_SETTLE_SECONDS = 11.0
RAMP_STEP = 250
RAMP_AHEAD = 1000

Suite = Callable[[argparse.Namespace, Servers, Path], Awaitable[list[Result]]]


# -- processes ----------------------------------------------------------------


def tree(pid: int | None) -> list[psutil.Process]:
    """A process and its children (uvicorn --workers forks them)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def rss_bytes(pid: int | None) -> int:
    total = 0
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def cpu_seconds_tree(pid: int | None) -> float:
    total = 0.0
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


async def pg_xacts(admin_url: str, database_url: str) -> int | None:
    """Committed + rolled back transactions Postgres has published for the database.
    Postgres 15 publishes a backend's counts late (up to ~10 s while it idles), so
    only deltas over a long window mean anything."""
    name = database_url.rsplit("/", 1)[-1].split("?")[0]
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        value = await conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", name
        )
    finally:
        await conn.close()
    return None if value is None else int(value)


async def redis_connections_by_pid(redis_url: str, pid: int | None) -> dict[int, int]:
    """Redis connections of each process of the tree: CLIENT LIST entries whose
    address is a local socket of that process."""
    ports: dict[int, int] = {}
    for proc in tree(pid):
        with contextlib.suppress(psutil.Error):
            for conn in proc.net_connections(kind="tcp"):
                if conn.laddr:
                    ports[conn.laddr.port] = proc.pid
    rd = aioredis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        clients = await rd.client_list()
    finally:
        await rd.aclose()
    counts: Counter[int] = Counter({p.pid: 0 for p in tree(pid)})
    for entry in clients:
        addr = str(entry.get("addr", ""))
        port = addr.rsplit(":", 1)[-1]
        if port.isdigit() and int(port) in ports:
            counts[ports[int(port)]] += 1
    return dict(counts)


async def _wait_parked(http: Any, url: str, want: int, seconds: float) -> float:
    """Scrape the parked-poll gauge until it reaches `want`; the value last seen."""
    deadline = time.perf_counter() + seconds
    seen = 0.0
    while time.perf_counter() < deadline:
        with contextlib.suppress(Exception):
            seen = (await client.scrape(http, url)).get(PARKED_GAUGE, 0.0)
            if seen >= want:
                return seen
        await asyncio.sleep(0.5)
    return seen


# -- empty polls: gateway cache on/off against the floor ---------------------


async def _rotating_poller(
    api: Api, runtimes: list[str], start: int, step: int, deadline: float, tally: Tally
) -> None:
    """Claims with wait_seconds 0, each on the next runtime of its stride, so that the
    pollers together cycle over every runtime."""
    i = start
    body: dict[str, Any] = {"worker_id": f"bench-{start}", "wait_seconds": 0}
    while time.perf_counter() < deadline:
        got = await api.post(f"/v1/runtimes/{runtimes[i % len(runtimes)]}/claim", body, tally)
        i += step
        if got is None or got[0] != 200:
            await asyncio.sleep(RETRY_PAUSE_SECONDS)


async def _poll_round(
    api: Api, opts: argparse.Namespace, runtimes: list[str], seconds: float, tally: Tally
) -> tuple[float, int]:
    started = time.perf_counter()
    deadline = started + seconds
    n = opts.connections
    coros = [_rotating_poller(api, runtimes, i, n, deadline, tally) for i in range(n)]
    cancelled = await run_bounded(coros, deadline + HANG_GRACE_SECONDS)
    return time.perf_counter() - started, cancelled


async def _claim_each(api: Api, runtimes: list[str], concurrency: int, tally: Tally) -> None:
    pending = list(runtimes)
    body = {"worker_id": "bench-warm", "wait_seconds": 0}

    async def one() -> None:
        while pending:
            await api.post(f"/v1/runtimes/{pending.pop()}/claim", body, tally)

    await run_bounded([one() for _ in range(concurrency)], time.perf_counter() + 60)


async def empty_polls_variant(
    opts: argparse.Namespace,
    servers: Servers,
    workdir: Path,
    label: str,
    *,
    scenario: str = "empty-polls",
    app: str = GATEWAY_APP,
    cache: bool = True,
    workers: int = 0,
    log_level: str = "warning",
    access_log: bool = False,
) -> Result:
    result = Result(scenario, label)
    runtimes = [f"bench-empty-{i:04d}" for i in range(opts.poll_runtimes)]
    gateway = app == GATEWAY_APP
    log_path = workdir / log_name(scenario, label)
    async with (
        serving(
            opts,
            servers,
            log_path,
            app=app,
            cache=cache,
            workers=workers,
            log_level=log_level,
            access_log=access_log,
        ) as (proc, db),
        client.session(opts.connections + 10) as http,
    ):
        api = Api(http, proc.url, proc.token)
        warm = Tally()
        # Every runtime once, so that each has its verdict before the measured loop.
        await _claim_each(api, runtimes, opts.connections, warm)
        await _poll_round(api, opts, runtimes, max(opts.warmup_seconds, 0.5), warm)
        before = await client.scrape(http, proc.url) if gateway else {}
        xacts_before = await pg_xacts(servers.database_url, db) if gateway else None
        tally = Tally()
        log(f"{scenario} [{label}]: {opts.connections} connections x {opts.poll_seconds:g} s")
        async with Watchdog(proc.url, proc.pid) as watchdog:
            cpu0 = cpu_seconds_tree(proc.pid)
            elapsed, cancelled = await _poll_round(api, opts, runtimes, opts.poll_seconds, tally)
            cpu_used = cpu_seconds_tree(proc.pid) - cpu0
        after = await client.scrape(http, proc.url, result.failures) if gateway else {}
        redis_conns = await redis_connections_by_pid(servers.redis_url, proc.pid)
        xacts_after = await pg_xacts(servers.database_url, db) if gateway else None
        finish(result, proc)
    errors = check_tally(result, "claim", tally)
    if workers > 1 and gateway:
        result.notes.append(
            "with several workers, /metrics answers from one of them: Postgres claim counts "
            "are not comparable between scrapes, so none are shown"
        )
    if cancelled:
        result.failures.append(f"{cancelled} pollers hung past the deadline (cancelled)")
    stalled = watchdog.failure("measured loop")
    if stalled:
        result.failures.append(stalled)
    # With several workers the two scrapes may come from different processes.
    pg_claims = client.delta(before, after, client.PG_CLAIMS) if gateway and workers <= 1 else None
    SAMPLES[f"{scenario}/{label}"] = list(tally.latencies)
    result.numbers = {
        "connections": opts.connections,
        "runtimes": len(runtimes),
        "workers": workers,
        "seconds": round(elapsed, 3),
        "requests": tally.responses,
        "requests_per_second": round(tally.responses / elapsed, 1) if elapsed else None,
        "p50_ms": ms(percentile(tally.latencies, 50)),
        "p99_ms": ms(percentile(tally.latencies, 99)),
        "pg_claims": pg_claims,
        "pg_claims_per_poll": ratio(pg_claims, tally.responses),
        # Published late by Postgres 15; the app's counter above is the reliable one.
        "pg_stat_xacts": None
        if xacts_before is None or xacts_after is None
        else xacts_after - xacts_before,
        "server_cpu_percent": round(100.0 * cpu_used / elapsed, 1) if elapsed else None,
        # What an answer costs the server: unlike req/s, not capped by the load
        # generator, which on 2 shared cores is often the slower side.
        "server_cpu_us_per_request": round(1e6 * cpu_used / tally.responses, 1)
        if tally.responses
        else None,
        "redis_connections_by_process": {str(k): v for k, v in redis_conns.items()},
        "errors": errors,
        **watchdog.numbers(),
    }
    return result


async def empty_polls(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    # The gateway as `gateway serve` starts by default (log level info, the access log
    # on, as text), and the same with the access log off: the two differ in that alone.
    return [
        await empty_polls_variant(opts, servers, workdir, "cache on", log_level="info"),
        await empty_polls_variant(
            opts, servers, workdir, ACCESS_LOG_LABEL, log_level="info", access_log=True
        ),
        await empty_polls_variant(opts, servers, workdir, "cache off", cache=False),
        await empty_polls_variant(opts, servers, workdir, "floor", app=FLOOR_APP),
        await empty_polls_variant(opts, servers, workdir, "floor+MGET", app=FLOOR_MGET_APP),
    ]


# -- parked polls: memory and Postgres cost of waiting -----------------------


class Parked:
    """Long polls that park, and park again when they come back empty.

    They connect in steps (`RAMP_STEP` at a time) and a step starts only while fewer
    than `RAMP_AHEAD` of the connected polls are not yet parked: a gateway that
    accepts more slowly than the bench connects lets its listen queue overflow, and
    the kernel then resets connections the gateway never saw (a bench artefact, not
    what a fleet that reconnects over time does)."""

    def __init__(self, api: Api, runtimes: list[str], count: int, wait_seconds: float) -> None:
        self.api = api
        self.runtimes = runtimes
        self.count = count
        self.wait_seconds = wait_seconds
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.stray = 0
        self.on_task: Callable[[dict[str, Any], float], Awaitable[None]] | None = None
        self.open_to = 0  # pollers below this index may connect
        self._gate = asyncio.Condition()

    async def poller(self, i: int, deadline: float) -> None:
        runtime = self.runtimes[i % len(self.runtimes)]
        body = {"worker_id": f"parked-{i}", "wait_seconds": self.wait_seconds}
        async with self._gate:
            await self._gate.wait_for(lambda: i < self.open_to or self.stop.is_set())
        while not self.stop.is_set() and time.perf_counter() < deadline:
            got = await self.api.post(
                f"/v1/runtimes/{runtime}/claim", body, self.tally, seconds=self.wait_seconds + 30
            )
            if got is None or got[0] != 200:
                await asyncio.sleep(0.2)
                continue
            for task in (got[1] or {}).get("tasks") or []:
                if self.on_task is None:
                    self.stray += 1
                else:
                    await self.on_task(task, time.perf_counter())

    async def ramp(self, http: Any, url: str, deadline: float) -> None:
        """Open the gate step by step, watching the gateway's parked-poll gauge."""
        while self.open_to < self.count and time.perf_counter() < deadline:
            if self.stop.is_set():
                break
            parked = 0.0
            with contextlib.suppress(Exception):
                parked = (await client.scrape(http, url)).get(PARKED_GAUGE, 0.0)
            if self.open_to - parked <= RAMP_AHEAD:
                async with self._gate:
                    self.open_to = min(self.count, self.open_to + RAMP_STEP)
                    self._gate.notify_all()
            else:
                await asyncio.sleep(0.1)
        async with self._gate:
            self.open_to = self.count  # bounded: past the deadline, the rest go at once
            self._gate.notify_all()

    async def run(self, http: Any, url: str, deadline: float) -> int:
        coros: list[Coroutine[Any, Any, None]] = [
            self.poller(i, deadline) for i in range(self.count)
        ]
        coros.append(self.ramp(http, url, deadline))
        return await run_bounded(coros, deadline + HANG_GRACE_SECONDS, self.stop)


async def parked_variant(
    opts: argparse.Namespace, servers: Servers, workdir: Path, count: int, runtimes_n: int
) -> Result:
    label = f"{count} over {runtimes_n}"
    result = Result("parked-polls", label)
    runtimes = [f"bench-park-{i:04d}" for i in range(runtimes_n)]
    window = opts.park_window_seconds
    # Polls wait longer than the whole run, so that none comes back and parks again
    # while it is measured (the server's cap is raised to allow it).
    wait = PARK_TIMEOUT_SECONDS + window + 60.0
    env = {
        "GATEWAY_MAX_PARKED_POLLS": str(max(count * 2, 20_000)),
        "GATEWAY_MAX_QUEUED_CLAIMS": "100000",
        "GATEWAY_MAX_WAIT_SECONDS": str(int(wait) + 1),
    }
    log_path = workdir / f"parked-{count}-{runtimes_n}.log"
    async with (
        serving(opts, servers, log_path, env=env, stop_grace_seconds=40.0) as (proc, db),
        client.session(count + 20) as http,
    ):
        api = Api(http, proc.url, proc.token)
        warm = Tally()
        for rt in runtimes[:5]:  # the app's lazy state is there before the baseline
            await api.post(f"/v1/runtimes/{rt}/claim", {"worker_id": "w", "wait_seconds": 0}, warm)
        await asyncio.sleep(0.5)
        rss_before = rss_bytes(proc.pid)
        parked = Parked(api, runtimes, count, wait)
        deadline = time.perf_counter() + wait + 5
        log(f"parked-polls: parking {count} long polls over {runtimes_n} runtimes")
        runner = asyncio.create_task(parked.run(http, proc.url, deadline))
        try:
            parking = time.perf_counter()
            seen = await _wait_parked(http, proc.url, count, PARK_TIMEOUT_SECONDS)
            parked_after = time.perf_counter() - parking
            if seen < count:
                result.failures.append(
                    f"only {seen:g} of {count} polls were parked (the gateway's "
                    f"{PARKED_GAUGE} gauge) after {PARK_TIMEOUT_SECONDS:g} s"
                )
            await asyncio.sleep(2.0)  # the last parkers' first claims are done
            rss_parked = rss_bytes(proc.pid)
            await asyncio.sleep(PG_STATS_SETTLE_SECONDS)
            before = await client.scrape(http, proc.url)
            answers0 = parked.tally.responses
            x0 = await pg_xacts(servers.database_url, db)
            t0 = time.perf_counter()
            await asyncio.sleep(window)
            x1 = await pg_xacts(servers.database_url, db)
            after = await client.scrape(http, proc.url, result.failures)
            measured = time.perf_counter() - t0
            still = after.get(PARKED_GAUGE, 0.0)
            answers = parked.tally.responses - answers0
        finally:
            parked.stop.set()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await runner
        finish(result, proc)
    check_tally(result, "claim", parked.tally)
    if parked.stray:
        result.failures.append(f"claims on empty runtimes returned {parked.stray} tasks")
    pg_claims = client.delta(before, after, client.PG_CLAIMS)
    result.numbers = {
        "parked": count,
        "runtimes": runtimes_n,
        "parked_at_end": still,
        "window_seconds": round(measured, 2),
        "seconds_to_park_all": round(parked_after, 1),
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_parked_mib": round(rss_parked / 2**20, 1),
        "kib_per_parked_poll": round((rss_parked - rss_before) / count / 1024, 2),
        "pg_claims_in_window": pg_claims,
        "claims_answered_in_window": answers,
        "verdict_hits_in_window": client.delta(before, after, client.VERDICT_HIT),
        "verdict_misses_in_window": client.delta(before, after, client.VERDICT_MISS),
        "redis_errors_in_window": client.delta(before, after, client.REDIS_ERRORS),
        "pg_claims_per_second": None if pg_claims is None else round(pg_claims / measured, 3),
        "pg_stat_xacts_per_second": None
        if x0 is None or x1 is None
        else round((x1 - x0) / measured, 2),
        # SIGTERM to exit, after the clients hung up: what a rollout waits for.
        "stop_seconds": None if proc.stop_seconds is None else round(proc.stop_seconds, 1),
    }
    return result


async def parked_polls(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    out = []
    for count, rts in opts.park_sizes:
        out.append(await parked_variant(opts, servers, workdir, count, rts))
    return out


# -- wake latency -------------------------------------------------------------


async def wake_latency(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    result = Result("wake-latency", f"{opts.wake_parked} over {opts.wake_runtimes}")
    runtimes = [f"bench-wake-{i:03d}" for i in range(opts.wake_runtimes)]
    answered: dict[str, float] = {}  # task id -> when the parked claim answered
    arrived = asyncio.Event()
    completes = Tally()
    async with (
        serving(opts, servers, workdir / "wake.log") as (proc, _db),
        client.session(opts.wake_parked + 20) as http,
    ):
        api = Api(http, proc.url, proc.token)
        parked = Parked(api, runtimes, opts.wake_parked, 30.0)

        async def got_task(task: dict[str, Any], at: float) -> None:
            answered[str(task.get("id"))] = at
            arrived.set()
            await api.post(
                f"/v1/tasks/{task.get('id')}/complete",
                {"lease_id": task.get("lease_id")},
                completes,
            )

        parked.on_task = got_task
        deadline = time.perf_counter() + opts.wake_seconds + 60
        runner = asyncio.create_task(parked.run(http, proc.url, deadline))
        enqueues = Tally()
        lat: list[float] = []
        from_sent: list[float] = []
        early = 0
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        try:
            seen = await _wait_parked(http, proc.url, opts.wake_parked, 60)
            if seen < opts.wake_parked:
                result.failures.append(f"only {seen:g} of {opts.wake_parked} polls parked in time")
            await asyncio.sleep(1.0)
            log(f"wake-latency: {opts.wakes} wakes over {opts.wake_parked} parked polls")
            before = await client.scrape(http, proc.url)
            stop_at = time.perf_counter() + opts.wake_seconds
            for i in range(opts.wakes):
                if time.perf_counter() > stop_at:
                    break
                rt = runtimes[(i * 7) % len(runtimes)]
                arrived.clear()
                sent = time.perf_counter()
                got = await api.post(f"/v1/runtimes/{rt}/tasks", {"payload": {"wake": i}}, enqueues)
                done = time.perf_counter()
                if got is None or got[0] != 201:
                    continue
                task_id = str(got[1]["id"])
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        while task_id not in answered:
                            await arrived.wait()
                            arrived.clear()
                if task_id in answered:
                    if answered[task_id] < done:
                        early += 1
                    lat.append(max(0.0, answered[task_id] - done))
                    from_sent.append(answered[task_id] - sent)
                await asyncio.sleep(0.02)  # the woken poller parks again
            after = await client.scrape(http, proc.url, result.failures)
        finally:
            parked.stop.set()
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await runner
        finish(result, proc)
    check_tally(result, "enqueue", enqueues)
    check_tally(result, "complete", completes)
    check_tally(result, "parked claim", parked.tally)
    attempted = enqueues.statuses.get(201, 0)
    if len(lat) < attempted:
        result.failures.append(f"{attempted - len(lat)} of {attempted} wakes never reached a poll")
    SAMPLES["wake-latency/enqueue answered -> claim answered"] = lat
    result.numbers = {
        "parked": opts.wake_parked,
        "runtimes": opts.wake_runtimes,
        "wakes": len(lat),
        "p50_ms": ms(percentile(lat, 50)),
        "p99_ms": ms(percentile(lat, 99)),
        "max_ms": ms(max(lat, default=None)),
        "from_enqueue_sent_p50_ms": ms(percentile(from_sent, 50)),
        "from_enqueue_sent_p99_ms": ms(percentile(from_sent, 99)),
        "claim_answered_before_enqueue_answer": early,
        # Postgres claim statements and Redis verdict reads per wake (the enqueue's own
        # insert aside); sync matches: tasks an enqueue wrote leased to a parked poll.
        "pg_claims_per_wake": _per(client.delta(before, after, client.PG_CLAIMS), len(lat)),
        "verdict_reads_per_wake": _per(
            _sum(
                client.delta(before, after, client.VERDICT_HIT),
                client.delta(before, after, client.VERDICT_MISS),
            ),
            len(lat),
        ),
        "sync_matches": client.delta(before, after, SYNC_HANDED),
    }
    return [result]


SYNC_HANDED = 'gateway_sync_matches_total{outcome="handed"}'


def _per(count: int | None, n: int) -> float | None:
    return None if count is None or not n else round(count / n, 2)


def _sum(*counts: int | None) -> int | None:
    return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


# -- drain and enqueue against pgqueuer ----------------------------------------


def _drain_opts(opts: argparse.Namespace, label: str, **more: Any) -> argparse.Namespace:
    values = dict(vars(opts))
    values.update(
        tasks=opts.drain_tasks,
        pollers=opts.drain_workers,
        runtimes=opts.drain_runtimes,
        max_tasks=opts.drain_max_tasks,
        wait_seconds=1.0,
        duration_seconds=opts.drain_seconds,
        enqueue_batch=1000,
        enqueue_concurrency=2,
        result_scenario="drain",
        result_label=label,
    )
    values.update(more)
    return argparse.Namespace(**values)


async def _pgqueuer(
    opts: argparse.Namespace,
    servers: Servers,
    result: Result,
    batch_size: int,
    enqueue_jobs: int,
    latency_samples: int,
) -> dict[str, Any] | None:
    """pgqueuer's run (bench/peers.py) into `result`: its figures, or None (and a
    failure) when it could not run; a note when its drain did not run every job."""
    try:
        out = await run_pgqueuer(
            servers.database_url,
            jobs=opts.drain_tasks,
            enqueue_jobs=enqueue_jobs,
            workers=opts.drain_workers,
            batch_size=batch_size,
            enqueue_batch=1000,
            latency_samples=latency_samples,
            timeout_seconds=opts.drain_seconds,
        )
    except Exception as exc:
        result.failures.append(f"pgqueuer could not be run: {type(exc).__name__}: {exc}")
        return None
    drain = out.get("drain", {})
    if drain.get("jobs_run") != opts.drain_tasks:
        result.notes.append(f"pgqueuer ran {drain.get('jobs_run')} of {opts.drain_tasks} jobs")
    return out


_PGQ_CACHE: dict[str, Result] = {}


async def pgqueuer_once(opts: argparse.Namespace, servers: Servers) -> list[Result]:
    """pgqueuer's one run serves both the drain and the enqueue comparison: the first
    scenario to ask gets its result, a later one nothing (it is reported once)."""
    if "r" in _PGQ_CACHE:
        return []
    log("pgqueuer: batch enqueue, drain, enqueue-to-start latency")
    result = Result("pgqueuer", f"pgqueuer {opts.pgqueuer_version}")
    out = await _pgqueuer(opts, servers, result, opts.drain_max_tasks, opts.enqueue_tasks, 200)
    result.numbers = out or {}
    _PGQ_CACHE["r"] = result
    return [result]


ONE_SEPARATE = "one at a time, separate complete"
ONE_CARRIED = "one at a time, acks carried"


async def drain(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    single = await claim_throughput(_drain_opts(opts, "single ack"), servers, True, workdir)
    batch = await claim_throughput(
        _drain_opts(opts, "batch ack", batch_ack=True), servers, True, workdir
    )
    # A worker running one task at a time: two requests per task (its claim, and the
    # last task's complete beside it), then one (the claim carries the complete).
    separate = await claim_throughput(
        _drain_opts(opts, ONE_SEPARATE, max_tasks=1), servers, True, workdir
    )
    carried = await claim_throughput(
        _drain_opts(opts, ONE_CARRIED, max_tasks=1, carried=True),
        servers,
        True,
        workdir,
        daemon=carried_daemon,
    )
    peers = await pgqueuer_once(opts, servers)
    return [single, batch, separate, carried, *peers, await _pgqueuer_one_at_a_time(opts, servers)]


PGQ_ONE = "pgqueuer, one job at a time"


async def _pgqueuer_one_at_a_time(opts: argparse.Namespace, servers: Servers) -> Result:
    """pgqueuer's drain with a batch size of 1, the like-for-like peer of the gateway's
    one-at-a-time workers (its own drain fetches --drain-max-tasks jobs at a time). A
    figure shown beside the target, which stays against pgqueuer's drain as it runs."""
    result = Result("drain", PGQ_ONE)
    log("pgqueuer: drain, one job at a time")
    out = await _pgqueuer(opts, servers, result, 1, opts.drain_tasks, 0)
    if out is not None:
        drain = out.get("drain", {})
        result.numbers = {"tasks_per_second": drain.get("jobs_per_second"), "pgqueuer": drain}
    return result


def _cpu_ms_per_request(
    server_pid: int | None, before: tuple[float, float], requests: int
) -> dict[str, float | None]:
    """CPU the served process and this one (the load generator) used per request since
    `before` (their CPU seconds then): what each side of the loop cost, whatever else
    the machine was doing."""
    server, bench = cpu_seconds_tree(server_pid) - before[0], time.process_time() - before[1]
    return {
        "server_cpu_ms_per_request": round(1000.0 * server / requests, 2) if requests else None,
        "bench_cpu_ms_per_request": round(1000.0 * bench / requests, 2) if requests else None,
    }


# Asks the batch enqueue to answer the new tasks' ids only, as pgqueuer's batch
# enqueue answers its jobs' ids (RFC 7240).
IDS_ONLY = {"Prefer": "return=minimal"}


async def _enqueue_loop(
    api: Api,
    count: int,
    batch: int,
    concurrency: int,
    seconds: float,
    tally: Tally,
    headers: dict[str, str] | None = None,
) -> tuple[int, float, Any]:
    """`count` tasks in requests of `batch` (1 = the single endpoint); tasks created,
    seconds, and the last answer's body. Batch bodies are made before the clock
    starts, as pgqueuer's payloads are (bench/pgq_driver.py): what is timed is sending
    them and reading the answers."""
    made = [0]
    sent = [0]
    last: list[Any] = [None]
    sizes = {min(batch, count), count % batch or batch} if batch > 1 else set()
    bodies = {
        (k, n): orjson.dumps({"tasks": [{"payload": {"k": k, "i": i}} for i in range(n)]})
        for k in range(concurrency)
        for n in sizes
    }
    started = time.perf_counter()
    deadline = started + seconds

    async def sender(k: int) -> None:
        rt = f"bench-enq-{k:02d}"
        while time.perf_counter() < deadline and sent[0] < count:
            n = min(batch, count - sent[0])
            sent[0] += n
            if batch == 1:
                got = await api.post(f"/v1/runtimes/{rt}/tasks", {"payload": {"k": k}}, tally)
            else:
                path = f"/v1/runtimes/{rt}/tasks:batch"
                got = await api.post(path, bodies[k, n], tally, seconds=60, headers=headers)
            if got is not None and got[0] in (200, 201):
                made[0] += n
                last[0] = got[1]
            else:
                await asyncio.sleep(RETRY_PAUSE_SECONDS)

    await run_bounded([sender(k) for k in range(concurrency)], deadline + HANG_GRACE_SECONDS)
    return made[0], time.perf_counter() - started, last[0]


async def enqueue(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    batch_r = Result("enqueue", "gateway batch 1000")
    ids_r = Result("enqueue", "gateway batch 1000, ids only")
    single_r = Result("enqueue", "gateway single")
    async with (
        serving(opts, servers, workdir / "enqueue.log") as (proc, _db),
        client.session(80) as http,
    ):
        api = Api(http, proc.url, proc.token)

        async def measure(
            r: Result,
            what: str,
            count: int,
            batch: int,
            concurrency: int,
            seconds: float,
            headers: dict[str, str] | None = None,
        ) -> Any:
            """One loop of _enqueue_loop into `r`; the last answer's body."""
            log(f"enqueue: {what}")
            tally = Tally()
            before = (cpu_seconds_tree(proc.pid), time.process_time())
            made, secs, last = await _enqueue_loop(
                api, count, batch, concurrency, seconds, tally, headers
            )
            check_tally(r, "batch enqueue" if batch > 1 else "single enqueue", tally)
            rate = "tasks_per_second" if batch > 1 else "requests_per_second"
            r.numbers = {
                "tasks": made,
                "seconds": round(secs, 3),
                rate: round(made / secs, 1) if secs else None,
                "request_p50_ms": ms(percentile(tally.latencies, 50)),
                "request_p99_ms": ms(percentile(tally.latencies, 99)),
                **_cpu_ms_per_request(proc.pid, before, tally.responses),
            }
            if batch == 1:
                SAMPLES["enqueue/single"] = list(tally.latencies)
            return last

        n, batch_seconds = opts.enqueue_tasks, opts.drain_seconds
        whole = f"{n} tasks in batches of 1000, one at a time, whole tasks answered"
        await measure(batch_r, whole, n, 1000, 1, batch_seconds)
        ids = f"{n} tasks in batches of 1000, one at a time, ids answered (Prefer: return=minimal)"
        if not _ids_only(await measure(ids_r, ids, n, 1000, 1, batch_seconds, IDS_ONLY)):
            # A gateway that ignores the preference answers whole tasks: this row would
            # only repeat the one above.
            ids_r.numbers = {"available": False}
        single = f"single enqueues, {opts.connections} at a time"
        await measure(single_r, single, 10**9, 1, opts.connections, opts.poll_seconds)
        finish(batch_r, proc)
    return [batch_r, ids_r, single_r, *await pgqueuer_once(opts, servers)]


def _ids_only(answer: Any) -> bool:
    """Whether a batch enqueue's answer carries only the tasks' ids."""
    tasks = answer.get("tasks") if isinstance(answer, dict) else None
    if not isinstance(tasks, list) or not tasks:
        return False
    return all(isinstance(t, dict) and set(t) == {"id"} for t in tasks)


# -- workers: one uvicorn process or two ---------------------------------------


async def workers(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    out: list[Result] = []
    for n in (1, 2):
        r = await empty_polls_variant(
            opts, servers, workdir, f"{n} worker(s)", scenario="workers: empty polls", workers=n
        )
        out.append(r)
    for n in (1, 2):
        o = _drain_opts(
            opts,
            f"{n} worker(s)",
            workers=n,
            tasks=opts.workers_drain_tasks,
            result_scenario="workers: drain",
        )
        out.append(await claim_throughput(o, servers, True, workdir))
    return out


SUITES: dict[str, Suite] = {
    "empty-polls": empty_polls,
    "parked-polls": parked_polls,
    "wake-latency": wake_latency,
    "drain": drain,
    "enqueue": enqueue,
    "round-trips": round_trips,
    "workers": workers,
    "overload": overload,
    "schedules": schedules,
}
