"""Verdict repair (I6): a version bump lost after the commit costs seconds, not a
verdict TTL.

A lost bump is made exactly: the task is inserted through `store.enqueue` without
the `announce` that the enqueue route runs after the commit, on a runtime whose
verdict already says empty. The verdict TTL is 60 s, so nothing but the janitor's
repair can deliver the task within the bounds asserted here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from gateway.store.sql import janitor as janitor_sql
from gateway.store.sql import leases as lease_sql
from tests.support.databases import execute, waiting_for_a_lock
from tests.support.gateways import running_gateway
from tests.support.janitor import (
    claimable_for_a_while,
    empty_verdict,
    enqueue_without_bump,
    first_pass_done,
    janitor_settings,
)
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

EMPTY_TTL = 60.0


async def test_parked_poll_behind_a_lost_bump_gets_the_task_within_seconds(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = janitor_settings(
        own_database_url,
        redis_url,
        redis_prefix,
        janitor_interval_seconds=0.3,
        empty_ttl_seconds=EMPTY_TTL,
    )
    async with running_gateway(cfg) as gw:
        cache = gw.gateway.cache
        await empty_verdict(gw, runtime_id)
        task_id = await enqueue_without_bump(gw, runtime_id, {"job": "stranded"})
        # The lost bump left a verdict that says empty while a task is claimable.
        assert (await cache.read(runtime_id)).hit is True
        repairs_before = sample(gw, "gateway_verdict_repairs_total")

        started = time.monotonic()
        status, body = await gw.call(
            "POST",
            f"/v1/runtimes/{runtime_id}/claim",
            {"worker_id": "w", "wait_seconds": 15, "lease_seconds": 30},
        )
        elapsed = time.monotonic() - started
        assert status == 200, body
        assert [t["id"] for t in body["tasks"]] == [task_id], f"after {elapsed:.2f}s: {body}"
        assert elapsed < 3.0, f"the repair took {elapsed:.2f}s"
        assert sample(gw, "gateway_verdict_repairs_total") > repairs_before


async def test_run_once_reports_the_repaired_runtime(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        cache, janitor = gw.gateway.cache, gw.gateway.janitor
        await empty_verdict(gw, runtime_id)
        task_id = await enqueue_without_bump(gw, runtime_id, {"job": "stranded"})
        await claimable_for_a_while(own_database_url, [task_id])
        version = (await cache.read(runtime_id)).version
        assert (await cache.read(runtime_id)).hit is True

        report = await janitor.run_once()
        assert report.repaired == [runtime_id], report
        assert report.errors == []
        assert sample(gw, "gateway_verdict_repairs_total") == 1
        after = await cache.read(runtime_id)
        assert after.hit is False and after.version != version, "the repair bumps the version"
        # Repaired once is enough: the verdict no longer says empty.
        assert (await janitor.run_once()).repaired == []
        [got] = await gw.claim(runtime_id, "w", wait_seconds=0)
        assert got["id"] == task_id


async def test_delayed_tasks_are_not_repaired_before_they_are_due(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A runtime whose only queued task is not due yet is truly empty: its verdict is
    right and must not be bumped. A runtime with a due task, in the same pass, is."""
    delayed_rt, due_rt = f"{runtime_id}-delayed", f"{runtime_id}-due"
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        cache, janitor = gw.gateway.cache, gw.gateway.janitor
        await empty_verdict(gw, delayed_rt)
        await empty_verdict(gw, due_rt)
        delayed_id = await enqueue_without_bump(gw, delayed_rt, {"job": 1}, delay_seconds=600)
        due_id = await enqueue_without_bump(gw, due_rt, {"job": 2})
        # Both rows were inserted a while ago; only one of them is due.
        await claimable_for_a_while(own_database_url, [delayed_id, due_id])
        delayed_version = (await cache.read(delayed_rt)).version

        report = await janitor.run_once()
        assert report.repaired == [due_rt], report
        verdict = await cache.read(delayed_rt)
        assert verdict.hit is True and verdict.version == delayed_version
        assert sample(gw, "gateway_verdict_repairs_total") == 1

        # Once it comes due (and the verdict still says empty), it is repaired too.
        await execute(
            own_database_url,
            "UPDATE tasks SET run_at = now() - interval '5 seconds' WHERE id = $1::uuid",
            delayed_id,
        )
        assert (await janitor.run_once()).repaired == [delayed_rt]
        [got] = await gw.claim(delayed_rt, "w", wait_seconds=0)
        assert got["id"] == delayed_id


