"""The client's `wait()`: the finished task, or WaitTimedOut, over repeated
`GET /v1/tasks/{id}?wait_seconds` against a real gateway; and its blocking wrapper."""

from __future__ import annotations

import asyncio

import pytest

from gateway_client import AsyncClient, Client, WaitTimedOut
from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.metrics import sample


async def test_wait_returns_the_finished_task(database_url, redis_url, redis_prefix, runtime_id):
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, {"n": 1})
        waiting = asyncio.create_task(client.wait(task.id, timeout_seconds=20))
        [claimed] = await client.claim(runtime_id, "w", wait_seconds=5)
        await client.complete(claimed.id, claimed.lease_id or "", "done")
        finished = await asyncio.wait_for(waiting, 20)
        assert finished.status == "completed" and finished.result == "done"
        # Dead is finished too: it is returned, not raised.
        task = await client.enqueue(runtime_id, {"n": 2})
        [claimed] = await client.claim(runtime_id, "w", wait_seconds=5)
        await client.fail(claimed.id, claimed.lease_id or "", "no", retry=False)
        assert (await client.wait(task.id, timeout_seconds=5)).status == "dead"


async def test_wait_raises_with_the_task_when_the_timeout_ends(
    database_url, redis_url, redis_prefix, runtime_id
):
    # The gateway's cap (2 s) is below the client's step (20 s): halved until accepted.
    settings = make_settings(database_url, redis_url, redis_prefix, max_wait_seconds=2)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, "never done")
        with pytest.raises(WaitTimedOut) as caught:
            await client.wait(task.id, timeout_seconds=3)
        assert caught.value.task.status == "queued" and caught.value.task.id == task.id
        assert "had not finished after 3 s" in caught.value.detail
        # Each accepted request waited on the gateway: a handful of them, not a spin.
        answered = sample(gw, "gateway_http_requests_total", route="/v1/tasks/{task_id}",
                          method="GET", status_class="2xx")  # fmt: skip
        assert 1 <= answered <= 4, answered


async def test_the_blocking_client_waits_too(database_url, redis_url, redis_prefix, runtime_id):
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw, AsyncClient(gw.url, TOKEN) as client:
        task = await client.enqueue(runtime_id, "x")

        def wait_blocking() -> str:
            with Client(gw.url, TOKEN) as blocking:
                return blocking.wait(task.id, timeout_seconds=20).status

        waiting = asyncio.create_task(asyncio.to_thread(wait_blocking))
        [claimed] = await client.claim(runtime_id, "w", wait_seconds=5)
        await client.complete(claimed.id, claimed.lease_id or "", None)
        assert await asyncio.wait_for(waiting, 20) == "completed"
