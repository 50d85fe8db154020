"""Runs real gateway instances and talks to them over HTTP with aiohttp: in this
process (uvicorn on a free loopback port, in the test's own event loop), the bench's
(bench/gateways.py), taken from there since the tests may import the bench and never
the reverse; and as a `gateway serve` process."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator

import aiohttp

from bench.gateways import TOKEN, Instance, make_settings, running_gateway
from tests.support.net import free_port

__all__ = ["TOKEN", "Instance", "make_settings", "running_gateway", "serve_process"]


@contextlib.asynccontextmanager
async def serve_process(
    *args: str,
    env: dict[str, str],
    ready_within: float = 20,
    log_level: str = "info",
    stdout: int = asyncio.subprocess.DEVNULL,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`gateway --log-level LEVEL serve ARGS` as a real process on a free port, once
    /readyz answers 200. Yields (process, base URL); kills it afterwards if the test did
    not stop it. `stdout=PIPE` keeps what it prints there (uvicorn's access log)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", log_level,
        "serve", "--port", str(port), *args,
        env=env, stdout=stdout, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(ready_within):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError((await proc.stderr.read()).decode())  # type: ignore[union-attr]
                try:
                    async with http.get(base + "/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        yield proc, base
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
