"""The soak: the fault matrix's rig, load and checker run for minutes instead of
seconds, with a Redis SIGKILL + restart part way through, sampling what would show a
leak or a janitor falling behind.

`python -m tests.faults.soak` (`make soak MINUTES=10`) prints a markdown report and
exits 1 unless every bound holds: each gateway's RSS grows less than
`Bounds.rss_mib_per_minute` over the last half (least-squares slope), the Postgres
backends of the run's database and Redis's connected clients stay within a bounded
spread over the last half, the checker finds no task lost or duplicated and no
stale-empty answer, and the oldest due queued task never waited past
`Bounds.oldest_due_seconds`. Uses FAULTS_DATABASE_URL or TEST_DATABASE_URL when set,
else a private Postgres cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

import asyncpg
import psutil
import redis.asyncio as aioredis

from tests.faults.checker import Verdict, check
from tests.faults.load import Load, LoadShape
from tests.faults.matrix import counter, drain, read_rows
from tests.faults.rig import (
    JANITOR_INTERVAL_SECONDS,
    REPAIR_BOUND_SECONDS,
    Rig,
    repair_bound_seconds,
    rig,
)
from tests.faults.servers import log

MIB = 1024 * 1024
SAMPLE_EVERY_SECONDS = 10.0
REDIS_FAULT_AT = 0.4  # of the run: the last half, which the bounds judge, starts after it
REDIS_DOWN_SECONDS = 2.0
DRAIN_SECONDS = 40.0
RUNTIMES = 500

SHAPE = LoadShape(
    runtimes=tuple(f"soak-{i:03d}" for i in range(RUNTIMES)),
    enqueue_rate=40.0,
    workers_per_runtime=1,
    wait_seconds=20.0,  # every runtime's pollers park for long, as real daemons do
    sparse_wait_seconds=20.0,
    lease_seconds=10,
    abandon_every=50,
    fail_every=10,
    retry_after_seconds=1.0,
    cancel_every=20,
    connections=2 * RUNTIMES + 200,  # every parked poll, plus enqueues and completes
)


@dataclass(frozen=True)
class Bounds:
    """What the last half of a run must stay within (see RELIABILITY.md's Soak for why
    these figures)."""

    rss_mib_per_minute: float = 1.0  # each gateway's least-squares RSS slope
    pg_spread: int = 6  # max - min Postgres backends of the run's database
    redis_spread: int = 6  # max - min of Redis's connected_clients
    # Over the whole run: how long a queued task has been due. The checker's bound for
    # a claimable task hidden from a poll (two janitor passes, the breaker, one
    # degraded poll, plus 1 s); a janitor or pollers falling behind grow it for good.
    oldest_due_seconds: float = REPAIR_BOUND_SECONDS


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the load started
    rss_mib: tuple[float, ...]  # per gateway, by the pid the rig started
    pg_connections: int  # backends on the run's database, the sampler's own excluded
    redis_clients: int  # Redis's connected_clients, the sampler's own included
    oldest_due_seconds: float  # the oldest queued task's age since its run_at; 0 if none
    finished: int  # tasks completed or cancelled so far
    # The oldest due task's attempts and last error, to tell a fresh task from a retry
    # after a fail or one the janitor handed on; '' when none is due.
    oldest_due_kind: str = ""


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value per minute; 0 for
    fewer than two distinct times."""
    if len({t for t, _ in points}) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return cov / var * 60.0


def last_half(samples: list[Sample]) -> list[Sample]:
    """The samples taken in the second half of the sampled time."""
    if not samples:
        return []
    middle = (samples[0].at + samples[-1].at) / 2
    return [s for s in samples if s.at >= middle]


@dataclass
class Figures:
    """What the verdict judges, computed from the samples."""

    rss_slopes: list[float]  # MiB/min per gateway, over the last half
    pg_range: tuple[int, int]  # (min, max) over the last half
    redis_range: tuple[int, int]
    oldest_due_max: float  # s, over the whole run


def figures(samples: list[Sample]) -> Figures:
    half = last_half(samples)
    gateways = len(samples[0].rss_mib) if samples else 0
    slopes = [slope_per_minute([(s.at, s.rss_mib[g]) for s in half]) for g in range(gateways)]
    pg = [s.pg_connections for s in half] or [0]
    rd = [s.redis_clients for s in half] or [0]
    due = max((s.oldest_due_seconds for s in samples), default=0.0)
    return Figures(slopes, (min(pg), max(pg)), (min(rd), max(rd)), due)


