"""Delayed tasks are stored `scheduled`, out of the claim index (design section 4).

To the API they are `queued` throughout: in answers, in the `status=queued` listing and
in stats. A claim takes them as soon as they are due, before the janitor has made them
`queued` (correctness never waits for it), and the janitor's promotion moves due ones
in batches and bumps their runtimes. Cancel, expiry and retry treat them as queued.

Each test has a freshly migrated database of its own, with the background janitor off
after its first pass, so that stored statuses are exactly what the test made them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.redis.keys import keys_for
from tests.support.databases import execute, fetch
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import first_pass_done, janitor_settings, row_of

pytestmark = pytest.mark.integration


async def stored_status(database_url: str, task: dict[str, Any]) -> str:
    return str((await row_of(database_url, task["id"]))["status"])


async def get(gw: Instance, task: dict[str, Any]) -> dict[str, Any]:
    status, body = await gw.call("GET", f"/v1/tasks/{task['id']}")
    assert status == 200, body
    return dict(body)


async def listed(gw: Instance, runtime: str, status: str) -> list[str]:
    code, body = await gw.call("GET", f"/v1/runtimes/{runtime}/tasks?status={status}")
    assert code == 200, body
    return [t["id"] for t in body["tasks"]]


async def make_due(database_url: str, task: dict[str, Any]) -> None:
    """Move a scheduled task's run_at into the past, as time would, without sleeping."""
    await execute(
        database_url,
        "UPDATE tasks SET run_at = now() - interval '2 seconds' WHERE id = $1::uuid "
        "AND status = 'scheduled'",
        task["id"],
    )


