"""A poll whose client goes away mid-claim receives nothing: the tasks claimed for it
go back to the queue, not counted as an attempt, and other daemons get them (I10)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.metrics import sample


@pytest.mark.parametrize(
    "wait",
    # A parked poll's watcher sees it leave; without a wait there is no watcher, and the
    # handler checks once the rows are in.
    [{"wait_seconds": 5}, {}],
    ids=["long-poll", "no-wait"],
)
async def test_tasks_claimed_for_a_departed_poll_go_back_to_the_queue(
    database_url, redis_url, redis_prefix, runtime_id, monkeypatch, wait
):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "job")
        store = gw.gateway.store
        original = store.claim
        claim_started = asyncio.Event()

        async def slow_claim(*args, **kwargs):
            result = await original(*args, **kwargs)  # the rows are leased now
            claim_started.set()
            await asyncio.sleep(0.5)  # ...while the client hangs up
            return result

        monkeypatch.setattr(store, "claim", slow_claim)
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(
                http.post(
                    f"{gw.url}/v1/runtimes/{runtime_id}/claim",
                    json={"worker_id": "leaver", **wait},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
            )
            await asyncio.wait_for(claim_started.wait(), 5)
            request.cancel()  # the client leaves while its claim is in flight
        monkeypatch.setattr(store, "claim", original)

        async with asyncio.timeout(5):
            while True:
                _, row = await gw.call("GET", f"/v1/tasks/{task['id']}")
                if row["status"] == "queued":
                    break
                await asyncio.sleep(0.05)
        assert row["attempts"] == 0 and "lease_id" not in row, row
        assert sample(gw, "gateway_leases_returned_total") == 1
        [again] = await gw.claim(runtime_id, "stayer", wait_seconds=2)
        assert again["id"] == task["id"] and again["attempts"] == 1
