"""Shedding when the gateway itself is the bottleneck (gateway/in_flight.py), end to
end against real Postgres and Redis: while more requests are at work than
GATEWAY_MAX_ACTIVE_REQUESTS, a claim that carries nothing and does not wait is refused
at once with `429 overloaded` and Retry-After, nothing claimed, and its connection is
read again only at the end of it; completes, claims that carry acknowledgements,
claims that wait and enqueues are taken. A request counts from the end of its body:
those still arriving are not at work, nor are parked polls. The protocol's count of
requests in flight comes back to zero whatever became of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
import pytest

from tests.support.databases import fetch
from tests.support.gateways import TOKEN, Instance, make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.stores import holding
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 2


def at_work(gw: Instance) -> int:
    return gw.gateway.in_flight.requests


def raw_post(host: str, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def read_answers(
    reader: asyncio.StreamReader, count: int, status: bytes = b"200", got: bytes = b""
) -> bytes:
    """What `reader` gives (after `got`, read before) until `count` answers of `status`
    have come in all, each read within 5 s."""
    while got.count(b"HTTP/1.1 " + status) < count:
        got += await asyncio.wait_for(reader.read(65536), 5.0)
    return got


@asynccontextmanager
async def half_sent(gw: Instance, count: int, path: str) -> AsyncIterator[None]:
    """`count` requests whose body is still arriving: each on a connection of its own,
    its head sent and only part of its body, so that the gateway has read the head and
    is waiting for the rest."""
    host, port = gw.url.removeprefix("http://").split(":")
    writers = []
    try:
        for _ in range(count):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
            )
            await writer.drain()
            writers.append(writer)
        yield
    finally:
        for writer in writers:
            writer.close()


async def test_past_the_limit_a_bare_claim_is_refused_and_the_rest_is_taken(
    database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(
        database_url, redis_url, redis_prefix, max_active_requests=LIMIT, db_pool_max=2
    )
    async with running_gateway(settings) as gw:
        tasks = f"/v1/runtimes/{runtime_id}/tasks"
        claim = f"/v1/runtimes/{runtime_id}/claim"
        host, port = gw.url.removeprefix("http://").split(":")
        for n in range(3):
            await gw.enqueue(runtime_id, {"n": n})
        first, second = await gw.claim(runtime_id, max_tasks=2)
        await wait_until(lambda: at_work(gw) == 0, 5.0, "the requests to end")

        async def post(path: str, body: object) -> tuple[int, dict[str, str], dict]:
            async with gw.http.post(f"{gw.url}{path}", json=body, headers=AUTH) as resp:
                return resp.status, dict(resp.headers), await resp.json(content_type=None)

        # Requests whose bodies are still arriving are not at work: slow clients cannot
        # make the gateway refuse others.
        async with half_sent(gw, LIMIT + 1, "/v1/tasks:complete"):
            await asyncio.sleep(0.3)
            assert at_work(gw) == 0
            assert not gw.gateway.busy()

        # Completes read in full and waiting for a database connection are at work.
        unknown = {"lease_id": "00000000-0000-0000-0000-000000000000"}
        async with holding(gw.gateway.store, 2):
            waiting = [
                asyncio.create_task(
                    post(f"/v1/tasks/00000000-0000-0000-0000-00000000000{n}/complete", unknown)
                )
                for n in range(LIMIT + 1)
            ]
            await wait_until(lambda: at_work(gw) == LIMIT + 1, 5.0, "the completes to wait")
            assert gw.gateway.busy()
            status, headers, body = await post(claim, {"worker_id": "w", "wait_seconds": 0})
            assert (status, body["code"], headers["Retry-After"]) == (429, "overloaded", "1"), body
            assert "GATEWAY_MAX_ACTIVE_REQUESTS" in body["detail"]
            # Empty lists carry nothing: refused, answered as a claim with acks is.
            status, _, body = await post(claim, {"worker_id": "w", "complete": [], "fail": []})
            assert (status, body) == (200, {"tasks": [], "acks": [], "retry_after_seconds": 1})
            for path in ("/healthz", "/metrics"):
                async with gw.http.get(f"{gw.url}{path}", headers=AUTH) as resp:
                    assert resp.status == 200, path
            # A client that sends again at once on the same connection, ignoring the
            # Retry-After, is read again only at the end of it (its last fifth).
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1), headers=AUTH
            ) as one:
                started = time.monotonic()
                for _ in range(2):
                    async with one.post(
                        f"{gw.url}{claim}", json={"worker_id": "w", "wait_seconds": 0}
                    ) as again:
                        assert again.status == 429
                waited = time.monotonic() - started
            assert waited >= 0.75, waited
            # So is one that sent its claims pipelined in one write: the second waits
            # for the first's Retry-After too.
            reader, writer = await asyncio.open_connection(host, int(port))
            bare = orjson.dumps({"worker_id": "w", "wait_seconds": 0})
            writer.write(raw_post(host, claim, bare) * 2)
            await writer.drain()
            got = await read_answers(reader, 1, b"429")
            first_at = time.monotonic()
            # The claim held behind the refusal is not at work while it waits.
            assert at_work(gw) == LIMIT + 1
            await read_answers(reader, 2, b"429", got)
            apart = time.monotonic() - first_at
            writer.close()
            assert apart >= 0.75, apart
            assert sample(gw, "gateway_shed_total", reason="busy") == 6
            # Counted there alone: no access line, nor a count of answered requests
            # (the refusals' 429s and 200s), where thousands a second would cost what
            # shedding saves.
            route = "/v1/runtimes/{rt}/claim"
            for status_class in ("2xx", "4xx"):
                assert (
                    sample(
                        gw,
                        "gateway_http_requests_total",
                        route=route,
                        method="POST",
                        status_class=status_class,
                    )
                    == (1 if status_class == "2xx" else 0)  # the claim above, before the hold
                )
        # They waited for their connection, and were answered once it was free.
        for answered in await asyncio.gather(*waiting):
            assert (answered[0], answered[2]["code"]) == (404, "not_found"), answered
        await wait_until(lambda: at_work(gw) == 0, 5.0, "the completes to end")
        assert not gw.gateway.busy()

        # What else is taken when busy: the count is raised by hand here, to ask the
        # handler's policy of each kind of request with the database free (the count
        # itself is tested above and below).
        gw.gateway.in_flight.requests += LIMIT + 1
        try:
            assert gw.gateway.busy()
            # An enqueue is taken: it carries a producer's data, and the database's line
            # guards it.
            status, _, body = await post(tasks, {"payload": {"n": 9}})
            assert status == 201, body
            # What frees work is taken: a complete, and a claim carrying one (its ack
            # applied, and a task handed out).
            status, _, body = await post(
                f"/v1/tasks/{first['id']}/complete", {"lease_id": first["lease_id"]}
            )
            assert (status, body["status"]) == (200, "completed"), body
            carried = {"id": second["id"], "lease_id": second["lease_id"]}
            status, _, body = await post(
                claim, {"worker_id": "w", "wait_seconds": 0, "complete": [carried]}
            )
            assert status == 200 and [a["outcome"] for a in body["acks"]] == ["completed"], body
            assert len(body["tasks"]) == 1, body
            # A claim that waits is taken too: it gets the last task queued.
            status, _, body = await post(claim, {"worker_id": "w", "wait_seconds": 0.2})
            assert status == 200 and len(body["tasks"]) == 1, body
        finally:
            gw.gateway.in_flight.requests -= LIMIT + 1
        await wait_until(lambda: at_work(gw) == 0, 5.0, "the requests to end")
        # Every task was claimed by a claim let in, and by one only: those refused
        # claimed nothing.
        rows = await fetch(
            database_url,
            "SELECT payload->>'n' AS n, status, attempts FROM tasks WHERE runtime_id = $1",
            runtime_id,
        )
        assert sorted((r["n"], r["attempts"]) for r in rows) == [
            ("0", 1),
            ("1", 1),
            ("2", 1),
            ("9", 1),
        ]


async def test_parked_polls_are_not_at_work(database_url, redis_url, redis_prefix, runtime_id):
    settings = make_settings(database_url, redis_url, redis_prefix, max_active_requests=LIMIT)
    async with running_gateway(settings) as gw:
        path = f"{gw.url}/v1/runtimes/{runtime_id}-idle/claim"
        body = {"worker_id": "w", "wait_seconds": 3}
        polls = [
            asyncio.create_task(gw.http.post(path, json=body, headers=AUTH))
            for _ in range(2 * LIMIT + 1)
        ]
        await wait_until(lambda: at_work(gw) == 2 * LIMIT + 1, 5.0, "the polls to arrive")
        await wait_until(
            lambda: gw.gateway.claimer.long_polls == 2 * LIMIT + 1, 5.0, "the polls to park"
        )
        assert not gw.gateway.busy()
        await gw.enqueue(runtime_id, {"n": 1})
        status, body = await gw.call(
            "POST", f"/v1/runtimes/{runtime_id}/claim", {"worker_id": "w", "wait_seconds": 0}
        )
        assert status == 200 and len(body["tasks"]) == 1, body  # not refused
        for resp in await asyncio.gather(*polls):
            assert resp.status == 200
            resp.release()


async def test_the_count_comes_back_to_zero(database_url, redis_url, redis_prefix, runtime_id):
    """Answered requests, two pipelined in one write, a poll whose client left, a
    WebSocket upgrade behind two requests, a head too large (cut), a body never finished
    (its client left): none stays counted."""
    settings = make_settings(database_url, redis_url, redis_prefix, max_active_requests=LIMIT)
    async with running_gateway(settings) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        await gw.enqueue(runtime_id, {"n": 1})
        await gw.claim(runtime_id)
        # Two requests pipelined in one write, both answered.
        reader, writer = await asyncio.open_connection(host, int(port))
        get = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        writer.write(get + get)
        await writer.drain()
        await read_answers(reader, 2)
        writer.close()
        # Requests queued behind a poll on its connection (pipelined) are not at work
        # until they start: one write of many cannot make the gateway busy.
        reader, writer = await asyncio.open_connection(host, int(port))
        short = b'{"worker_id": "w", "wait_seconds": 1}'
        writer.write(raw_post(host, f"/v1/runtimes/{runtime_id}/claim", short) + get * 50)
        await writer.drain()
        await wait_until(lambda: gw.gateway.claimer.long_polls == 1, 5.0, "the poll to park")
        await asyncio.sleep(0.2)
        assert at_work(gw) == 1 and not gw.gateway.busy()
        await read_answers(reader, 51)
        writer.close()
        # A poll whose client leaves while it waits.
        _, leaver = await asyncio.open_connection(host, int(port))
        poll = b'{"worker_id": "w", "wait_seconds": 30}'
        leaver.write(raw_post(host, f"/v1/runtimes/{runtime_id}/claim", poll))
        await leaver.drain()
        await wait_until(lambda: gw.gateway.claimer.long_polls == 1, 5.0, "the poll to park")
        leaver.close()
        # A WebSocket upgrade pipelined behind two requests (no token needed): no
        # endpoint speaks WebSocket, so it is a request like any other, and the two
        # before it are not left counted when the connection closes.
        upgrade = (
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        ready = f"GET /readyz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        upgraders = []
        for _ in range(3):
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(ready + get + upgrade)
            await writer.drain()
            upgraders.append(writer)
        await asyncio.sleep(0.5)
        for writer in upgraders:
            writer.close()
        # A head too large: answered 431 and cut.
        _, big = await asyncio.open_connection(host, int(port))
        big.write(b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        await big.drain()
        # A body never finished, its client gone: never counted.
        async with half_sent(gw, 1, f"/v1/runtimes/{runtime_id}/tasks"):
            await asyncio.sleep(0.2)
        await wait_until(
            lambda: at_work(gw) == 0 and gw.gateway.claimer.long_polls == 0,
            10.0,
            "every request to end",
        )
        big.close()
