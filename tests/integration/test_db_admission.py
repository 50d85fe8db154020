"""Load shedding on the database path, end to end against real Postgres and Redis
(gateway/admission.py): while every connection is busy and the line is longer than
GATEWAY_DB_QUEUE_BUDGET_MS of work, an enqueue is refused at once with 503
database_busy (at the door, before its body is read, its connection read again only
after its Retry-After) and a claim with 429 overloaded,
both with Retry-After and nothing stored; a complete, which frees work, waits
instead, goes first, and succeeds."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.http.io import ConstantResponse
from tests.support.databases import fetch
from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.stores import holding

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_work_is_refused_at_once_while_a_complete_waits_and_goes_first(
    database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(
        database_url,
        redis_url,
        redis_prefix,
        db_pool_max=2,
        db_acquire_timeout_ms=10_000,
        db_queue_budget_ms=50,
    )
    async with running_gateway(settings) as gw:

        async def post(path: str, body: dict[str, object]) -> tuple[int, dict[str, str], object]:
            resp = await gw.http.post(f"{gw.url}{path}", json=body, headers=AUTH)
            return resp.status, dict(resp.headers), await resp.json(content_type=None)

        tasks = f"/v1/runtimes/{runtime_id}/tasks"
        claim = f"/v1/runtimes/{runtime_id}/claim"
        assert (await post(tasks, {"payload": {"n": 1}}))[0] == 201
        status, _, claimed = await post(claim, {"worker_id": "w", "wait_seconds": 0})
        assert status == 200, claimed
        (task,) = claimed["tasks"]  # type: ignore[index]
        # Another task queued: the runtime has no empty verdict, so a claim needs Postgres.
        assert (await post(tasks, {"payload": {"n": 2}}))[0] == 201
        store = gw.gateway.store
        async with holding(store, 2):
            # Postgres has slowed down: every connection has been held 300 ms and more.
            await asyncio.sleep(0.3)
            # A request of work would wait half of that, past the 50 ms budget.
            started = time.monotonic()
            status, headers, body = await post(tasks, {"payload": {"n": 3}})
            assert (status, body["code"], headers["Retry-After"]) == (503, "database_busy", "1"), (
                body
            )  # type: ignore[index]
            status, headers, body = await post(claim, {"worker_id": "w", "wait_seconds": 0})
            assert (status, body["code"], headers["Retry-After"]) == (429, "overloaded", "1"), body  # type: ignore[index]
            # Refused on arrival, before its body is read: even a body that is not JSON.
            resp = await gw.http.post(f"{gw.url}{tasks}", data=b"{not json", headers=AUTH)
            assert resp.status == 503 and (await resp.json())["code"] == "database_busy"
            assert time.monotonic() - started < 2.0  # at once, not after the 10 s timeout
            # A client that sends again at once on the same connection, ignoring the
            # Retry-After, is read again only at the end of it (its last fifth); one on
            # another connection is answered at once.
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1), headers=AUTH
            ) as one:
                first = time.monotonic()
                for _ in range(2):
                    async with one.post(f"{gw.url}{tasks}", json={"payload": {}}) as again:
                        assert again.status == 503
                waited = time.monotonic() - first
            assert waited >= 0.75, waited
            other = time.monotonic()
            resp = await gw.http.post(f"{gw.url}{tasks}", json={"payload": {}}, headers=AUTH)
            assert resp.status == 503 and time.monotonic() - other < 0.5
            # The probes and the metrics are never shed: a busy pod is not a dead one.
            for path in ("/healthz", "/metrics"):
                resp = await gw.http.get(f"{gw.url}{path}", headers=AUTH)
                assert resp.status == 200, (path, await resp.text())
            assert sample(gw, "gateway_shed_total", reason="database_queue") >= 2
            complete = asyncio.create_task(
                post(
                    f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"], "result": 1}
                )
            )
            await asyncio.sleep(0.3)
            assert not complete.done(), "a complete must wait for a connection, not be shed"
        status, _, done = await complete
        assert status == 200 and done["status"] == "completed", done  # type: ignore[index]
        rows = await fetch(
            database_url, "SELECT payload->>'n' AS n FROM tasks WHERE runtime_id = $1", runtime_id
        )
        assert sorted(r["n"] for r in rows) == ["1", "2"]  # the refused enqueue stored nothing


async def _send_and_leave(url: str, path: str, body: dict[str, object]) -> None:
    """Send one request on a connection of its own, and close it without reading an
    answer: a client that gave up."""
    host, port = url.removeprefix("http://").split(":")
    raw = orjson.dumps(body)
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def test_work_whose_client_left_is_not_started_a_complete_still_is(
    database_url, redis_url, redis_prefix, runtime_id
):
    """While every connection is held, an enqueue waits in line (the budget is large);
    its client closes the socket: the enqueue leaves the line at once, counted as
    client_gone, and is never run, even once connections come free. A complete whose
    client left the same way is applied all the same: its worker finished the task."""
    settings = make_settings(
        database_url,
        redis_url,
        redis_prefix,
        db_pool_max=2,
        db_acquire_timeout_ms=30_000,
        db_queue_budget_ms=60_000,
    )
    async with running_gateway(settings) as gw:
        tasks = f"/v1/runtimes/{runtime_id}/tasks"
        resp = await gw.http.post(f"{gw.url}{tasks}", json={"payload": {"n": 1}}, headers=AUTH)
        assert resp.status == 201, await resp.text()
        resp = await gw.http.post(
            f"{gw.url}/v1/runtimes/{runtime_id}/claim",
            json={"worker_id": "w", "wait_seconds": 0},
            headers=AUTH,
        )
        (task,) = (await resp.json())["tasks"]
        store = gw.gateway.store
        async with holding(store, 2):
            await _send_and_leave(gw.url, tasks, {"payload": {"n": "gone"}})
            complete = f"/v1/tasks/{task['id']}/complete"
            await _send_and_leave(gw.url, complete, {"lease_id": task["lease_id"], "result": 1})
            # The enqueue leaves the line as soon as its connection is lost, while every
            # connection is still held; the complete stays in it.
            async with asyncio.timeout(10):
                while sample(gw, "gateway_shed_total", reason="client_gone") < 1:
                    await asyncio.sleep(0.02)
                while store.line_load().waiting_releases < 1:
                    await asyncio.sleep(0.02)
            assert store.line_load().waiting_work == 0
        # Connections are free again: the complete goes in, the enqueue never does.
        async with asyncio.timeout(10):
            while True:
                (row,) = await fetch(
                    database_url, "SELECT status FROM tasks WHERE id = $1", uuid.UUID(task["id"])
                )
                if row["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        rows = await fetch(
            database_url, "SELECT payload->>'n' AS n FROM tasks WHERE runtime_id = $1", runtime_id
        )
        assert [r["n"] for r in rows] == ["1"]  # the enqueue whose client left stored nothing
        assert sample(gw, "gateway_shed_total", reason="client_gone") == 1


async def test_a_request_sent_during_a_hold_by_a_client_that_then_leaves_is_never_started(
    database_url, redis_url, redis_prefix, runtime_id, monkeypatch
):
    """A client refused at the door sends again at once, ignoring Retry-After, then
    gives up and closes. What it sent during the hold is read and kept, not parsed: the
    close is seen, and the enqueue is never started, even though the line has room
    again by the time the hold ends. The refusal, its request whole in one write, was
    written by the server from the read itself (Shedding.early), not sent by the app
    as an ASGI response."""
    answered_by_the_app: list[str] = []
    sent_as_asgi = ConstantResponse.__call__

    async def spied(self: ConstantResponse, scope: Any, receive: Any, send: Any) -> None:
        answered_by_the_app.append(scope["path"])
        await sent_as_asgi(self, scope, receive, send)

    monkeypatch.setattr(ConstantResponse, "__call__", spied)
    settings = make_settings(
        database_url, redis_url, redis_prefix, db_pool_max=2, db_queue_budget_ms=50
    )
    async with running_gateway(settings) as gw:
        tasks = f"/v1/runtimes/{runtime_id}/tasks"
        host, port = gw.url.removeprefix("http://").split(":")

        def request(n: str) -> bytes:
            raw = orjson.dumps({"payload": {"n": n}})
            return (
                f"POST {tasks} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
            ).encode() + raw

        async with holding(gw.gateway.store, 2):
            await asyncio.sleep(0.3)  # every connection held past the budget
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request("refused"))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 503"), head
            assert answered_by_the_app == []
            writer.write(request("sent during the hold"))
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        # The line has room again before the hold (1 s) ends.
        await asyncio.sleep(1.5)
        rows = await fetch(
            database_url, "SELECT payload->>'n' AS n FROM tasks WHERE runtime_id = $1", runtime_id
        )
        assert rows == [], [r["n"] for r in rows]
