"""Hostile connections, over raw sockets: slow or silent clients are cut after
GATEWAY_READ_TIMEOUT_SECONDS with 408, oversized heads get 431, an announced huge body
gets 413 and the connection is closed instead of read; long polls and keep-alive
clients are left alone. The last test goes through a real `gateway serve` process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from gateway.http.server import LINGER_SECONDS, MAX_HEAD_BYTES
from tests.support.connections import (
    AUTH,
    MARGIN,
    READ_TIMEOUT,
    SHORT_DEADLINE,
    Answer,
    Conn,
    cuts,
    request,
)
from tests.support.gateways import Instance, serve_env, serve_process

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gateway_options() -> dict[str, Any]:
    return SHORT_DEADLINE


def assert_problem(answer: Answer, status: int, code: str) -> None:
    assert answer.status == status, answer
    assert answer.headers["content-type"] == "application/problem+json", answer.headers
    assert answer.headers["connection"] == "close", answer.headers
    body = answer.json()
    assert body["status"] == status and body["code"] == code, body
    assert body["type"] == "about:blank" and body["title"] and body["detail"], body


# -- slow clients ------------------------------------------------------------


async def test_half_a_head_is_answered_408_and_closed(gw: Instance, tcp: Conn) -> None:
    before = cuts(gw, "read_timeout")
    started = time.monotonic()
    await tcp.send(f"POST /v1/runtimes/rt/claim HTTP/1.1\r\nHost: gateway\r\n{AUTH}".encode())
    answer = await tcp.answer(within=READ_TIMEOUT + MARGIN)
    assert READ_TIMEOUT / 2 <= time.monotonic() - started < READ_TIMEOUT + MARGIN
    assert_problem(answer, 408, "request_timeout")
    assert "GATEWAY_READ_TIMEOUT_SECONDS" in answer.json()["detail"]
    assert await tcp.closed_by_server(within=1) == b""
    assert cuts(gw, "read_timeout") == before + 1


async def test_a_trickled_head_is_cut_although_bytes_keep_coming(gw: Instance, tcp: Conn) -> None:
    async def trickle() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200:
            tcp.writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    sender = asyncio.create_task(trickle())
    started = time.monotonic()
    try:
        answer = await tcp.answer(within=READ_TIMEOUT + MARGIN)
    finally:
        sender.cancel()
    assert time.monotonic() - started < READ_TIMEOUT + MARGIN
    assert_problem(answer, 408, "request_timeout")


async def test_a_head_and_half_a_body_is_answered_408_and_closed(
    gw: Instance, tcp: Conn, runtime_id: str
) -> None:
    body = orjson.dumps({"worker_id": "w", "wait_seconds": 0, "x": "y" * 100})
    data = request("POST", f"/v1/runtimes/{runtime_id}/claim", body)
    started = time.monotonic()
    await tcp.send(data[: len(data) - len(body) // 2])
    answer = await tcp.answer(within=READ_TIMEOUT + MARGIN)
    assert READ_TIMEOUT / 2 <= time.monotonic() - started < READ_TIMEOUT + MARGIN
    assert_problem(answer, 408, "request_timeout")
    assert await tcp.closed_by_server(within=1) == b""


async def test_a_later_request_on_a_connection_gets_its_own_whole_deadline(
    gw: Instance, tcp: Conn
) -> None:
    """A connection keeps one read timer, armed for its first request: when it fires
    during a later one, that request still has the whole timeout from its own first
    byte, and is cut only then."""
    await tcp.send(request("GET", "/healthz"))
    assert (await tcp.answer(within=MARGIN)).status == 200
    await asyncio.sleep(READ_TIMEOUT * 0.6)  # the first timer fires 0.4 s into the next
    started = time.monotonic()
    await tcp.send(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")
    answer = await tcp.answer(within=READ_TIMEOUT + MARGIN)
    assert time.monotonic() - started >= READ_TIMEOUT * 0.9
    assert_problem(answer, 408, "request_timeout")


async def test_a_connection_that_sends_nothing_is_closed(gw: Instance, tcp: Conn) -> None:
    started = time.monotonic()
    # Nothing was asked, so nothing is answered: a 408 here could be taken by a client
    # for the answer to a request it is just sending.
    assert await tcp.closed_by_server(within=READ_TIMEOUT + MARGIN) == b""
    assert time.monotonic() - started >= READ_TIMEOUT / 2


# -- oversized heads and bodies ----------------------------------------------


async def test_a_100_kib_header_is_answered_431_and_closed(gw: Instance, tcp: Conn) -> None:
    before = cuts(gw, "head_too_large")
    started = time.monotonic()
    await tcp.send(request("GET", "/healthz", extra=f"X-Filler: {'a' * 100 * 1024}\r\n"))
    answer = await tcp.answer(within=MARGIN)
    assert time.monotonic() - started < READ_TIMEOUT  # refused at once, not timed out
    assert_problem(answer, 431, "request_header_fields_too_large")
    assert await tcp.closed_by_server(within=1) == b""
    assert cuts(gw, "head_too_large") == before + 1


@pytest.mark.parametrize("head_bytes", [MAX_HEAD_BYTES, MAX_HEAD_BYTES + 1])
async def test_the_head_limit_is_exact_with_the_body_in_the_same_write(
    gw: Instance, tcp: Conn, runtime_id: str, head_bytes: int
) -> None:
    body = orjson.dumps({"payload": "p" * 200_000})
    data = request("POST", f"/v1/runtimes/{runtime_id}/tasks", body, extra="X-Filler: \r\n")
    filler = head_bytes - (len(data) - len(body))
    data = data.replace(b"X-Filler: ", b"X-Filler: " + b"a" * filler)
    assert data.index(b"\r\n\r\n") + 4 == head_bytes
    await tcp.send(data)
    answer = await tcp.answer(within=MARGIN)
    if head_bytes <= MAX_HEAD_BYTES:
        assert answer.status == 201, answer
        assert await tcp.still_open()
    else:
        assert_problem(answer, 431, "request_header_fields_too_large")


async def test_a_2_gb_content_length_is_answered_413_and_the_body_is_not_read(
    gw: Instance, tcp: Conn, runtime_id: str
) -> None:
    before = cuts(gw, "body_unread")
    head = request("POST", f"/v1/runtimes/{runtime_id}/tasks").replace(
        b"Content-Length: 0", b"Content-Length: 2147483648"
    )
    await tcp.send(head + b'{"payload": "')
    answer = await tcp.answer(within=MARGIN)
    assert answer.status == 413 and answer.json()["code"] == "payload_too_large", answer
    assert answer.headers["connection"] == "close", answer.headers
    # The server shut its side right after the answer and reads no more: once it
    # stopped discarding what was in flight, sending the body fails.
    assert await tcp.closed_by_server(within=1) == b""
    await asyncio.sleep(LINGER_SECONDS + 0.5)
    with pytest.raises(ConnectionError):
        async with asyncio.timeout(MARGIN):
            for _ in range(100):
                await tcp.send(b"x" * 65536)
                await asyncio.sleep(0.01)
    assert cuts(gw, "body_unread") == before + 1


# -- what must keep working --------------------------------------------------


async def test_a_long_poll_longer_than_the_read_timeout_is_not_cut(
    gw: Instance, tcp: Conn, runtime_id: str
) -> None:
    wait = READ_TIMEOUT * 2.5
    body = orjson.dumps({"worker_id": "w", "wait_seconds": wait})
    started = time.monotonic()
    await tcp.send(request("POST", f"/v1/runtimes/{runtime_id}/claim", body))
    answer = await tcp.answer(within=wait + MARGIN)
    assert time.monotonic() - started >= wait - 0.1
    assert (answer.status, answer.json()) == (200, {"tasks": []})
    assert "connection" not in answer.headers, answer.headers
    assert await tcp.still_open()


async def test_keep_alive_requests_on_one_connection_still_work(
    gw: Instance, tcp: Conn, runtime_id: str
) -> None:
    await tcp.send(request("GET", "/healthz"))
    assert (await tcp.answer(within=MARGIN)).status == 200
    # Idle between requests for longer than the read timeout: that is keep-alive
    # (uvicorn closes after 5 s), not a slow request.
    await asyncio.sleep(READ_TIMEOUT * 1.5)
    body = orjson.dumps({"payload": {"n": 1}})
    data = request("POST", f"/v1/runtimes/{runtime_id}/tasks", body)
    await tcp.send(data[:-5])
    await asyncio.sleep(READ_TIMEOUT / 3)  # a body in two parts, well within the limit
    await tcp.send(data[-5:])
    created = await tcp.answer(within=MARGIN)
    assert created.status == 201, created
    claim = orjson.dumps({"worker_id": "w", "wait_seconds": 1})
    await tcp.send(request("POST", f"/v1/runtimes/{runtime_id}/claim", claim))
    claimed = await tcp.answer(within=MARGIN)
    assert claimed.status == 200, claimed
    [task] = claimed.json()["tasks"]
    done = orjson.dumps({"lease_id": task["lease_id"]})
    await tcp.send(request("POST", f"/v1/tasks/{task['id']}/complete", done))
    completed = await tcp.answer(within=MARGIN)
    assert (completed.status, completed.json()["status"]) == (200, "completed")
    assert await tcp.still_open()


async def test_pipelined_requests_in_one_write_are_all_answered(gw: Instance, tcp: Conn) -> None:
    await tcp.send(request("GET", "/healthz") * 3)
    for _ in range(3):
        assert (await tcp.answer(within=MARGIN)).status == 200
    assert await tcp.still_open()


# -- the real command --------------------------------------------------------


async def test_gateway_serve_cuts_slow_and_oversized_requests(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    env = serve_env(
        database_url, redis_url, redis_prefix, GATEWAY_READ_TIMEOUT_SECONDS=str(READ_TIMEOUT)
    )
    async with serve_process(env=env) as (_proc, base):
        slow = await Conn.open(base)
        big = await Conn.open(base)
        try:
            await slow.send(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")
            await big.send(request("GET", "/healthz", extra=f"X-Filler: {'a' * 100 * 1024}\r\n"))
            assert_problem(await big.answer(within=MARGIN), 431, "request_header_fields_too_large")
            assert_problem(await slow.answer(within=READ_TIMEOUT + MARGIN), 408, "request_timeout")
        finally:
            slow.close()
            big.close()


async def test_gateway_serve_keep_alive_is_set_by_its_option(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    # Behind a load balancer the gateway must keep idle connections longer than the
    # balancer does (deploy/README.md); here shorter, to see it act within a test.
    env = serve_env(database_url, redis_url, redis_prefix)
    async with serve_process("--keep-alive-seconds", "1", env=env) as (_proc, base):
        tcp = await Conn.open(base)
        try:
            await tcp.send(request("GET", "/healthz"))
            assert (await tcp.answer(within=MARGIN)).status == 200
            assert await tcp.closed_by_server(within=1 + MARGIN) == b""
        finally:
            tcp.close()
