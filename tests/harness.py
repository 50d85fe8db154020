"""Runs real gateway instances (uvicorn on a free loopback port, in the test's own
event loop) and talks to them over HTTP with aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import uvicorn

from gateway.http.app import create_app
from gateway.http.server import server_config
from gateway.instance import Gateway
from gateway.settings import Settings
from tests.support.net import free_port

TOKEN = "test-admin-token-0123456789abcdefghijklmnop"


def make_settings(database_url: str, redis_url: str, prefix: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "redis_url": redis_url,
        "redis_prefix": prefix,
        "admin_token": TOKEN,
        "db_pool_min": 1,
    }
    values.update(overrides)
    settings = Settings(**values)
    settings.validate()
    return settings


@dataclass
class Instance:
    """One running gateway: its base URL, its Gateway object, and an HTTP session."""

    url: str
    gateway: Gateway
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {TOKEN}", **kw.pop("headers", {})}
        async with self.http.request(
            method, self.url + path, json=body, headers=headers, **kw
        ) as resp:
            data = await resp.json(content_type=None)
            return resp.status, data

    async def enqueue(self, runtime: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        status, body = await self.call(
            "POST", f"/v1/runtimes/{runtime}/tasks", {"payload": payload, **fields}
        )
        assert status == 201, body
        return body

    async def claim(self, runtime: str, worker: str = "w", **fields: Any) -> list[dict[str, Any]]:
        status, body = await self.call(
            "POST", f"/v1/runtimes/{runtime}/claim", {"worker_id": worker, **fields}
        )
        assert status == 200, body
        return body["tasks"]

    async def complete(self, task: dict[str, Any], **fields: Any) -> tuple[int, Any]:
        return await self.call(
            "POST", f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"], **fields}
        )


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[Instance]:
    port = free_port()
    app = create_app(settings)
    config = server_config(
        app, settings, "127.0.0.1", port, log_level="warning", lifespan="on", loop="none"
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    serving = asyncio.create_task(server.serve())
    async with asyncio.timeout(30):
        while not server.started:
            if serving.done():
                serving.result()
                raise RuntimeError("the gateway stopped during start-up; see the log above")
            await asyncio.sleep(0.01)
    connector = aiohttp.TCPConnector(limit=500)
    # No request in a test should take long: fail it clearly instead of hanging.
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        try:
            yield Instance(f"http://127.0.0.1:{port}", app.state.gateway, http)
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)


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