async def test_delayed_tasks_are_stored_scheduled_and_shown_queued(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        now = await gw.enqueue(runtime_id, {"n": 0})
        later = await gw.enqueue(runtime_id, {"n": 1}, delay_seconds=3600)
        at = await gw.enqueue(runtime_id, {"n": 2}, run_at="2100-01-01T00:00:00Z")
        past = await gw.enqueue(runtime_id, {"n": 3}, run_at="2000-01-01T00:00:00Z")
        status, body = await gw.call(
            "POST",
            f"/v1/runtimes/{runtime_id}/tasks:batch",
            {"tasks": [{"payload": 4}, {"payload": 5, "delay_seconds": 600}]},
        )
        assert status == 201, body
        batch_now, batch_later = body["tasks"]

        everything = [now, later, at, past, batch_now, batch_later]
        stored = {k: await stored_status(own_database_url, t) for k, t in enumerate(everything)}
        assert stored == {
            0: "queued",
            1: "scheduled",
            2: "scheduled",
            3: "queued",
            4: "queued",
            5: "scheduled",
        }
        for task in everything:
            assert task["status"] == "queued", task
            assert (await get(gw, task))["status"] == "queued"
        assert sorted(await listed(gw, runtime_id, "queued")) == sorted(t["id"] for t in everything)
        status, stats = await gw.call("GET", f"/v1/runtimes/{runtime_id}/stats")
        assert status == 200, stats
        assert stats["counts"]["queued"] == 6, stats
        assert "scheduled" not in stats["counts"], stats

        # Only the due ones are handed out.
        got = await gw.claim(runtime_id, max_tasks=10)
        assert sorted(t["id"] for t in got) == sorted(t["id"] for t in (now, past, batch_now))


async def test_a_due_scheduled_task_is_claimed_before_the_janitor_moves_it(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Merged by priority, then age, with the queued ones."""
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        low = await gw.enqueue(runtime_id, "low", priority=10)
        high_delayed = await gw.enqueue(runtime_id, "high", priority=90, delay_seconds=3600)
        mid = await gw.enqueue(runtime_id, "mid", priority=50)
        await make_due(own_database_url, high_delayed)
        assert await stored_status(own_database_url, high_delayed) == "scheduled"
        got = await gw.claim(runtime_id, max_tasks=3)
        assert [t["id"] for t in got] == [high_delayed["id"], mid["id"], low["id"]]
        assert [t["status"] for t in got] == ["claimed"] * 3
        assert got[0]["attempts"] == 1


async def test_a_scheduled_task_coming_due_under_a_cached_empty_verdict_is_claimed(
    own_database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    redis_client: aioredis.Redis,
) -> None:
    """I4: the empty verdict written while the task was delayed lives no longer than
    its delay, so a poll after its run_at asks Postgres and receives it, though nothing
    bumped the runtime and the janitor has not moved it to queued (it still is
    `scheduled` when the poll arrives)."""
    empty_key = keys_for(redis_prefix, runtime_id).empty
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=60.0)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": "later"}, delay_seconds=1.0)
        assert await gw.claim(runtime_id, wait_seconds=0) == []
        pttl = await redis_client.pttl(empty_key)
        assert 0 < pttl <= 1000, f"the empty verdict lives {pttl} ms, past the task's delay"
        await asyncio.sleep(pttl / 1000 + 0.05)
        assert await stored_status(own_database_url, task) == "scheduled"
        got = await gw.claim(runtime_id, wait_seconds=0)
        assert [t["id"] for t in got] == [task["id"]]


async def test_the_janitor_moves_due_scheduled_tasks_to_queued_and_bumps(
    own_database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    redis_client: aioredis.Redis,
) -> None:
    version_key = keys_for(redis_prefix, runtime_id).version
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        due = [await gw.enqueue(runtime_id, i, delay_seconds=3600) for i in range(3)]
        waiting = await gw.enqueue(runtime_id, "waiting", delay_seconds=3600)
        for task in due:
            await make_due(own_database_url, task)
        before = await redis_client.get(version_key)
        report = await gw.gateway.janitor.run_once()
        assert report.errors == []
        assert report.promoted == 3
        assert [await stored_status(own_database_url, t) for t in due] == ["queued"] * 3
        assert await stored_status(own_database_url, waiting) == "scheduled"
        assert await redis_client.get(version_key) != before, "the runtime was not bumped"
        again = await gw.gateway.janitor.run_once()
        assert again.promoted == 0


async def test_promotion_works_in_batches_across_runtimes(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """More due tasks than one batch, over several runtimes: every one moves, and the
    delayed ones of those runtimes stay."""
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, janitor_batch_size=7)
    runtimes = [f"{runtime_id}-{k}" for k in range(4)]
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        for rt in runtimes:
            await gw.call(
                "POST",
                f"/v1/runtimes/{rt}/tasks:batch",
                {"tasks": [{"payload": i, "delay_seconds": 3600} for i in range(10)]},
            )
        await execute(
            own_database_url,
            "UPDATE tasks SET run_at = now() - interval '1 second' "
            "WHERE status = 'scheduled' AND (payload::text)::int < 6",
        )
        report = await gw.gateway.janitor.run_once()
        assert report.errors == []
        assert report.promoted == 4 * 6
        rows = await fetch(
            own_database_url, "SELECT status, count(*) AS n FROM tasks GROUP BY status"
        )
        assert {r["status"]: r["n"] for r in rows} == {"queued": 24, "scheduled": 16}


async def test_fail_with_backoff_stores_scheduled_and_retry_after_zero_queued(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        backoff, at_once = [await gw.enqueue(runtime_id, i) for i in range(2)]
        got = {t["id"]: t for t in await gw.claim(runtime_id, max_tasks=2)}
        for task, extra in ((backoff, {}), (at_once, {"retry_after_seconds": 0})):
            lease = got[task["id"]]["lease_id"]
            status, body = await gw.call(
                "POST", f"/v1/tasks/{task['id']}/fail", {"lease_id": lease, "error": "x", **extra}
            )
            assert status == 200, body
            assert body["status"] == "queued", body
        assert await stored_status(own_database_url, backoff) == "scheduled"
        assert await stored_status(own_database_url, at_once) == "queued"
        [again] = await gw.claim(runtime_id, max_tasks=2)
        assert again["id"] == at_once["id"]


async def test_cancel_expiry_and_retry_of_scheduled_tasks(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        cancelled = await gw.enqueue(runtime_id, "c", delay_seconds=3600)
        status, body = await gw.call("POST", f"/v1/tasks/{cancelled['id']}/cancel")
        assert status == 200 and body["status"] == "cancelled", body
        assert await stored_status(own_database_url, cancelled) == "cancelled"

        # Past its expires_at while still scheduled (a backoff can do that): expired at
        # once to every reader, and written down by the janitor.
        expiring = await gw.enqueue(runtime_id, "e", delay_seconds=3600, ttl_seconds=60)
        await execute(
            own_database_url,
            "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            expiring["id"],
        )
        assert (await get(gw, expiring))["status"] == "expired"
        assert expiring["id"] in await listed(gw, runtime_id, "expired")
        assert expiring["id"] not in await listed(gw, runtime_id, "queued")
        await make_due(own_database_url, expiring)
        assert await gw.claim(runtime_id, max_tasks=5) == [], "an expired task was handed out"
        report = await gw.gateway.janitor.run_once()
        assert report.expired == 1 and report.promoted == 0, report
        assert await stored_status(own_database_url, expiring) == "expired"

        status, body = await gw.call("POST", f"/v1/tasks/{expiring['id']}/retry")
        assert status == 200 and body["status"] == "queued", body
        assert await stored_status(own_database_url, expiring) == "queued"
        [got] = await gw.claim(runtime_id)
        assert got["id"] == expiring["id"]


async def test_the_repair_walk_sees_runtimes_with_due_scheduled_tasks(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """The repair walk (I6) finds a runtime whose only claimable task is a due
    scheduled one, as it finds one with a queued task; not one whose tasks are all
    delayed."""
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix)
    names = {"queued": runtime_id + "-a", "due": runtime_id + "-b", "later": runtime_id + "-c"}
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        await gw.enqueue(names["queued"], "queued")
        await execute(
            own_database_url,
            "UPDATE tasks SET run_at = now() - interval '2 seconds' WHERE status = 'queued'",
        )
        await make_due(own_database_url, await gw.enqueue(names["due"], "due", delay_seconds=3600))
        await gw.enqueue(names["later"], "not due", delay_seconds=3600)
        for limit in (100, 1):  # one page, and page by page
            found: list[str] = []
            after = ""
            while True:
                page = await gw.gateway.store.claimable_runtimes(limit, after)
                found += page.claimable
                if not page.next_after:
                    break
                after = page.next_after
            assert found == [names["queued"], names["due"]]
