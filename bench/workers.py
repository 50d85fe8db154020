"""`python -m bench.workers`: tasks/s through `gateway work` running a no-op command,
against the same tasks drained by the client's worker loop in this process.

Starts the gateway as for `python -m bench` (a separate uvicorn process on a fresh
database, cache on); then, for each mode in turn, enqueues --tasks tasks in batches
on a runtime of the mode's own and times how long the worker takes to complete them all:

- command: `gateway work RT --concurrency C --max-tasks-per-poll K -- true`, a
  separate process that starts one `true` per task;
- sdk: `gateway_client.Worker` with the same options and a handler that returns None.

Checks: every task completed, each with one attempt (claimed once). Exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from gateway_client import AsyncClient, NewTask, Task, Worker, WorkerOptions

from .infra import GatewayProcess, check_servers, fresh_database, log, resolve_servers

ROOT = Path(__file__).resolve().parent.parent
BATCH = 1000


async def enqueue(client: AsyncClient, runtime: str, tasks: int) -> None:
    for start in range(0, tasks, BATCH):
        count = min(BATCH, tasks - start)
        await client.enqueue_batch(runtime, [NewTask({"n": start + i}) for i in range(count)])


async def wait_done(client: AsyncClient, runtime: str, tasks: int, within: float) -> float:
    """Polls the runtime's counts until every task is completed; returns the time."""
    deadline = time.perf_counter() + within
    while time.perf_counter() < deadline:
        stats = await client.stats(runtime)
        if stats.counts["completed"] >= tasks:
            return time.perf_counter()
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{runtime}: not every task was completed within {within:g} s")


async def via_command(gw: GatewayProcess, client: AsyncClient, opts: argparse.Namespace) -> float:
    runtime = "bench-command"
    await enqueue(client, runtime, opts.tasks)
    env = {**os.environ, "GATEWAY_URL": gw.url, "GATEWAY_TOKEN": gw.token}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "clients" / "python")])
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", "warning", "work", runtime,
        "--concurrency", str(opts.concurrency), "--max-tasks-per-poll", str(opts.max_tasks),
        "--wait-seconds", "1", "--", "true",
        env=env,
    )  # fmt: skip
    try:
        finished = await wait_done(client, runtime, opts.tasks, opts.timeout_seconds)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    await check(client, runtime, opts.tasks)
    return float(opts.tasks / (finished - started))


async def via_sdk(gw: GatewayProcess, client: AsyncClient, opts: argparse.Namespace) -> float:
    runtime = "bench-sdk"
    await enqueue(client, runtime, opts.tasks)

    async def nothing(task: Task) -> None:
        return None

    options = WorkerOptions(
        concurrency=opts.concurrency, max_tasks_per_poll=opts.max_tasks, wait_seconds=1
    )
    async with AsyncClient(gw.url, gw.token) as own:
        worker = Worker(own, runtime, nothing, options)
        started = time.perf_counter()
        running = asyncio.create_task(worker.run())
        try:
            finished = await wait_done(client, runtime, opts.tasks, opts.timeout_seconds)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 30)
    await check(client, runtime, opts.tasks)
    return float(opts.tasks / (finished - started))


async def check(client: AsyncClient, runtime: str, tasks: int) -> None:
    seen = [t async for t in client.iter_tasks(runtime, page_size=1000)]
    bad = [t.id for t in seen if t.status != "completed" or t.attempts != 1]
    if len(seen) != tasks or bad:
        raise AssertionError(f"{runtime}: {len(seen)} tasks, {len(bad)} not completed once")


async def main_async(opts: argparse.Namespace) -> int:
    servers = resolve_servers(None, None)
    try:
        await check_servers(servers)
        async with fresh_database(servers.database_url) as database_url:
            log_path = Path(tempfile.mkdtemp(prefix="gateway-workers-")) / "gateway.log"
            gw = GatewayProcess(database_url, servers.redis_url, True, log_path)
            await gw.start()
            try:
                async with AsyncClient(gw.url, gw.token) as client:
                    rates = {}
                    for name, mode in (("command", via_command), ("sdk", via_sdk)):
                        log(f"{name}: {opts.tasks} tasks, concurrency {opts.concurrency}")
                        rates[name] = await mode(gw, client, opts)
            finally:
                await gw.stop()
    finally:
        servers.close()
    print(f"{opts.tasks} tasks, concurrency {opts.concurrency}, max_tasks {opts.max_tasks}")
    print(f"{'worker':<32} {'tasks/s':>8}")
    print(f"{'gateway work -- true':<32} {rates['command']:>8.0f}")
    print(f"{'Worker (in-process, no-op)':<32} {rates['sdk']:>8.0f}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tasks", type=int, default=10, help="max_tasks per claim")
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    try:
        raise SystemExit(asyncio.run(main_async(parser.parse_args())))
    except (AssertionError, TimeoutError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
