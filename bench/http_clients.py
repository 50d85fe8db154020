"""Which HTTP library the client should use: empty claims (`wait_seconds: 0`, answered
from the Redis verdict) through httpx and through aiohttp, same gateway, same
concurrency, one after the other.

    python -m bench.http_clients [--concurrency 50] [--duration-seconds 5]

Servers as for `python -m bench` (BENCH_* or TEST_* URLs, else embedded). httpx is
not a dependency of the project: install it to run this.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from .infra import GatewayProcess, check_servers, fresh_database, resolve_servers

Post = Callable[[], Awaitable[int]]


async def drive(post: Post, concurrency: int, seconds: float) -> tuple[int, int]:
    """(answers, errors) from `concurrency` loops posting until `seconds` pass."""
    deadline = time.perf_counter() + seconds
    counts = [0, 0]

    async def loop() -> None:
        while time.perf_counter() < deadline:
            try:
                counts[0 if await post() == 200 else 1] += 1
            except Exception:
                counts[1] += 1

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return counts[0], counts[1]


async def measure(opts: argparse.Namespace) -> None:
    servers = resolve_servers(None, None)
    try:
        await check_servers(servers)
        async with fresh_database(servers.database_url) as database_url:
            log_path = Path(tempfile.mkdtemp(prefix="gateway-http-")) / "gateway.log"
            gw = GatewayProcess(database_url, servers.redis_url, True, log_path)
            await gw.start()
            try:
                await compare(gw, opts)
            finally:
                await gw.stop()
    finally:
        servers.close()


async def compare(gw: GatewayProcess, opts: argparse.Namespace) -> None:
    import httpx  # not a dependency of the project: `pip install httpx` to measure it

    url = gw.url + "/v1/runtimes/http-bench/claim"
    body = b'{"worker_id": "bench", "wait_seconds": 0}'
    headers = {"Authorization": f"Bearer {gw.token}", "Content-Type": "application/json"}
    n, seconds = opts.concurrency, opts.duration_seconds
    print(f"{'library':<10} {'answers':>8} {'errors':>7} {'req/s':>8}")
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, headers=headers) as hx:

        async def httpx_post() -> int:
            return int((await hx.post(url, content=body)).status_code)

        await drive(httpx_post, n, 1.0)  # warm-up: open the connections
        ok, bad = await drive(httpx_post, n, seconds)
        print(f"{'httpx':<10} {ok:>8} {bad:>7} {ok / seconds:>8.0f}", flush=True)
    connector = aiohttp.TCPConnector(limit=n)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def aiohttp_post() -> int:
            async with session.post(url, data=body) as resp:
                await resp.read()
                return resp.status

        await drive(aiohttp_post, n, 1.0)
        ok, bad = await drive(aiohttp_post, n, seconds)
        print(f"{'aiohttp':<10} {ok:>8} {bad:>7} {ok / seconds:>8.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.http_clients", description=__doc__)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration-seconds", type=float, default=5.0)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
