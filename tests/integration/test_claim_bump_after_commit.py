"""I1: every change that makes a task claimable bumps the runtime's version after its
commit and publishes a wake-up, so a poll parked on an 'empty' verdict gets the task
at once, not a verdict TTL later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.gateways import Instance, make_settings, running_gateway

# Long enough that only a bump can explain a prompt answer.
EMPTY_TTL = 60.0

Act = Callable[[], Awaitable[None]]


async def _held(gw: Instance, rt: str, **fields: Any) -> dict[str, Any]:
    await gw.enqueue(rt, "job", **fields)
    [task] = await gw.claim(
        rt, "first", **{k: v for k, v in fields.items() if k == "lease_seconds"}
    )
    return task


async def _call_ok(gw: Instance, path: str, body: Any, status: str) -> None:
    code, answer = await gw.call("POST", path, body)
    assert code == 200 and answer["status"] == status, answer


async def enqueue(gw: Instance, rt: str) -> Act:
    return lambda: gw.enqueue(rt, "new")


async def batch(gw: Instance, rt: str) -> Act:
    async def act() -> None:
        code, body = await gw.call(
            "POST", f"/v1/runtimes/{rt}/tasks:batch", {"tasks": [{"payload": 1}]}
        )
        assert code == 201, body

    return act


async def fail_retry(gw: Instance, rt: str) -> Act:
    task = await _held(gw, rt)
    body = {"lease_id": task["lease_id"], "error": "boom", "retry_after_seconds": 0}
    return lambda: _call_ok(gw, f"/v1/tasks/{task['id']}/fail", body, "queued")


async def release(gw: Instance, rt: str) -> Act:
    task = await _held(gw, rt)
    body = {"lease_id": task["lease_id"]}
    return lambda: _call_ok(gw, f"/v1/tasks/{task['id']}/release", body, "queued")


async def dead_letter_retry(gw: Instance, rt: str) -> Act:
    task = await _held(gw, rt, max_attempts=1)
    body = {"lease_id": task["lease_id"], "error": "x"}
    await _call_ok(gw, f"/v1/tasks/{task['id']}/fail", body, "dead")
    return lambda: _call_ok(gw, f"/v1/tasks/{task['id']}/retry", None, "queued")


async def lease_expiry(gw: Instance, rt: str) -> Act:
    await _held(gw, rt, lease_seconds=1)
    await asyncio.sleep(1.1)

    async def act() -> None:
        assert (await gw.gateway.janitor.run_once()).reclaimed >= 1

    return act


CHANGES = [enqueue, batch, fail_retry, release, dead_letter_retry, lease_expiry]


@pytest.mark.parametrize("change", CHANGES, ids=[c.__name__ for c in CHANGES])
async def test_a_change_that_makes_work_claimable_wakes_a_parked_poll(
    database_url, redis_url, redis_prefix, runtime_id, change
):
    settings = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    # The change happens on one instance and the poll parks on the other, so the
    # wake-up has to travel through Redis.
    async with (
        asyncio.timeout(25),  # a hang fails here, naming the step, before the 30 s timeout
        running_gateway(settings) as a,
        running_gateway(settings) as b,
    ):
        # No janitor repair pass may stand in for a missing bump.
        await a.gateway.janitor.stop()
        await b.gateway.janitor.stop()
        act = await change(a, runtime_id)
        assert await b.claim(runtime_id, "probe") == []  # writes the empty verdict
        assert (await b.gateway.cache.read(runtime_id)).hit
        poll = asyncio.create_task(b.claim(runtime_id, "parked", wait_seconds=15))
        async with asyncio.timeout(5):
            while b.gateway.claimer.parked(runtime_id) < 1:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert not poll.done()
        started = time.monotonic()
        await act()
        got = await asyncio.wait_for(poll, 5)
        assert len(got) == 1, got
        assert time.monotonic() - started < 3.0
