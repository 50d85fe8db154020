"""Drives pgqueuer, the peer the gateway's drain and batch enqueue are compared with.

Runs in the peer's own virtual environment (see `bench/peers.py`), never in the
project's: this file imports nothing from the project. It expects pgqueuer's schema to
be installed already (`pgq install`), and prints one JSON object on stdout:

1. batch enqueue: `--jobs` no-op jobs in calls of `--enqueue-batch` (one connection,
   one call at a time), timed; job i of a call carries the payload `{"k":0,"i":i}`,
   the bytes the gateway's batch items carry and store in the same scenario;
2. drain: `--workers` QueueManagers, each on a connection of its own, in drain mode
   with batch size `--batch-size`, until every job ran (bounded by `--timeout-seconds`);
3. enqueue-to-start: one QueueManager listening; `--latency-samples` jobs enqueued one
   at a time, each timed from its enqueue call returning to its entrypoint starting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "bench_noop"


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _payloads(batch: int) -> list[bytes]:
    """The payloads the gateway's batch requests carry ({"k": k, "i": i}, k = 0 for the
    one sender), serialized as the gateway stores them, made before the clock starts:
    both sides then store the same data."""
    return [json.dumps({"k": 0, "i": i}, separators=(",", ":")).encode() for i in range(batch)]


async def _batch_enqueue(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        payloads = _payloads(batch)
        latencies: list[float] = []
        started = time.perf_counter()
        cpu_started = time.process_time()
        done = 0
        while done < jobs:
            n = min(batch, jobs - done)
            t0 = time.perf_counter()
            await queries.enqueue([ENTRYPOINT] * n, payloads[:n], [0] * n)
            latencies.append(time.perf_counter() - t0)
            done += n
        seconds = time.perf_counter() - started
        cpu_seconds = time.process_time() - cpu_started
    finally:
        await conn.close()
    return {
        "jobs": done,
        "calls": len(latencies),
        "seconds": round(seconds, 3),
        # This process's CPU per call: the counterpart of the gateway's
        # server_cpu_ms_per_request (the rest of a call is Postgres and waiting).
        "driver_cpu_ms_per_call": round(1000.0 * cpu_seconds / len(latencies), 2)
        if latencies
        else None,
        "jobs_per_second": round(done / seconds, 1) if seconds > 0 else None,
        "call_p50_ms": _ms(_percentile(latencies, 50)),
        "call_p99_ms": _ms(_percentile(latencies, 99)),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 2)


async def _drain(dsn: str, workers: int, batch_size: int, timeout: float) -> dict[str, Any]:
    ran: list[int] = [0]
    connections = [await asyncpg.connect(dsn) for _ in range(workers)]
    managers: list[QueueManager] = []
    for conn in connections:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            ran[0] += 1

        managers.append(qm)
    started = time.perf_counter()
    runs = [
        asyncio.create_task(qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain))
        for qm in managers
    ]
    try:
        _, pending = await asyncio.wait(runs, timeout=timeout)
        seconds = time.perf_counter() - started
        for qm in managers:
            qm.shutdown.set()
        if pending:
            await asyncio.wait(pending, timeout=10)
    finally:
        for task in runs:
            task.cancel()
        for conn in connections:
            conn.terminate()
    return {
        "workers": workers,
        "batch_size": batch_size,
        "jobs_run": ran[0],
        "seconds": round(seconds, 3),
        "jobs_per_second": round(ran[0] / seconds, 1) if seconds > 0 else None,
        "timed_out": bool(pending),
    }


async def _latency(dsn: str, samples: int, timeout: float) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    producer = await asyncpg.connect(dsn)
    enqueued_at: dict[str, float] = {}
    started_at: dict[str, float] = {}
    arrived = asyncio.Event()
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def record(job: Job) -> None:
        started_at[(job.payload or b"").decode()] = time.perf_counter()
        arrived.set()

    run = asyncio.create_task(qm.run(batch_size=1))
    latencies: list[float] = []
    deadline = time.perf_counter() + timeout
    try:
        queries = Queries(AsyncpgDriver(producer))
        await asyncio.sleep(0.5)  # the listener is up before the first job
        for i in range(samples):
            if time.perf_counter() > deadline:
                break
            key = f"job-{i}"
            arrived.clear()
            await queries.enqueue(ENTRYPOINT, key.encode(), 0)
            enqueued_at[key] = time.perf_counter()
            try:
                await asyncio.wait_for(arrived.wait(), 5)
            except TimeoutError:
                continue
            if key in started_at:
                latencies.append(max(0.0, started_at[key] - enqueued_at[key]))
    finally:
        qm.shutdown.set()
        try:
            await asyncio.wait_for(run, 10)
        except (TimeoutError, asyncio.CancelledError):
            run.cancel()
        conn.terminate()
        await producer.close()
    return {
        "samples": len(latencies),
        "p50_ms": _ms(_percentile(latencies, 50)),
        "p99_ms": _ms(_percentile(latencies, 99)),
        "max_ms": _ms(max(latencies, default=None)),
    }


async def _queue_for_the_drain(dsn: str, jobs: int, batch: int) -> None:
    """Empty the queue and its log (truncated), then queue `jobs` jobs, untimed: the
    drain then starts from the same `jobs` as the gateway's, whatever the timed batch
    enqueue wrote before."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.clear_queue()
        await queries.clear_queue_log()
        payloads = _payloads(batch)
        for first in range(0, jobs, batch):
            n = min(batch, jobs - first)
            await queries.enqueue([ENTRYPOINT] * n, payloads[:n], [0] * n)
    finally:
        await conn.close()


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["batch_enqueue"] = await _batch_enqueue(args.dsn, args.enqueue_jobs, args.enqueue_batch)
    if args.enqueue_jobs != args.jobs:
        await _queue_for_the_drain(args.dsn, args.jobs, args.enqueue_batch)
    out["drain"] = await _drain(args.dsn, args.workers, args.batch_size, args.timeout_seconds)
    out["enqueue_to_start"] = await _latency(args.dsn, args.latency_samples, args.timeout_seconds)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, default=20_000, help="jobs of the drain")
    p.add_argument(
        "--enqueue-jobs", type=int, default=None, help="jobs of the batch enqueue (--jobs)"
    )
    p.add_argument("--enqueue-batch", type=int, default=1000)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--latency-samples", type=int, default=200)
    p.add_argument("--timeout-seconds", type=float, default=120.0)
    args = p.parse_args()
    if args.enqueue_jobs is None:
        args.enqueue_jobs = args.jobs
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        result = runner.run(_main(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
