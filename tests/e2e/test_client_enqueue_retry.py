"""The client's retried enqueues against a real gateway, through a proxy that loses
answers or sheds load: with `retry_seconds`, an enqueue whose answer was lost after the
gateway stored the task is sent again with the same idempotency key (the caller's, or
one the client made) and gets the stored task, never a second one; a refusal under
overload (503 database_busy) is retried after its Retry-After; without
`retry_seconds`, nothing is retried."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from gateway_client import AsyncClient, NewTask, TransportError
from gateway_client.retries import OWN_KEY_PREFIX
from tests.support.databases import fetch
from tests.support.gateways import TOKEN

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]

SHED = {"type": "about:blank", "title": "Database busy", "status": 503, "code": "database_busy"}


@dataclass
class Proxy:
    """Forwards every request to the gateway, except that the next `lose` enqueues are
    forwarded but their answers never sent (the connection is cut once the gateway has
    answered), and the next `shed` are refused with 503 database_busy, Retry-After 1,
    without being forwarded."""

    url: str = ""
    lose: int = 0
    shed: int = 0
    seen: list[float] = field(default_factory=list)  # when each enqueue arrived


@pytest_asyncio.fixture(loop_scope="module")
async def proxy(gw) -> AsyncIterator[Proxy]:
    state = Proxy()
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        enqueue = request.method == "POST" and request.path.endswith(("/tasks", "/tasks:batch"))
        if enqueue:
            state.seen.append(time.monotonic())
            if state.shed:
                state.shed -= 1
                return web.json_response(SHED, status=503, headers={"Retry-After": "1"})
        async with session.request(
            request.method,
            gw.url + request.path_qs,
            data=await request.read(),
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        ) as upstream:
            body = await upstream.read()
            if enqueue and state.lose:
                state.lose -= 1
                assert request.transport is not None
                request.transport.close()  # stored, but the answer is lost
                return web.Response()
            return web.Response(body=body, status=upstream.status, headers=upstream.headers)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()
        await session.close()


async def stored(database_url: str, runtime_id: str) -> list[tuple[object, str | None]]:
    rows = await fetch(
        database_url,
        "SELECT payload, idempotency_key FROM tasks WHERE runtime_id = $1 ORDER BY created_at",
        runtime_id,
    )
    return [(r["payload"], r["idempotency_key"]) for r in rows]


async def test_a_lost_answer_is_retried_with_the_clients_own_key_and_stores_one_task(
    proxy, database_url, runtime_id
):
    async with AsyncClient(proxy.url, TOKEN) as client:
        proxy.lose = 1
        task = await client.enqueue(runtime_id, {"n": 1}, retry_seconds=10)
    assert len(proxy.seen) == 2  # the lost one, and its retry
    [(payload, key)] = await stored(database_url, runtime_id)
    assert key is not None and key.startswith(OWN_KEY_PREFIX)
    assert task.payload == {"n": 1} and payload is not None


async def test_the_callers_own_key_is_kept_and_a_batch_is_stored_once(
    proxy, database_url, runtime_id
):
    async with AsyncClient(proxy.url, TOKEN) as client:
        proxy.lose = 1
        await client.enqueue(runtime_id, "mine", idempotency_key="mine-1", retry_seconds=10)
        proxy.lose = 1
        ids = await client.enqueue_batch(
            runtime_id,
            [NewTask("a"), NewTask("b", idempotency_key="b-1")],
            minimal=True,
            retry_seconds=10,
        )
    rows = await stored(database_url, runtime_id)
    assert len(rows) == 3 and len(set(ids)) == 2
    keys = [key for _, key in rows]
    assert keys[0] == "mine-1" and keys[2] == "b-1"
    assert keys[1] is not None and keys[1].startswith(OWN_KEY_PREFIX)


async def test_a_shed_enqueue_is_retried_after_its_retry_after(proxy, database_url, runtime_id):
    async with AsyncClient(proxy.url, TOKEN) as client:
        proxy.shed, proxy.seen[:] = 1, []
        await client.enqueue(runtime_id, "later", retry_seconds=10)
    assert len(proxy.seen) == 2 and proxy.seen[1] - proxy.seen[0] >= 1.0
    assert len(await stored(database_url, runtime_id)) == 1


async def test_without_retry_seconds_nothing_is_retried(proxy, database_url, runtime_id):
    async with AsyncClient(proxy.url, TOKEN) as client:
        proxy.lose, proxy.seen[:] = 1, []
        with pytest.raises(TransportError):
            await client.enqueue(runtime_id, "once")
    assert len(proxy.seen) == 1
    [(_, key)] = await stored(database_url, runtime_id)
    assert key is None  # and no key of the client's own