async def test_expired_tasks_are_not_repaired(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    """A queued task past its expires_at is not claimable: no bump for it, even
    while the expiry step has not marked it yet (here: it marks nothing)."""
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        await empty_verdict(gw, runtime_id)
        task_id = await enqueue_without_bump(gw, runtime_id, {"job": 1}, ttl_seconds=3600)
        await execute(
            own_database_url,
            "UPDATE tasks SET run_at = now() - interval '5 seconds', "
            "expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            task_id,
        )

        async def expiry_not_yet(limit: int) -> int:
            return 0

        monkeypatch.setattr(gw.gateway.store, "expire_tasks", expiry_not_yet)
        report = await gw.gateway.janitor.run_once()
        assert report.repaired == [], report
        assert (await gw.gateway.cache.read(runtime_id)).hit is True


async def test_repair_reaches_runtimes_beyond_one_batch(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Busy runtimes with a healthy backlog (their bumps were not lost) must not hide a
    stranded one from the repair. Batch size 2, three busy runtimes sorted before the
    stranded one: within a few passes the stranded runtime is repaired."""
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_batch_size=2, empty_ttl_seconds=EMPTY_TTL
    )
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        stranded = f"{runtime_id}-z-stranded"
        busy = [f"{runtime_id}-a-busy{i}" for i in range(3)]
        for rt in busy:
            await gw.enqueue(rt, {"backlog": rt})  # announced as usual: no stale verdict
        await empty_verdict(gw, stranded)
        task_id = await enqueue_without_bump(gw, stranded, {"job": "stranded"})
        await execute(own_database_url, "UPDATE tasks SET run_at = now() - interval '5 seconds'")
        assert task_id

        repaired: list[str] = []
        for _ in range(5):
            repaired += (await gw.gateway.janitor.run_once()).repaired
        assert stranded in repaired, repaired


async def test_bump_lost_to_a_real_redis_fault_is_repaired(
    own_database_url: str, redis_process: Any, runtime_id: str, redis_prefix: str
) -> None:
    """End to end with a real fault: Redis pauses writes (CLIENT PAUSE WRITE) while a
    task is enqueued over HTTP. The enqueue still succeeds (I5), its bump times out
    and is lost, and when Redis is back the verdict still says empty. The parked poll
    gets the task from the repair, seconds later, not after the 60 s verdict TTL. (Sync
    match is off: it would hand the task to the poll in the enqueue, with no bump.)"""
    cfg = janitor_settings(
        own_database_url,
        redis_process.url,
        redis_prefix,
        janitor_interval_seconds=0.3,
        empty_ttl_seconds=EMPTY_TTL,
        sync_match_enabled=False,
    )
    admin = aioredis.Redis.from_url(redis_process.url, socket_timeout=5)
    try:
        async with running_gateway(cfg) as gw:
            cache = gw.gateway.cache
            await empty_verdict(gw, runtime_id)
            polling = asyncio.create_task(
                gw.call(
                    "POST",
                    f"/v1/runtimes/{runtime_id}/claim",
                    {"worker_id": "w", "wait_seconds": 15, "lease_seconds": 30},
                )
            )
            await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 2.0, "a poll")

            await admin.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
            try:
                started = time.monotonic()
                task = await gw.enqueue(runtime_id, {"job": "enqueued during the fault"})
                assert time.monotonic() - started < 2.0, "the enqueue waited on Redis"
            finally:
                await admin.execute_command("CLIENT", "UNPAUSE")
            assert sample(gw, "gateway_version_bumps_total", outcome="error") == 1, (
                "the bump was not lost"
            )
            # Stale, unless a janitor pass (every 0.3 s) has repaired it already: on a slow
            # machine one may run between the fault's end and this read.
            stale = (await cache.read(runtime_id)).hit
            repairs = sample(gw, "gateway_verdict_repairs_total")
            assert stale or repairs >= 1, "the verdict was neither stale nor repaired"
            assert not polling.done()

            status, body = await asyncio.wait_for(polling, 10)
            elapsed = time.monotonic() - started
            assert status == 200, body
            assert [t["id"] for t in body["tasks"]] == [task["id"]], body
            assert elapsed < 3.0, f"the stranded task took {elapsed:.2f}s"
            assert sample(gw, "gateway_verdict_repairs_total") >= 1
    finally:
        await admin.aclose()


async def test_a_parked_poll_that_missed_a_publish_is_woken_by_the_repair_pass(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """The bump landed (the verdict no longer says empty) but its publish never reached
    the poll parked on the old verdict: only the repair pass's wake-up reaches it."""
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        cache, janitor = gw.gateway.cache, gw.gateway.janitor
        await empty_verdict(gw, runtime_id)
        waiting = asyncio.create_task(gw.claim(runtime_id, "parked", wait_seconds=20))
        await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) == 1, 3, "poll parked")
        task_id = await enqueue_without_bump(gw, runtime_id, {"job": "missed"})
        await claimable_for_a_while(own_database_url, [task_id])
        # The bump, without its publish: the version moves on, nobody is told.
        client = aioredis.Redis.from_url(redis_url)
        try:
            await client.set(cache.keys(runtime_id).version, "lost-publish:1")
        finally:
            await client.aclose()
        assert (await cache.read(runtime_id)).hit is False
        await asyncio.sleep(0.5)
        assert not waiting.done(), "nothing but the repair pass should wake the poll"

        report = await janitor.run_once()
        assert report.repaired == [] and report.woken == [runtime_id], report
        got = await asyncio.wait_for(waiting, 3.0)
        assert [t["id"] for t in got] == [task_id]
        assert sample(gw, "gateway_janitor_wakeups_total") == 1


