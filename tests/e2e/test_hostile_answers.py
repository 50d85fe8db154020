"""Answers nobody will take, over raw sockets: a long poll whose client left with a
request pipelined behind it gives its place and its tasks back."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator, Iterator

import aiohttp
import orjson
import pytest
import pytest_asyncio

from tests.e2e.test_hostile_connections import MARGIN, READ_TIMEOUT, Conn, request
from tests.harness import TOKEN, Instance, make_settings, running_gateway, serve_process

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(database_url: str, redis_url: str) -> AsyncIterator[Instance]:
    prefix = "gwt" + secrets.token_hex(4)
    settings = make_settings(
        database_url,
        redis_url,
        prefix,
        read_timeout_seconds=READ_TIMEOUT,
        janitor_interval_seconds=3600,
    )
    async with running_gateway(settings) as inst:
        yield inst


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.ERROR or r.exc_info]


@pytest.fixture
def server_logs() -> Iterator[Records]:
    """Every record of the gateway's and uvicorn's loggers (uvicorn's do not propagate
    to the root logger, so caplog would miss them)."""
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("gateway", "uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


def sample(gw: Instance, name: str, labels: dict[str, str] | None = None) -> float:
    return gw.gateway.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def parked_becomes(gw: Instance, runtime_id: str, count: int, within: float) -> None:
    async with asyncio.timeout(within):
        while gw.gateway.claimer.parked(runtime_id) != count:
            await asyncio.sleep(0.02)


# -- a long poll with a request pipelined behind it ----------------------------------


async def pipelined_poll(url: str, runtime_id: str) -> Conn:
    """A connection with a long poll parked and a request pipelined behind it."""
    body = orjson.dumps({"worker_id": "ghost", "wait_seconds": 20})
    conn = await Conn.open(url)
    claim = request("POST", f"/v1/runtimes/{runtime_id}/claim", body)
    await conn.send(claim + request("GET", "/healthz"))
    return conn


async def test_a_pipelined_long_poll_leaves_with_its_client(
    gw: Instance, runtime_id: str, server_logs: Records
) -> None:
    conn = await pipelined_poll(gw.url, runtime_id)
    await parked_becomes(gw, runtime_id, 1, within=5)
    conn.close()
    # It gives its place back at once (GATEWAY_MAX_PARKED_POLLS counts it until then)...
    await parked_becomes(gw, runtime_id, 0, within=MARGIN)
    assert sample(gw, "gateway_parked_polls") == 0
    # ...and takes nothing: another daemon gets the task, at its first attempt.
    task = await gw.enqueue(runtime_id, "job")
    got = await gw.claim(runtime_id, "stayer", wait_seconds=3)
    assert [(t["id"], t["attempts"]) for t in got] == [(task["id"], 1)], got
    assert server_logs.errors() == []


async def test_gateway_serve_logs_no_error_for_a_pipelined_poll_that_left(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    # `gateway serve` runs on uvloop, whose transports raise on a write after the
    # close: an answer sent to the poll that left was logged as an ASGI exception.
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GATEWAY_ADMIN_TOKEN": TOKEN,
        "GATEWAY_REDIS_PREFIX": redis_prefix,
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with serve_process(env=env) as (proc, base), aiohttp.ClientSession() as http:
        conn = await pipelined_poll(base, runtime_id)
        await asyncio.sleep(1)  # parked (the process's gauge is not at hand)
        conn.close()
        await asyncio.sleep(0.5)
        tasks = f"{base}/v1/runtimes/{runtime_id}/tasks"
        async with http.post(tasks, json={"payload": "job"}, headers=headers) as resp:
            assert resp.status == 201
            task = await resp.json()
        claim = {"worker_id": "stayer", "wait_seconds": 3}
        async with http.post(
            f"{base}/v1/runtimes/{runtime_id}/claim", json=claim, headers=headers
        ) as resp:
            got = (await resp.json())["tasks"]
        assert [t["id"] for t in got] == [task["id"]], got
        await asyncio.sleep(0.5)
        proc.terminate()
        async with asyncio.timeout(20):
            _, err = await proc.communicate()
    log = err.decode()
    assert "Traceback" not in log and "ERROR" not in log, log