def failures(figs: Figures, samples: int, bounds: Bounds) -> list[str]:
    """Why the run fails its bounds (empty: it holds them). The checker's verdict and
    the fault's proof are judged apart."""
    found = []
    if samples < 4:
        found.append(f"only {samples} samples: too short to judge")
    for g, rate in enumerate(figs.rss_slopes):
        if rate > bounds.rss_mib_per_minute:
            found.append(f"gateway {g} RSS grew {rate:.2f} MiB/min > {bounds.rss_mib_per_minute}")
    for what, (low, high), bound in (
        ("Postgres connections", figs.pg_range, bounds.pg_spread),
        ("Redis clients", figs.redis_range, bounds.redis_spread),
    ):
        if high - low > bound:
            found.append(f"{what} ranged {low}..{high} over the last half, spread > {bound}")
    if figs.oldest_due_max > bounds.oldest_due_seconds:
        found.append(
            f"a due task waited {figs.oldest_due_max:.1f}s queued > {bounds.oldest_due_seconds}s"
        )
    return found


@dataclass
class Sampler:
    """Takes a `Sample` of the rig every SAMPLE_EVERY_SECONDS."""

    rig: Rig
    started: float
    samples: list[Sample] = field(default_factory=list)

    async def take(self, conn: asyncpg.Connection) -> Sample:
        rss = []
        for g in self.rig.gateways:
            try:
                pid = g.process.pid if g.process is not None else -1
                rss.append(psutil.Process(pid).memory_info().rss / MIB)
            except psutil.Error:
                rss.append(0.0)
        row = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            "        AND pid <> pg_backend_pid())::int AS pg,"
            " (SELECT coalesce(extract(epoch FROM now() - min(run_at)), 0)::float8 FROM tasks"
            "   WHERE status = 'queued' AND run_at <= now()) AS due,"
            " (SELECT count(*) FROM tasks WHERE status IN ('completed', 'cancelled'))::int"
            "   AS finished,"
            " (SELECT 'attempts ' || attempts || ', ' || coalesce(last_error, 'no error')"
            "   FROM tasks WHERE status = 'queued' AND run_at <= now()"
            "  ORDER BY run_at LIMIT 1) AS due_kind"
        )
        assert row is not None
        clients = -1  # Redis down at that moment
        client = aioredis.Redis.from_url(self.rig.redis.url, socket_timeout=2)
        with contextlib.suppress(OSError, aioredis.RedisError):
            clients = int((await client.info("clients"))["connected_clients"])
        await client.aclose()
        at = time.monotonic() - self.started
        return Sample(
            at, tuple(rss), row["pg"], clients, row["due"], row["finished"], row["due_kind"] or ""
        )

    async def run(self) -> None:
        conn = await asyncpg.connect(self.rig.database_url, timeout=10)
        try:
            while True:
                sample = await self.take(conn)
                self.samples.append(sample)
                rss = " ".join(f"{r:.1f}" for r in sample.rss_mib)
                kind = sample.oldest_due_kind or "none"
                log(f"t={sample.at:5.0f}s rss {rss} MiB, pg {sample.pg_connections}, "
                    f"redis {sample.redis_clients}, due {sample.oldest_due_seconds:.1f}s "
                    f"({kind}), finished {sample.finished}")  # fmt: skip
                await asyncio.sleep(SAMPLE_EVERY_SECONDS)
        finally:
            await conn.close()


@dataclass
class SoakResult:
    minutes: float
    samples: list[Sample]
    verdict: Verdict
    tasks: int
    server_errors: int
    released: int
    redis_errors: float  # gateway_redis_errors_total growth across the Redis fault

    def problems(self, bounds: Bounds) -> list[str]:
        found = failures(figures(self.samples), len(self.samples), bounds)
        v = self.verdict
        found += v.problems()
        if self.redis_errors <= 0:
            found.append("gateway_redis_errors_total did not grow: the Redis kill left no trace")
        return found


async def _redis_fault(r: Rig) -> float:
    """SIGKILL Redis, start it again empty after REDIS_DOWN_SECONDS; the growth of
    the gateways' Redis error counter across it."""
    before = await counter(r, "gateway_redis_errors_total")
    log("Redis SIGKILLed")
    r.redis.kill()
    await asyncio.sleep(REDIS_DOWN_SECONDS)
    await asyncio.to_thread(r.redis.start)
    log("Redis started again, empty")
    await asyncio.sleep(SAMPLE_EVERY_SECONDS)
    return await counter(r, "gateway_redis_errors_total") - before