async def test_the_walk_is_bounded_per_pass_and_resumes_where_it_stopped(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """With pages of 4 runtimes, a pass visits at most REPAIR_PAGES_PER_PASS pages; the
    next pass goes on after the last runtime visited, so 19 stale runtimes are all
    repaired within ceil(19 / 8) = 3 passes, each exactly once, in id order."""
    from gateway.janitor import REPAIR_PAGES_PER_PASS

    batch = 4
    per_pass = REPAIR_PAGES_PER_PASS * batch
    cfg = janitor_settings(
        own_database_url,
        redis_url,
        redis_prefix,
        empty_ttl_seconds=EMPTY_TTL,
        janitor_batch_size=batch,
    )
    runtimes = [f"{runtime_id}-{i:02d}" for i in range(19)]
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        janitor = gw.gateway.janitor
        tasks = []
        for rt in runtimes:
            await empty_verdict(gw, rt)
            tasks.append(await enqueue_without_bump(gw, rt, {"job": rt}))
        await claimable_for_a_while(own_database_url, tasks)
        repaired: list[list[str]] = []
        for _ in range(-(-len(runtimes) // per_pass)):
            report = await janitor.run_once()
            assert report.errors == [], report
            assert report.visited <= per_pass, report
            repaired.append(report.repaired)
        assert [len(r) for r in repaired] == [8, 8, 3]
        assert [rt for r in repaired for rt in r] == runtimes
        # The round is over: the next pass starts again from the first runtime (whose
        # verdict is no longer stale, so it only wakes it).
        report = await janitor.run_once()
        assert report.repaired == [] and report.woken == runtimes[:per_pass], report


async def test_a_queued_row_a_lease_operation_held_is_repaired(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Not a lost bump, but the same stale empty. A lease operation locks only the
    tasks its lease holds (lease_sql._LEASE_HELD), yet one that began while its lease
    still held the task and had to wait for the reclaim that queued it again keeps the
    lock Postgres took to check the row again until its statement ends: a claim in
    that instant skips the row and records the runtime empty over it. The repair finds
    it like a lost bump. (A late operation that began after the reclaim locks nothing:
    tests/integration/test_late_lease_lock.py.)"""
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, empty_ttl_seconds=EMPTY_TTL)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        cache, janitor = gw.gateway.cache, gw.gateway.janitor
        task = await gw.enqueue(runtime_id, {"job": "held"})
        [first] = await gw.claim(runtime_id, "late", wait_seconds=0)
        await execute(
            own_database_url,
            "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            task["id"],
        )
        reclaimer, late = (
            await asyncpg.connect(own_database_url),
            await asyncpg.connect(own_database_url),
        )
        try:
            async with late.transaction():
                async with reclaimer.transaction():
                    # The janitor's reclaim, held open: the late complete, which finds
                    # the task held by its lease, waits for it.
                    assert len(await reclaimer.fetch(janitor_sql.RECLAIM_LEASES, 10)) == 1
                    completing = asyncio.create_task(
                        late.fetch(
                            lease_sql.COMPLETE_GROUP,
                            [uuid.UUID(task["id"])],
                            [uuid.UUID(first["lease_id"])],
                            ['"late"'],
                        )
                    )
                    await waiting_for_a_lock(reclaimer, late.get_server_pid())
                assert await completing == []  # checked again: the lease lost the task
                await cache.bump(runtime_id)  # the reclaim's bump, after its commit (I1)
                assert await gw.claim(runtime_id, "w", wait_seconds=0) == []
        finally:
            await asyncio.gather(reclaimer.close(), late.close())
        assert (await cache.read(runtime_id)).hit is True, "the claim recorded no empty verdict"
        assert await gw.claim(runtime_id, "w", wait_seconds=0) == []

        await claimable_for_a_while(own_database_url, [task["id"]])
        assert (await janitor.run_once()).repaired == [runtime_id]
        [got] = await gw.claim(runtime_id, "w", wait_seconds=0)
        assert got["id"] == task["id"]
