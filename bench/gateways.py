"""A gateway in this process: uvicorn on a free loopback port, in the caller's own
event loop, with its Gateway object at hand and an aiohttp session to call it.

The scale measurements (bench/measure.py) drive the janitor and the result wake-ups
through it, and the test suite runs most of its gateways this way (tests/support/
gateways.py takes it from here: the tests may import the bench, never the reverse).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import uvicorn

from bench.infra import free_port
from gateway.http.app import create_app
from gateway.http.server_config import server_config
from gateway.instance import Gateway
from gateway.settings import Settings

TOKEN = "test-admin-token-0123456789abcdefghijklmnop"


def make_settings(database_url: str, redis_url: str, prefix: str, **overrides: Any) -> Settings:
    """Settings for a gateway on these servers, its Redis keys under `prefix`, the admin
    token TOKEN, and one idle database connection; `overrides` set any other field."""
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
        task: dict[str, Any] = body
        return task

    async def claim(self, runtime: str, worker: str = "w", **fields: Any) -> list[dict[str, Any]]:
        status, body = await self.call(
            "POST", f"/v1/runtimes/{runtime}/claim", {"worker_id": worker, **fields}
        )
        assert status == 200, body
        tasks: list[dict[str, Any]] = body["tasks"]
        return tasks

    async def complete(self, task: dict[str, Any], **fields: Any) -> tuple[int, Any]:
        return await self.call(
            "POST", f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"], **fields}
        )


@contextlib.asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[Instance]:
    """The gateway of `settings` served on a free loopback port until the block ends."""
    port = free_port()
    app = create_app(settings)
    config = server_config(
        app, settings, "127.0.0.1", port, log_level="warning", lifespan="on", loop="none"
    )
    server = uvicorn.Server(config)
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