async def run(minutes: float, admin_url: str | None, shape: LoadShape = SHAPE) -> SoakResult:
    seconds = minutes * 60
    async with rig(admin_url) as r:
        load = Load(r.urls, r.token, shape)
        started = time.monotonic()
        await load.start()
        sampler = Sampler(r, started)
        sampling = asyncio.create_task(sampler.run())
        try:
            await asyncio.sleep(seconds * REDIS_FAULT_AT)
            redis_errors = await _redis_fault(r)
            await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
            await load.stop_producing()
            await drain(r, DRAIN_SECONDS)
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            await load.stop()
        rows, checked_at, released = await read_rows(r)
    verdict = check(
        load.history, rows, checked_at=checked_at,
        janitor_interval=JANITOR_INTERVAL_SECONDS,
        repair_bound=repair_bound_seconds(len(load.shape.runtimes)),
    )  # fmt: skip
    tasks = len({row.task_id for row in rows} | {e.task_id for e in load.history.enqueues})
    return SoakResult(
        minutes, sampler.samples, verdict, tasks, load.server_errors, released, redis_errors
    )


def report(result: SoakResult, bounds: Bounds) -> str:
    """The run as markdown: the figures against their bounds, the checker's counts,
    then every sample."""
    figs = figures(result.samples)
    v = result.verdict
    slopes = ", ".join(f"{s:+.2f}" for s in figs.rss_slopes)
    problems = result.problems(bounds)
    lines = [
        f"## Soak, {result.minutes:g} min: {'PASS' if not problems else 'FAIL'}",
        "",
        "| figure | value | bound |",
        "|---|---|---|",
        f"| RSS slope, last half (MiB/min per gateway) | {slopes} | "
        f"≤ {bounds.rss_mib_per_minute} |",
        f"| Postgres connections, last half | {figs.pg_range[0]}..{figs.pg_range[1]} | "
        f"spread ≤ {bounds.pg_spread} |",
        f"| Redis connected clients, last half | {figs.redis_range[0]}..{figs.redis_range[1]}"
        f" | spread ≤ {bounds.redis_spread} |",
        f"| oldest due queued task, whole run | {figs.oldest_due_max:.1f} s | "
        f"≤ {bounds.oldest_due_seconds} s |",
        f"| tasks (completed once / cancelled) | {result.tasks} ({len(v.completed_once)} / "
        f"{len(v.cancelled)}) | all |",
        # An acknowledged write undone counts as lost, a completion undone as duplicated.
        f"| lost / duplicated / stale-empty | "
        f"{len(v.lost) + len(v.unresolved) + len(v.acknowledged_lost)} / "
        f"{len(v.duplicated) + len(v.resurrected)} / {len(v.stale_empty)} | 0 / 0 / 0 |",
        f"| 5xx answers / tasks handed out more than once | {result.server_errors} / "
        f"{result.released} | counted |",
        f"| gateway Redis errors across the Redis kill | {result.redis_errors:.0f} | > 0 |",
        "",
        "| t (s) | RSS (MiB) | Postgres conns | Redis clients | oldest due (s) | finished |"
        " oldest due task |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in result.samples:
        rss = " / ".join(f"{r:.1f}" for r in s.rss_mib)
        lines.append(
            f"| {s.at:.0f} | {rss} | {s.pg_connections} | {s.redis_clients} | "
            f"{s.oldest_due_seconds:.1f} | {s.finished} | {s.oldest_due_kind} |"
        )
    lines += ["", *(f"- {p}" for p in problems[:30])]
    return "\n".join(lines)


def main() -> int:
    """SOAK_MINUTES (default 10) of soak; the report on stdout; 1 unless it passed."""
    minutes = float(os.environ.get("SOAK_MINUTES") or 10)
    admin_url = os.environ.get("FAULTS_DATABASE_URL") or os.environ.get("TEST_DATABASE_URL")
    bounds = Bounds()
    log(f"soak for {minutes:g} min over {RUNTIMES} runtimes and two gateways")
    result = asyncio.run(run(minutes, admin_url))
    print(report(result, bounds))
    return 1 if result.problems(bounds) else 0


if __name__ == "__main__":
    sys.exit(main())
