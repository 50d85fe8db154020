"""A poll whose client goes away mid-claim receives nothing: the tasks claimed for it
go back to the queue, not counted as an attempt, and other daemons get them (I10)."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.harness import TOKEN, make_settings, running_gateway


async def test_tasks_claimed_for_a_departed_poll_go_back_to_the_queue(
    database_url, redis_url, redis_prefix, runtime_id, monkeypatch
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
                    json={"worker_id": "leaver", "wait_seconds": 5},
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
        assert gw.gateway.metrics.unclaimed._value.get() == 1
        [again] = await gw.claim(runtime_id, "stayer", wait_seconds=2)
        assert again["id"] == task["id"] and again["attempts"] == 1


async def test_a_claim_without_a_wait_whose_client_left_gives_its_tasks_back(
    database_url, redis_url, redis_prefix, runtime_id, monkeypatch
):
    """wait_seconds 0 has no disconnect watcher: the handler checks once the rows are in."""
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "job")
        store = gw.gateway.store
        original = store.claim
        leased = asyncio.Event()

        async def slow_claim(*args, **kwargs):
            result = await original(*args, **kwargs)
            leased.set()
            await asyncio.sleep(0.5)
            return result

        monkeypatch.setattr(store, "claim", slow_claim)
        async with aiohttp.ClientSession() as http:
            request = asyncio.create_task(
                http.post(
                    f"{gw.url}/v1/runtimes/{runtime_id}/claim",
                    json={"worker_id": "leaver"},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
            )
            await asyncio.wait_for(leased.wait(), 5)
            request.cancel()
        monkeypatch.setattr(store, "claim", original)
        async with asyncio.timeout(5):
            while (await gw.call("GET", f"/v1/tasks/{task['id']}"))[1]["status"] != "queued":
                await asyncio.sleep(0.05)
        [again] = await gw.claim(runtime_id, "stayer")
        assert again["id"] == task["id"] and again["attempts"] == 1
