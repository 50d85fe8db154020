"""`python -m bench.capacity`: the measured figures behind docs/capacity.md.

Three parts, each on a database of its own (`bench_<random>`, migrated with the gateway's
migrations, dropped at the end), over loopback only:

postgres: the gateway's own Store (gateway/store/, hence its statements from
gateway/store/sql/ with the parameters the routes pass) driven by --connections
concurrent asyncpg connections, one phase after the other, each bounded by
--phase-seconds (at most 20):

- enqueue: one task per statement (Store.enqueue), over --runtimes runtimes;
- claim: one task per claim (Store.claim with one slot) from that backlog, until a
  loop's runtimes run dry or the time is up;
- complete: the tasks claim leased (Store.complete);
- claim-empty: claims on runtimes with nothing queued: what a verdict miss costs;
- lifecycle: each connection enqueues, claims and completes one task on a runtime of
  its own, so the queue stays shallow, as in steady state: the cost of one task;
- lifecycle-batch: the same with a batch enqueue of --max-tasks tasks, one claim of
  --max-tasks, and a complete for each;
- token-lookup: the authenticator's lookup of a token by its hash, among --tokens
  tokens (each process caches a token for 2 s; a miss costs this);
- enqueue-batch: --batch-size tasks per statement (Store.enqueue_batch); last, since
  it leaves a deep backlog behind.

For each phase it reads the CPU seconds (user + system, /proc through psutil) of the
Postgres server processes that did the work: the backends of this database, plus the
walwriter, checkpointer and background writer (shared with whatever else the server
runs, so the figure errs high and ops per core-second low). The server must run on
this machine for that; otherwise only wall-clock rates are shown.

gateway: a gateway process (python -m uvicorn, as `python -m bench` starts it, cache
on), then:

- connections: its TCP connections to Redis and to Postgres, idle and with polls parked;
- parked polls: --parked-polls claims with wait_seconds 30 over --parked-runtimes
  runtimes, and the growth of its resident memory (VmRSS) per parked poll;
- Redis memory: MEMORY USAGE of the verdict keys (version and empty) of those runtimes;
- empty polls: --poll-concurrency loops of claims with wait_seconds 0 on the same
  (empty) runtimes, answered from the Redis verdict, for --phase-seconds; claims per
  second and per gateway core-second (the gateway's CPU seconds over the loop).

herd: --herd-gateways gateway processes on one database and one Redis prefix, as
replicas run, with --herd-polls polls parked on each of --herd-runtimes runtimes, first
spread over every process, then all of a runtime's on one process (as a load balancer
hashing on the runtime would place them). For each placement: the Postgres claims
(gateway_postgres_claims_total, summed) over --herd-idle-seconds with nothing enqueued,
per runtime and verdict TTL (GATEWAY_EMPTY_TTL_SECONDS, --herd-ttl-seconds), then per
task when one task is enqueued on each runtime.

The figures go to stdout as Markdown tables; progress to stderr; --json PATH keeps
them all. Servers are found as for `python -m bench`: flags, BENCH_* then TEST_* URLs,
else embedded servers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import asyncpg
import psutil
import redis.asyncio as aioredis

from bench.infra import (
    PROJECT_ROOT,
    GatewayProcess,
    check_servers,
    delete_redis_keys,
    fresh_database,
    log,
    resolve_servers,
)
from gateway.api.credential_bodies import Scope
from gateway.api.requests import EnqueueRequest
from gateway.auth.credentials import Credentials, TokenSpec
from gateway.auth.principals import hash_token
from gateway.metrics import Metrics
from gateway.redis.keys import keys_for
from gateway.store import Store

MAX_PHASE_SECONDS = 20.0
LEASE_SECONDS = 300.0  # longer than any run: no lease lapses while we measure
# Auxiliary server processes whose work we cause in part (WAL, dirty pages).
SHARED_BACKEND_TYPES = ("walwriter", "checkpointer", "background writer")
PAYLOAD = '{"command": "build", "repo": "example/app", "ref": "refs/heads/main", "n": 1}'
PARK_WAIT_SECONDS = 30


# -- Postgres CPU --------------------------------------------------------------


def _cpu_seconds(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(t.user + t.system)


class PostgresCpu:
    """CPU seconds used by the server processes serving one database (its backends and
    autovacuum workers) plus the shared WAL writer, checkpointer and background writer.
    Needs the server on this machine; `available` says whether it is."""

    def __init__(self, conn: asyncpg.Connection, database: str) -> None:
        self._conn = conn
        self._database = database
        self.available = False

    async def _pids(self) -> list[tuple[int, bool]]:
        """(pid, shared) of each process counted."""
        rows = await self._conn.fetch(
            "SELECT pid, backend_type = ANY($2) AS shared FROM pg_stat_activity"
            " WHERE (datname = $1 AND pid <> pg_backend_pid()) OR backend_type = ANY($2)",
            self._database,
            list(SHARED_BACKEND_TYPES),
        )
        return [(r["pid"], r["shared"]) for r in rows]

    async def probe(self) -> None:
        pid = await self._conn.fetchval("SELECT pg_backend_pid()")
        self.available = _cpu_seconds(pid) is not None

    async def snapshot(self) -> dict[tuple[int, bool], float]:
        if not self.available:
            return {}
        out = {}
        for pid, shared in await self._pids():
            seconds = _cpu_seconds(pid)
            if seconds is not None:
                out[pid, shared] = seconds
        return out

    @staticmethod
    def used(
        before: dict[tuple[int, bool], float], after: dict[tuple[int, bool], float]
    ) -> tuple[float, float]:
        """(all, shared) CPU seconds between two snapshots; a process new since `before`
        counts from 0. A process that ended between them is lost (short autovacuum
        workers)."""
        spent = {key: seconds - before.get(key, 0.0) for key, seconds in after.items()}
        return sum(spent.values()), sum(v for (_, shared), v in spent.items() if shared)


# -- Postgres phases -----------------------------------------------------------


@dataclass
class PhaseResult:
    phase: str
    connections: int
    seconds: float
    calls: int  # Store calls (statements or transactions sent)
    tasks: int  # tasks enqueued, claimed or completed; for claim-empty, 0
    errors: int
    pg_cpu_seconds: float | None
    pg_shared_cpu_seconds: float | None  # of which the WAL writer, checkpointer, bgwriter
    bench_cpu_seconds: float
    note: str = ""

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0

    @property
    def tasks_per_second(self) -> float:
        return self.tasks / self.seconds if self.seconds else 0.0

    def per_pg_core(self, count: int) -> float | None:
        if not self.pg_cpu_seconds:
            return None
        return count / self.pg_cpu_seconds


Op = Callable[[int, int], Awaitable[tuple[int, bool]]]


async def run_phase(
    name: str, cpu: PostgresCpu, connections: int, seconds: float, op: Op
) -> PhaseResult:
    """`connections` loops calling op(worker, iteration) -> (tasks, more) until the
    deadline, or until op says there is no more work for that loop."""
    calls = tasks = errors = 0
    deadline = 0.0  # set once the snapshots are taken: they may outlast a short phase
    stopped: list[float] = []

    async def loop(worker: int) -> None:
        nonlocal calls, tasks, errors
        i = 0
        while time.monotonic() < deadline:
            try:
                n, more = await op(worker, i)
            except Exception as exc:
                errors += 1
                if errors <= 3:
                    log(f"{name}: {type(exc).__name__}: {exc}")
                n, more = 0, errors < 100
            calls += 1
            tasks += n
            i += 1
            if not more:
                break
        stopped.append(time.monotonic())

    log(f"phase {name}: {connections} connections, at most {seconds:g} s")
    cpu_before = await cpu.snapshot()
    bench_before = time.process_time()
    started = time.monotonic()
    deadline = started + seconds
    await asyncio.gather(*(loop(w) for w in range(connections)))
    elapsed = max(stopped, default=time.monotonic()) - started
    bench_cpu = time.process_time() - bench_before
    cpu_after = await cpu.snapshot()
    pg_cpu, pg_shared = PostgresCpu.used(cpu_before, cpu_after) if cpu.available else (None, None)
    return PhaseResult(
        name, connections, elapsed, calls, tasks, errors, pg_cpu, pg_shared, bench_cpu
    )


def enqueue_request(n: int) -> EnqueueRequest:
    """What the route builds from {"payload": PAYLOAD}: defaults, no key."""
    return EnqueueRequest(
        payload_json=PAYLOAD,
        priority=50,
        max_attempts=5,
        run_at=None,
        delay_seconds=None,
        ttl_seconds=None,
        idempotency_key=None,
        request_hash=str(n),
    )


async def postgres_part(args: argparse.Namespace, admin_url: str) -> dict[str, Any]:
    c, runtimes, secs = args.connections, args.runtimes, args.phase_seconds
    results: list[PhaseResult] = []
    leases: list[tuple[uuid.UUID, uuid.UUID]] = []

    def rt(worker: int, i: int) -> str:
        return f"cap-{(worker + i * c) % runtimes}"

    async with fresh_database(admin_url) as url:
        database = urlsplit(url).path.lstrip("/")
        store = Store(
            url,
            Metrics(),
            min_size=c,
            max_size=c,
            statement_cache_size=args.statement_cache_size,
        )
        await store.open()
        watcher = await asyncpg.connect(admin_url)
        try:
            cpu = PostgresCpu(watcher, database)
            await cpu.probe()
            settings = {
                name: await watcher.fetchval(f"SHOW {name}")
                for name in ("server_version", "synchronous_commit", "fsync", "shared_buffers")
            }
            if not cpu.available:
                log("Postgres runs elsewhere: no CPU figures, wall-clock rates only")

            async def enqueue(worker: int, i: int) -> tuple[int, bool]:
                await store.enqueue(rt(worker, i), enqueue_request(i))
                return 1, True

            batch = [enqueue_request(i) for i in range(args.batch_size)]

            async def enqueue_batch(worker: int, i: int) -> tuple[int, bool]:
                await store.enqueue_batch(rt(worker, i), batch)
                return len(batch), True

            def claimer(slots: int) -> Op:
                workers, lease = ["capacity-bench"] * slots, [LEASE_SECONDS] * slots

                async def claim(worker: int, i: int) -> tuple[int, bool]:
                    got, _ = await store.claim(rt(worker, i), workers, lease)
                    leases.extend((x.task.id, x.task.lease_id) for x in got if x.task.lease_id)
                    # Fewer than asked: this loop's runtimes are running dry; stop it,
                    # so that the phase measures claims that find work.
                    return len(got), len(got) == slots

                return claim

            async def complete(worker: int, i: int) -> tuple[int, bool]:
                if not leases:
                    return 0, False
                task_id, lease_id = leases.pop()
                await store.complete(task_id, lease_id, None)
                return 1, True

            async def claim_empty(worker: int, i: int) -> tuple[int, bool]:
                got, _ = await store.claim(f"empty-{(worker + i * c) % runtimes}", ["w"], [60.0])
                return len(got), True

            def lifecycle(k: int) -> Op:
                workers, lease = ["capacity-bench"] * k, [LEASE_SECONDS] * k
                reqs = [enqueue_request(i) for i in range(k)]

                async def one_task_life(worker: int, i: int) -> tuple[int, bool]:
                    # The loop's own runtime, so the queue never holds more than k tasks.
                    runtime = f"life-{k}-{worker}"
                    if k == 1:
                        await store.enqueue(runtime, reqs[0])
                    else:
                        await store.enqueue_batch(runtime, reqs)
                    got, _ = await store.claim(runtime, workers, lease)
                    for x in got:
                        assert x.task.lease_id is not None
                        await store.complete(x.task.id, x.task.lease_id, None)
                    return len(got), True

                return one_task_life

            credentials = Credentials(store)
            token_hashes = []
            for n in range(args.tokens):
                spec = TokenSpec(name=f"capacity-{n}", scopes=(Scope.CLAIM,), runtimes=None)
                _, secret = await credentials.create_token(spec)
                token_hashes.append(hash_token(secret))

            async def token_lookup(worker: int, i: int) -> tuple[int, bool]:
                # What the authenticator does when its 2 s cache misses.
                found = await credentials.principal_by_hash(
                    token_hashes[(worker + i * c) % len(token_hashes)]
                )
                assert found is not None
                return 0, True

            phases: list[tuple[str, Op, str]] = [
                ("enqueue", enqueue, "one task per statement"),
                ("claim", claimer(1), "one task per claim, from the backlog enqueue left"),
                ("complete", complete, "the tasks claim leased"),
                ("claim-empty", claim_empty, "claims that find nothing (a verdict miss)"),
                ("lifecycle", lifecycle(1), "enqueue, claim, complete one task; queue shallow"),
                (
                    "lifecycle-batch",
                    lifecycle(args.max_tasks),
                    f"batch enqueue {args.max_tasks}, claim {args.max_tasks} at once, "
                    "complete each; queue shallow",
                ),
                (
                    "token-lookup",
                    token_lookup,
                    f"a token looked up by its hash, among {args.tokens}",
                ),
                ("enqueue-batch", enqueue_batch, f"{args.batch_size} tasks per statement"),
            ]
            for name, op, note in phases:
                results.append(await run_phase(name, cpu, c, secs, op))
                results[-1].note = note
            depth, _ = await store.queue_depth()
            # What the table and its indexes hold per stored task (payload PAYLOAD).
            await watcher.close()
            watcher = await asyncpg.connect(url)
            await watcher.execute("VACUUM ANALYZE tasks")
            sizes = await watcher.fetchrow(
                "SELECT pg_table_size('tasks') AS heap, pg_indexes_size('tasks') AS indexes,"
                " (SELECT count(*) FROM tasks) AS n_rows"
            )
        finally:
            await watcher.close()
            await store.close()
    return {
        "database": database,
        "settings": settings,
        "cpu_measured": cpu.available,
        "statement_cache_size": args.statement_cache_size,
        "phases": [asdict(r) for r in results],
        "tasks_by_status": depth,
        "bytes_per_row_heap": sizes["heap"] / max(sizes["n_rows"], 1),
        "bytes_per_row_indexes": sizes["indexes"] / max(sizes["n_rows"], 1),
        "_results": results,
    }


def postgres_table(part: dict[str, Any]) -> str:
    results: list[PhaseResult] = part["_results"]
    lines = [
        "| phase | conns | seconds | calls/s | tasks/s | pg cpu s | of which shared "
        "| calls per pg core-s | tasks per pg core-s | bench cpu s | errors | what |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        calls_core, tasks_core = r.per_pg_core(r.calls), r.per_pg_core(r.tasks)
        lines.append(
            f"| {r.phase} | {r.connections} | {r.seconds:.1f} | {r.calls_per_second:,.0f} "
            f"| {r.tasks_per_second:,.0f} "
            f"| {'-' if r.pg_cpu_seconds is None else f'{r.pg_cpu_seconds:.2f}'} "
            f"| {'-' if r.pg_shared_cpu_seconds is None else f'{r.pg_shared_cpu_seconds:.2f}'} "
            f"| {'-' if calls_core is None else f'{calls_core:,.0f}'} "
            f"| {'-' if tasks_core is None else f'{tasks_core:,.0f}'} "
            f"| {r.bench_cpu_seconds:.2f} | {r.errors} | {r.note} |"
        )
    settings = ", ".join(f"{k} {v}" for k, v in part["settings"].items())
    lines.append("")
    lines.append(
        f"Postgres: {settings}. Statement cache size: {part['statement_cache_size']}. "
        f"Tasks left by status: {part['tasks_by_status']}; per stored task, after VACUUM: "
        f"{part['bytes_per_row_heap']:.0f} B of table, {part['bytes_per_row_indexes']:.0f} B "
        f"of indexes ({len(PAYLOAD)}-byte payload)."
    )
    return "\n".join(lines)


# -- the gateway part ----------------------------------------------------------


def _rss_bytes(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _connections_to(pid: int, port: int) -> int:
    return len(_local_ports_to(pid, port))


def _local_ports_to(pid: int, port: int) -> set[int]:
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return {c.laddr.port for c in conns if c.raddr and c.raddr.port == port}


async def _redis_clients_of(client: aioredis.Redis, ports: set[int]) -> list[dict[str, Any]]:
    """CLIENT LIST entries of the connections whose local port is in `ports`."""
    return [c for c in await client.client_list() if int(str(c["addr"]).rsplit(":", 1)[1]) in ports]


async def _metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def _parked(http: aiohttp.ClientSession, url: str) -> float:
    return await _metric(http, url, "gateway_parked_polls")


@dataclass
class GatewayFigures:
    redis_connections_idle: int = 0
    postgres_connections_idle: int = 0
    redis_connections_parked: int = 0
    postgres_connections_parked: int = 0
    parked_polls: int = 0
    parked_runtimes: int = 0
    rss_before_bytes: int = 0
    rss_parked_bytes: int = 0
    version_key_bytes: float = 0.0
    empty_key_bytes: float = 0.0
    key_example: str = ""
    redis_clients_seen: int = 0  # in CLIENT LIST, matched by the gateway's local ports
    redis_pubsub_clients: int = 0
    redis_client_memory_bytes: int = 0  # sum of tot-mem over those clients
    poll_concurrency: int = 0
    poll_seconds: float = 0.0
    polls: int = 0
    poll_errors: int = 0
    gateway_cpu_seconds: float = 0.0
    bench_cpu_seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_per_parked_poll(self) -> float:
        grown = self.rss_parked_bytes - self.rss_before_bytes
        return grown / self.parked_polls if self.parked_polls else 0.0

    @property
    def polls_per_gateway_core_second(self) -> float:
        return self.polls / self.gateway_cpu_seconds if self.gateway_cpu_seconds else 0.0


async def gateway_part(
    args: argparse.Namespace, database_url: str, redis_url: str
) -> GatewayFigures:
    fig = GatewayFigures(parked_polls=args.parked_polls, parked_runtimes=args.parked_runtimes)
    redis_port = urlsplit(redis_url).port or 6379
    pg_port = urlsplit(database_url).port or 5432
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        async with fresh_database(database_url) as url:
            gw = GatewayProcess(url, redis_url, cache=True, log_path=Path(tmp) / "gateway.log")
            try:
                await gw.start()
                assert gw.pid is not None
                await _measure_gateway(args, gw, gw.pid, redis_port, pg_port, redis_url, fig)
            finally:
                await gw.stop()
                await delete_redis_keys(redis_url, gw.prefix)
    return fig


async def _measure_gateway(
    args: argparse.Namespace,
    gw: GatewayProcess,
    pid: int,
    redis_port: int,
    pg_port: int,
    redis_url: str,
    fig: GatewayFigures,
) -> None:
    headers = {"Authorization": f"Bearer {gw.token}"}
    runtimes = [f"park-{i}" for i in range(args.parked_runtimes)]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=PARK_WAIT_SECONDS + 30)
    async with aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout) as http:

        async def claim(runtime: str, worker: str, wait: int) -> int:
            body = {"worker_id": worker, "wait_seconds": wait}
            async with http.post(f"{gw.url}/v1/runtimes/{runtime}/claim", json=body) as resp:
                await resp.read()
                return resp.status

        # Warm up: every runtime's verdict written, the pool and the interpreter settled.
        for _ in range(2):
            await asyncio.gather(*(claim(rt, "warm", 0) for rt in runtimes))
        await asyncio.sleep(1.0)
        fig.redis_connections_idle = _connections_to(pid, redis_port)
        fig.postgres_connections_idle = _connections_to(pid, pg_port)
        fig.rss_before_bytes = _rss_bytes(pid)

        log(f"parking {args.parked_polls} polls over {len(runtimes)} runtimes")
        parked = [
            asyncio.create_task(claim(runtimes[i % len(runtimes)], f"d{i}", PARK_WAIT_SECONDS))
            for i in range(args.parked_polls)
        ]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and await _parked(http, gw.url) < args.parked_polls:
            await asyncio.sleep(0.25)
        fig.parked_polls = int(await _parked(http, gw.url))
        await asyncio.sleep(1.0)
        fig.rss_parked_bytes = _rss_bytes(pid)
        fig.redis_connections_parked = _connections_to(pid, redis_port)
        fig.postgres_connections_parked = _connections_to(pid, pg_port)

        client = aioredis.Redis.from_url(redis_url, socket_timeout=5)
        try:
            version_sizes, empty_sizes = [], []
            for rt in runtimes:
                k = keys_for(gw.prefix, rt)
                version_sizes.append(await client.memory_usage(k.version) or 0)
                empty_sizes.append(await client.memory_usage(k.empty) or 0)
            fig.version_key_bytes = sum(version_sizes) / len(version_sizes)
            fig.empty_key_bytes = sum(empty_sizes) / len(empty_sizes)
            fig.key_example = keys_for(gw.prefix, runtimes[0]).empty
            mine = await _redis_clients_of(client, _local_ports_to(pid, redis_port))
            fig.redis_clients_seen = len(mine)
            fig.redis_pubsub_clients = sum(1 for c in mine if "P" in str(c.get("flags", "")))
            fig.redis_client_memory_bytes = sum(int(c.get("tot-mem", 0)) for c in mine)
        finally:
            await client.aclose()
        for task in parked:
            task.cancel()
        await asyncio.gather(*parked, return_exceptions=True)

    # Empty polls on a fresh session: the parked ones' connections are gone.
    await asyncio.sleep(2.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        headers=headers, connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as http:
        statuses: dict[str, int] = {}
        deadline = time.monotonic() + args.phase_seconds

        async def loop(n: int) -> None:
            i = n
            while time.monotonic() < deadline:
                try:
                    status = str(await claim_plain(http, gw, runtimes[i % len(runtimes)]))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status = type(exc).__name__
                statuses[status] = statuses.get(status, 0) + 1
                i += args.poll_concurrency

        log(f"empty polls: {args.poll_concurrency} loops, {args.phase_seconds:g} s")
        gw_proc = psutil.Process(pid)
        gw_before = sum(gw_proc.cpu_times()[:2])
        bench_before = time.process_time()
        started = time.monotonic()
        await asyncio.gather(*(loop(n) for n in range(args.poll_concurrency)))
        fig.poll_seconds = time.monotonic() - started
        fig.gateway_cpu_seconds = sum(gw_proc.cpu_times()[:2]) - gw_before
        fig.bench_cpu_seconds = time.process_time() - bench_before
        fig.poll_concurrency = args.poll_concurrency
        fig.polls = statuses.get("200", 0)
        fig.poll_errors = sum(n for s, n in statuses.items() if s != "200")
        fig.statuses = statuses


async def claim_plain(http: aiohttp.ClientSession, gw: GatewayProcess, runtime: str) -> int:
    body = {"worker_id": "poller", "wait_seconds": 0}
    async with http.post(f"{gw.url}/v1/runtimes/{runtime}/claim", json=body) as resp:
        await resp.read()
        return resp.status


def gateway_table(fig: GatewayFigures) -> str:
    mib = 1024 * 1024
    rows = [
        (
            "connections to Redis, idle / with polls parked",
            f"{fig.redis_connections_idle} / {fig.redis_connections_parked}",
        ),
        (
            "connections to Postgres, idle / with polls parked",
            f"{fig.postgres_connections_idle} / {fig.postgres_connections_parked}",
        ),
        (
            "polls parked (gateway_parked_polls), runtimes",
            f"{fig.parked_polls:,}, {fig.parked_runtimes:,}",
        ),
        (
            "RSS before parking / parked",
            f"{fig.rss_before_bytes / mib:.1f} MiB / {fig.rss_parked_bytes / mib:.1f} MiB",
        ),
        ("RSS growth per parked poll", f"{fig.bytes_per_parked_poll / 1024:.1f} KiB"),
        (
            "Redis CLIENT LIST: the gateway's clients, of which pub/sub, their tot-mem",
            f"{fig.redis_clients_seen}, {fig.redis_pubsub_clients}, "
            f"{fig.redis_client_memory_bytes / 1024:.0f} KiB",
        ),
        (
            "Redis MEMORY USAGE, version key / empty key",
            f"{fig.version_key_bytes:.0f} B / {fig.empty_key_bytes:.0f} B (e.g. {fig.key_example})",
        ),
        (
            "empty polls (wait_seconds 0), concurrency",
            f"{fig.polls:,} in {fig.poll_seconds:.1f} s, {fig.poll_concurrency}",
        ),
        (
            "empty polls per second",
            f"{fig.polls / fig.poll_seconds:,.0f}" if fig.poll_seconds else "-",
        ),
        (
            "gateway CPU seconds / bench CPU seconds",
            f"{fig.gateway_cpu_seconds:.2f} / {fig.bench_cpu_seconds:.2f}",
        ),
        ("empty polls per gateway core-second", f"{fig.polls_per_gateway_core_second:,.0f}"),
        ("answers other than 200", f"{fig.poll_errors} {fig.statuses}"),
    ]
    lines = ["| gateway figure | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


# -- the herd part: Postgres claims per task with several gateway processes ----------


@dataclass
class HerdFigures:
    mode: str  # spread: each runtime's polls over every process; routed: one process
    gateways: int
    runtimes: int
    polls_per_runtime: int
    tasks: int = 0
    delivered: int = 0
    claims_for_tasks: float = 0.0  # Postgres claims from the first enqueue until settled
    idle_seconds: float = 0.0
    idle_claims: float = 0.0  # Postgres claims while nothing was enqueued
    empty_ttl_seconds: float = 0.0

    @property
    def claims_per_task(self) -> float:
        return self.claims_for_tasks / self.tasks if self.tasks else 0.0

    @property
    def idle_claims_per_runtime_and_ttl(self) -> float:
        periods = self.idle_seconds / self.empty_ttl_seconds if self.empty_ttl_seconds else 0
        return self.idle_claims / (self.runtimes * periods) if periods else 0.0


async def herd_part(
    args: argparse.Namespace, database_url: str, redis_url: str
) -> list[HerdFigures]:
    """--herd-gateways processes on one database and one Redis prefix (as replicas are);
    each runtime gets --herd-polls parked polls, spread over every process or routed to
    one; then one task per runtime is enqueued, and the Postgres claims it caused are
    counted, then those of --herd-idle-seconds without enqueues."""
    out = []
    env = {"GATEWAY_EMPTY_TTL_SECONDS": f"{args.herd_ttl_seconds:g}"}
    with tempfile.TemporaryDirectory(prefix="capacity-herd-") as tmp:
        async with fresh_database(database_url) as url:
            first = GatewayProcess(url, redis_url, True, Path(tmp) / "gw0.log", extra_env=env)
            gws = [first] + [
                GatewayProcess(
                    url,
                    redis_url,
                    True,
                    Path(tmp) / f"gw{i}.log",
                    extra_env=env,
                    prefix=first.prefix,
                )
                for i in range(1, args.herd_gateways)
            ]
            try:
                for gw in gws:
                    await gw.start()
                for mode in ("spread", "routed"):
                    out.append(await _herd(args, gws, mode))
            finally:
                for gw in gws:
                    await gw.stop()
                await delete_redis_keys(redis_url, first.prefix)
    return out


async def _herd(args: argparse.Namespace, gws: list[GatewayProcess], mode: str) -> HerdFigures:
    fig = HerdFigures(mode, len(gws), args.herd_runtimes, args.herd_polls)
    fig.empty_ttl_seconds = args.herd_ttl_seconds
    runtimes = [f"herd-{mode}-{i}" for i in range(args.herd_runtimes)]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=PARK_WAIT_SECONDS + 30)
    ) as http:

        def auth(gw: GatewayProcess) -> dict[str, str]:
            return {"Authorization": f"Bearer {gw.token}"}

        async def poll(gw: GatewayProcess, runtime: str, n: int) -> int:
            body = {"worker_id": f"d{n}", "wait_seconds": PARK_WAIT_SECONDS}
            url = f"{gw.url}/v1/runtimes/{runtime}/claim"
            async with http.post(url, json=body, headers=auth(gw)) as resp:
                return len((await resp.json()).get("tasks", []))

        async def claims() -> float:
            values = [await _metric(http, gw.url, "gateway_postgres_claims_total") for gw in gws]
            return sum(values)

        expected = [0] * len(gws)
        polls = []
        for i, rt in enumerate(runtimes):
            for n in range(args.herd_polls):
                g = (i + n) % len(gws) if mode == "spread" else i % len(gws)
                expected[g] += 1
                polls.append(asyncio.create_task(poll(gws[g], rt, n)))
        deadline = time.monotonic() + 20
        for g, gw in enumerate(gws):
            while time.monotonic() < deadline and await _parked(http, gw.url) < expected[g]:
                await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # every process's first verdict written and parked on

        before = await claims()
        started = time.monotonic()
        await asyncio.sleep(args.herd_idle_seconds)
        fig.idle_claims = await claims() - before
        fig.idle_seconds = time.monotonic() - started

        before = await claims()
        for rt in runtimes:
            body = {"payload": {"herd": rt}}
            url = f"{gws[0].url}/v1/runtimes/{rt}/tasks"
            async with http.post(url, json=body, headers=auth(gws[0])) as resp:
                fig.tasks += resp.status == 201
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            fig.delivered = sum(p.result() for p in polls if p.done() and not p.exception())
            if fig.delivered >= fig.tasks:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # the processes that lost the race finish their claims
        fig.claims_for_tasks = await claims() - before
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    return fig


def herd_table(figs: Sequence[HerdFigures]) -> str:
    lines = [
        "| polls of a runtime | processes | runtimes | polls per runtime | tasks | delivered "
        "| pg claims per task | idle pg claims per runtime per verdict TTL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in figs:
        where = "spread over every process" if f.mode == "spread" else "all on one process"
        lines.append(
            f"| {where} | {f.gateways} | {f.runtimes} | {f.polls_per_runtime} | {f.tasks} "
            f"| {f.delivered} | {f.claims_per_task:.2f} "
            f"| {f.idle_claims_per_runtime_and_ttl:.2f} ({f.idle_claims:.0f} claims in "
            f"{f.idle_seconds:.1f} s, TTL {f.empty_ttl_seconds:g} s) |"
        )
    return "\n".join(lines)


# -- command line --------------------------------------------------------------


def git_commit() -> str:
    """The commit measured, with "+changes" when the work tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_PHASE_SECONDS:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_PHASE_SECONDS:g}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.capacity",
        description=(__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--database-url", help="Postgres (its role must be allowed to CREATE DATABASE)")
    p.add_argument("--redis-url", help="Redis")
    p.add_argument(
        "--part",
        choices=("postgres", "gateway", "herd", "all"),
        default="all",
        help="which part to run (all)",
    )
    p.add_argument("--connections", type=int, default=8, help="Postgres connections (8)")
    p.add_argument("--phase-seconds", type=_seconds, default=10.0, help="per phase, <= 20 (10)")
    p.add_argument("--runtimes", type=int, default=200, help="runtimes the tasks go to (200)")
    p.add_argument(
        "--statement-cache-size",
        type=int,
        default=100,
        help="asyncpg's statement cache, as GATEWAY_DB_STATEMENT_CACHE_SIZE (100; 0 is what "
        "the gateway runs with behind PgBouncer)",
    )
    p.add_argument("--tokens", type=int, default=1000, help="tokens to look up (1000)")
    p.add_argument("--batch-size", type=int, default=100, help="tasks per batch enqueue (100)")
    p.add_argument("--max-tasks", type=int, default=10, help="tasks per batch claim (10)")
    p.add_argument("--parked-polls", type=int, default=2000, help="polls to park (2000)")
    p.add_argument("--parked-runtimes", type=int, default=200, help="over this many runtimes (200)")
    p.add_argument("--poll-concurrency", type=int, default=50, help="empty-poll loops (50)")
    p.add_argument("--herd-gateways", type=int, default=4, help="herd: processes (4)")
    p.add_argument("--herd-runtimes", type=int, default=20, help="herd: runtimes (20)")
    p.add_argument("--herd-polls", type=int, default=8, help="herd: polls per runtime (8)")
    p.add_argument(
        "--herd-ttl-seconds",
        type=float,
        default=2.0,
        help="herd: GATEWAY_EMPTY_TTL_SECONDS of its processes, short so that expiries "
        "show within --herd-idle-seconds (2)",
    )
    p.add_argument(
        "--herd-idle-seconds", type=_seconds, default=6.0, help="herd: idle time measured (6)"
    )
    p.add_argument("--json", type=Path, help="write every figure to this file")
    return p


async def run(args: argparse.Namespace) -> dict[str, Any]:
    servers = resolve_servers(args.database_url, args.redis_url)
    try:
        await check_servers(servers)
        load = os.getloadavg()
        out: dict[str, Any] = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start",
            "commit": git_commit(),
        }
        print(f"{out['date_utc']} UTC; {out['machine']}; commit {out['commit']}\n")
        if args.part in ("postgres", "all"):
            part = await postgres_part(args, servers.database_url)
            print(postgres_table(part) + "\n")
            part.pop("_results")
            out["postgres"] = part
        if args.part in ("gateway", "all"):
            fig = await gateway_part(args, servers.database_url, servers.redis_url)
            print(gateway_table(fig) + "\n")
            out["gateway"] = asdict(fig) | {
                "bytes_per_parked_poll": fig.bytes_per_parked_poll,
                "polls_per_gateway_core_second": fig.polls_per_gateway_core_second,
            }
        if args.part in ("herd", "all"):
            herd = await herd_part(args, servers.database_url, servers.redis_url)
            print(herd_table(herd) + "\n")
            out["herd"] = [
                asdict(f)
                | {
                    "claims_per_task": f.claims_per_task,
                    "idle_claims_per_runtime_and_ttl": f.idle_claims_per_runtime_and_ttl,
                }
                for f in herd
            ]
        return out
    finally:
        servers.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.parked_polls * 2 + 1000
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    out = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
