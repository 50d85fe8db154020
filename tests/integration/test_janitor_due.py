"""I4 due time: a verdict's TTL never outlives the earliest run_at of the runtime's
delayed tasks, so a task coming due wakes its pollers.

Nothing bumps a runtime when a delayed task comes due; only the verdict's TTL ends
the parked poll's sleep. The verdict TTL setting is 60 s and the janitor (whose
repair could also deliver it) runs only its first pass at start, so a delivery
within a second of run_at can only come from the due-time cap.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.redis.keys import keys_for
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import (
    first_pass_done,
    janitor_settings,
)

pytestmark = pytest.mark.integration

EMPTY_TTL = 60.0


def due_in_monotonic(task: dict[str, Any]) -> float:
    """The task's run_at on this process's monotonic clock."""
    run_at = datetime.fromisoformat(task["run_at"].replace("Z", "+00:00"))
    return time.monotonic() + (run_at - datetime.now(UTC)).total_seconds()


async def timed_poll(gw: Instance, runtime: str, wait: float) -> tuple[list[dict], float]:
    status, body = await gw.call(
        "POST",
        f"/v1/runtimes/{runtime}/claim",
        {"worker_id": "w", "wait_seconds": wait, "lease_seconds": 30},
    )
    assert status == 200, body
    return body["tasks"], time.monotonic()


async def test_parked_poll_gets_a_delayed_task_when_it_comes_due(
    own_database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    redis_client: aioredis.Redis,
) -> None:
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    empty_key = keys_for(redis_prefix, runtime_id).empty
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": "later"}, delay_seconds=1.5)
        due = due_in_monotonic(task)
        polling = asyncio.create_task(timed_poll(gw, runtime_id, wait=10))

        # Right after the empty scan: the verdict lives no longer than the delay.
        deadline = time.monotonic() + 1.0
        while not await redis_client.exists(empty_key):
            assert time.monotonic() < deadline, "the empty scan wrote no verdict"
            await asyncio.sleep(0.005)
        pttl = await redis_client.pttl(empty_key)
        remaining = due - time.monotonic()
        assert 0 < pttl <= 1500, pttl
        assert pttl / 1000 <= remaining + 0.05, (pttl, remaining)

        tasks, answered = await asyncio.wait_for(polling, 15)
        assert [t["id"] for t in tasks] == [task["id"]], "the poll ran out empty"
        assert answered > due - 0.1, f"handed out {due - answered:.2f}s before its run_at"
        assert answered - due < 1.0, f"handed out {answered - due:.2f}s after its run_at"


async def test_task_coming_due_while_the_empty_scan_finishes_is_not_missed(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    """The task comes due while the claim is still working out the next due time (a
    slow statement, here made slow on purpose). The verdict must not outlive the
    task's run_at: the scan and the due time measure from the statement's instant."""
    from gateway.store.sql import leases as lease_sql

    # The due-time part of the claim statement (NEXT_DUE inside CLAIM) sleeps first.
    slow_next_due = lease_sql.NEXT_DUE.replace("FROM tasks", "FROM pg_sleep(0.6), tasks", 1)
    slow = lease_sql.CLAIM.replace(lease_sql.NEXT_DUE, slow_next_due, 1)
    assert slow_next_due != lease_sql.NEXT_DUE and slow != lease_sql.CLAIM
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        monkeypatch.setattr(lease_sql, "CLAIM", slow)
        task = await gw.enqueue(runtime_id, {"job": "later"}, delay_seconds=0.3)
        due = due_in_monotonic(task)
        tasks, answered = await asyncio.wait_for(timed_poll(gw, runtime_id, wait=4), 10)
        assert [t["id"] for t in tasks] == [task["id"]], "the poll ran out empty"
        assert answered - due < 1.5, f"handed out {answered - due:.2f}s after its run_at"


async def test_a_verdict_whose_life_is_unknown_never_parks_a_poll_past_a_due_task(
    own_database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    redis_client: aioredis.Redis,
) -> None:
    """A verdict read as a hit whose remaining life is unknown (here: no expiry at all,
    as a hand-written or older key has; PTTL -1) or spent (PTTL 0) used to park the
    poll for the whole empty TTL, 60 s here, hiding a task that came due meanwhile.
    It is no hit: the poll asks Postgres, and the verdict it writes lives no longer
    than the task's delay (I4)."""
    keys = keys_for(redis_prefix, runtime_id)
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": "later"}, delay_seconds=1.0)
        due = due_in_monotonic(task)
        version = await redis_client.get(keys.version)
        assert version is not None
        await redis_client.set(keys.empty, version)  # an "empty" verdict with no expiry
        tasks, answered = await asyncio.wait_for(timed_poll(gw, runtime_id, wait=10), 15)
        assert [t["id"] for t in tasks] == [task["id"]], "the poll ran out empty"
        assert answered - due < 1.0, f"handed out {answered - due:.2f}s after its run_at"
