"""Answers nobody will take, over raw sockets: a long poll whose client left with a
request pipelined behind it gives its place and its tasks back, and an answer that
its client does not read is dropped, with the connection, after
GATEWAY_READ_TIMEOUT_SECONDS; one read slowly but steadily is delivered whole."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.support.connections import (
    MARGIN,
    READ_TIMEOUT,
    SHORT_DEADLINE,
    Conn,
    answer_size,
    cuts,
    request,
)
from tests.support.gateways import TOKEN, Instance, serve_env, serve_process
from tests.support.logs import Records
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gateway_options() -> dict[str, Any]:
    return SHORT_DEADLINE


async def parked_becomes(gw: Instance, runtime_id: str, count: int, within: float) -> None:
    claimer = gw.gateway.claimer
    await wait_until(
        lambda: claimer.parked(runtime_id) == count, within, f"{count} parked polls", 0.02
    )


# -- a long poll with a request pipelined behind it ----------------------------------


async def pipelined_poll(url: str, runtime_id: str) -> Conn:
    """A connection with a long poll parked and a request pipelined behind it."""
    body = orjson.dumps({"worker_id": "ghost", "wait_seconds": 20})
    tcp = await Conn.open(url)
    claim = request("POST", f"/v1/runtimes/{runtime_id}/claim", body)
    await tcp.send(claim + request("GET", "/healthz"))
    return tcp


async def test_a_pipelined_long_poll_leaves_with_its_client(
    gw: Instance, runtime_id: str, server_logs: Records
) -> None:
    tcp = await pipelined_poll(gw.url, runtime_id)
    await parked_becomes(gw, runtime_id, 1, within=5)
    tcp.close()
    # It gives its place back at once (GATEWAY_MAX_PARKED_POLLS counts it until then)...
    await parked_becomes(gw, runtime_id, 0, within=MARGIN)
    assert sample(gw, "gateway_parked_polls") == 0
    # ...and takes nothing: another daemon gets the task, at its first attempt.
    task = await gw.enqueue(runtime_id, "job")
    got = await gw.claim(runtime_id, "stayer", wait_seconds=3)
    assert [(t["id"], t["attempts"]) for t in got] == [(task["id"], 1)], got
    assert server_logs.errors() == []


# -- answers the client does not read ------------------------------------------------

PAYLOAD = "p" * 900_000
TASKS = 3  # the answer: a listing of that many tasks with PAYLOAD, 2.7 MB
RCVBUF = 8192  # the client's receive buffer
# Loopback's 64 KiB segments make the server's kernel take up to 4 MB for the client;
# with a real network's it takes about 100 KiB, and 1 MB once the client reads: the
# rest of the answer waits in the gateway.
MSS = 1400


async def large_listing(gw: Instance, runtime_id: str) -> tuple[str, list[str]]:
    """The path of a listing of about 2.7 MB, and the ids of its tasks."""
    tasks = [await gw.enqueue(runtime_id, PAYLOAD) for _ in range(TASKS)]
    return f"/v1/runtimes/{runtime_id}/tasks", sorted(t["id"] for t in tasks)


async def get_unread(url: str, path: str) -> socket.socket:
    """A socket with a small receive buffer that has asked for `path` and read nothing."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, MSS)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    await loop.sock_sendall(sock, request("GET", path))
    return sock


async def receive(sock: socket.socket, count: int) -> bytes:
    """Up to `count` bytes, fewer only at the end of the connection."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    while len(data) < count:
        try:
            chunk = await loop.sock_recv(sock, count - len(data))
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def test_an_answer_the_client_does_not_read_is_dropped_after_the_read_timeout(
    gw: Instance, runtime_id: str
) -> None:
    path, _ = await large_listing(gw, runtime_id)
    before = cuts(gw, "write_timeout")
    sock = await get_unread(gw.url, path)
    try:
        started = time.monotonic()
        await wait_until(
            lambda: cuts(gw, "write_timeout") != before,
            READ_TIMEOUT + MARGIN,
            "the unread answer to be cut",
            0.02,
        )
        assert time.monotonic() - started >= READ_TIMEOUT / 2
        assert cuts(gw, "write_timeout") == before + 1
        # What the kernels had taken still arrives, then the end: not the whole answer.
        async with asyncio.timeout(MARGIN):
            data = await receive(sock, 2 * TASKS * len(PAYLOAD))
        assert answer_size(data) is not None and len(data) < (answer_size(data) or 0)
    finally:
        sock.close()


async def test_an_answer_read_slowly_but_steadily_arrives_whole(
    gw: Instance, runtime_id: str
) -> None:
    path, ids = await large_listing(gw, runtime_id)
    before = cuts(gw, "write_timeout")
    sock = await get_unread(gw.url, path)
    try:
        data = b""
        started = time.monotonic()
        async with asyncio.timeout(30):
            while answer_size(data) is None or len(data) < (answer_size(data) or 0):
                chunk = await receive(sock, 128 * 1024)
                assert chunk, f"cut after {len(data)} bytes"
                data += chunk
                # 640 KiB/s: what the kernels do not hold waits in the gateway's
                # buffer, its writes paused, for two to three read timeouts.
                await asyncio.sleep(0.2)
        assert time.monotonic() - started > 3 * READ_TIMEOUT
        body = orjson.loads(data[data.index(b"\r\n\r\n") + 4 :])
        assert sorted(t["id"] for t in body["tasks"]) == ids
        assert all(t["payload"] == PAYLOAD for t in body["tasks"])
        assert cuts(gw, "write_timeout") == before
    finally:
        sock.close()


# -- the real command: `gateway serve` runs on uvloop ------------------------------


@contextlib.asynccontextmanager
async def serve_short_deadline(
    database_url: str, redis_url: str, redis_prefix: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, aiohttp.ClientSession]]:
    env = serve_env(
        database_url, redis_url, redis_prefix, GATEWAY_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT)
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        serve_process(env=env) as (proc, base),
        aiohttp.ClientSession(base, headers=headers) as http,
    ):
        yield proc, base, http


async def metric_becomes(http: aiohttp.ClientSession, sample: str, value: float) -> None:
    """Wait until the process's /metrics shows `sample` (name and labels) at `value`."""
    async with asyncio.timeout(READ_TIMEOUT + MARGIN):
        while True:
            async with http.get("/metrics") as resp:
                text = await resp.text()
            found = [
                line.split()[-1] for line in text.splitlines() if line.startswith(sample + " ")
            ]
            if float(found[0] if found else 0) == value:
                return
            await asyncio.sleep(0.05)


async def test_gateway_serve_logs_no_error_for_a_pipelined_poll_that_left(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    # uvloop's transports raise on a write after the close: the answer that the poll
    # which left once got was logged as an exception in the ASGI application.
    async with serve_short_deadline(database_url, redis_url, redis_prefix) as (proc, base, http):
        tcp = await pipelined_poll(base, runtime_id)
        await metric_becomes(http, "gateway_parked_polls", 1)
        tcp.close()
        await metric_becomes(http, "gateway_parked_polls", 0)
        async with http.post(f"/v1/runtimes/{runtime_id}/tasks", json={"payload": 1}) as resp:
            assert resp.status == 201
            task = await resp.json()
        claim = {"worker_id": "stayer", "wait_seconds": 3}
        async with http.post(f"/v1/runtimes/{runtime_id}/claim", json=claim) as resp:
            got = (await resp.json())["tasks"]
        assert [t["id"] for t in got] == [task["id"]], got
        proc.terminate()
        async with asyncio.timeout(20):
            _, err = await proc.communicate()
    log = err.decode()
    assert "Traceback" not in log and "ERROR" not in log, log


async def test_gateway_serve_drops_an_answer_its_client_does_not_read(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with serve_short_deadline(database_url, redis_url, redis_prefix) as (_proc, base, http):
        path = f"/v1/runtimes/{runtime_id}/tasks"
        for _ in range(TASKS):
            async with http.post(path, json={"payload": PAYLOAD}) as resp:
                assert resp.status == 201
        sock = await get_unread(base, path)
        try:
            await metric_becomes(http, 'gateway_connections_cut_total{reason="write_timeout"}', 1)
            async with asyncio.timeout(MARGIN):
                data = await receive(sock, 2 * TASKS * len(PAYLOAD))
            assert answer_size(data) is not None and len(data) < (answer_size(data) or 0)
        finally:
            sock.close()
