"""Lease reclaim by the janitor (design section 4, I1, I7).

A lease whose time ran out goes back to the queue at the janitor's next pass (or to
`dead` once attempts reached max_attempts, or to `cancelled` when a cancel was
requested), and the version bump that follows wakes parked polls. Until that pass, the
lapsed lease is still honoured, as SQS does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.store.janitor import RuntimePage
from tests.support.gateways import running_gateway
from tests.support.http import call_ok
from tests.support.janitor import (
    claimable_for_a_while,
    first_pass_done,
    janitor_settings,
    row_of,
    wait_lapsed,
)
from tests.support.metrics import sample

pytestmark = pytest.mark.integration


async def test_lapsed_lease_is_reclaimed_claimed_again_and_the_old_lease_refused(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": 1})
        [first] = await gw.claim(runtime_id, "daemon-1", lease_seconds=1)
        assert first["id"] == task["id"] and first["attempts"] == 1
        # daemon-1 vanishes. Its lease lapses; nobody claims the task in between.
        await wait_lapsed(own_database_url, [task["id"]])
        assert await gw.claim(runtime_id, "daemon-2", wait_seconds=0) == []

        report = await gw.gateway.janitor.run_once()
        assert report.reclaimed == 1, report
        assert report.errors == []
        row = await row_of(own_database_url, task["id"])
        assert row["status"] == "queued"
        assert row["lease_id"] is None and row["worker_id"] is None
        assert row["last_error"] == "lease expired"
        assert row["attempts"] == 1
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="queued") == 1

        # The reclaim bumped the version, so the claim goes to Postgres and gets it.
        [second] = await gw.claim(runtime_id, "daemon-2", wait_seconds=0, lease_seconds=30)
        assert second["id"] == task["id"]
        assert second["attempts"] == 2
        assert second["worker_id"] == "daemon-2"
        assert second["lease_id"] != first["lease_id"]

        # daemon-1 comes back late: every lease operation with its lease is refused.
        old = {"lease_id": first["lease_id"]}
        for op, body in (
            ("heartbeat", old),
            ("complete", {**old, "result": "late"}),
            ("fail", {**old, "error": "late"}),
            ("release", old),
        ):
            status, problem = await gw.call("POST", f"/v1/tasks/{task['id']}/{op}", body)
            assert status == 409, (op, status, problem)
            assert problem["code"] == "lease_lost", (op, problem)
        # ...and changed nothing: daemon-2 still holds it and can finish it.
        row = await row_of(own_database_url, task["id"])
        assert row["status"] == "claimed"
        assert str(row["lease_id"]) == second["lease_id"]
        assert row["worker_id"] == "daemon-2" and row["attempts"] == 2
        done = await call_ok(
            gw,
            "POST",
            f"/v1/tasks/{task['id']}/complete",
            {"lease_id": second["lease_id"], "result": "ok"},
        )
        assert done["status"] == "completed" and done["result"] == "ok"


async def test_lapsed_lease_on_the_last_attempt_goes_dead(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": 1}, max_attempts=1)
        [held] = await gw.claim(runtime_id, "daemon-1", lease_seconds=1)
        await wait_lapsed(own_database_url, [task["id"]])

        report = await gw.gateway.janitor.run_once()
        assert report.reclaimed == 1, report
        row = await row_of(own_database_url, task["id"])
        assert row["status"] == "dead"
        assert row["last_error"] == "lease expired"
        assert row["finished_at"] is not None
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="dead") == 1
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="queued") == 0

        assert await gw.claim(runtime_id, "daemon-2", wait_seconds=0) == []
        status, problem = await gw.complete(held)
        assert status == 409 and problem["code"] == "lease_lost", problem
        assert (await row_of(own_database_url, task["id"]))["status"] == "dead"


async def test_lapsed_lease_with_a_cancel_requested_ends_cancelled(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": 1})
        [held] = await gw.claim(runtime_id, "daemon-1", lease_seconds=1)
        flagged = await call_ok(gw, "POST", f"/v1/tasks/{task['id']}/cancel")
        assert flagged["status"] == "claimed" and flagged["cancel_requested"] is True
        await wait_lapsed(own_database_url, [task["id"]])

        report = await gw.gateway.janitor.run_once()
        assert report.reclaimed == 1, report
        assert (await row_of(own_database_url, task["id"]))["status"] == "cancelled"
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="cancelled") == 1
        assert await gw.claim(runtime_id, "daemon-2", wait_seconds=0) == []
        status, problem = await gw.complete(held)
        assert status == 409 and problem["code"] == "lease_lost", problem


async def test_lapsed_lease_not_yet_reclaimed_is_still_honoured(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Design section 4: a lease whose time ran out but which nobody has replaced yet
    is still honoured (heartbeat, complete). Only the janitor's reclaim ends it."""
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        a = await gw.enqueue(runtime_id, {"job": "a"})
        b = await gw.enqueue(runtime_id, {"job": "b"})
        held = await gw.claim(runtime_id, "daemon-1", max_tasks=2, lease_seconds=1)
        by_id = {t["id"]: t for t in held}
        assert set(by_id) == {a["id"], b["id"]}
        await wait_lapsed(own_database_url, [a["id"], b["id"]])

        # a: heartbeat with the lapsed lease renews it.
        beat = await call_ok(
            gw,
            "POST",
            f"/v1/tasks/{a['id']}/heartbeat",
            {"lease_id": by_id[a["id"]]["lease_id"], "lease_seconds": 60},
        )
        assert beat["status"] == "claimed"
        assert beat["lease_id"] == by_id[a["id"]]["lease_id"]
        assert beat["lease_expires_at"] > by_id[a["id"]]["lease_expires_at"]
        # b: complete with the lapsed lease succeeds.
        done = await call_ok(
            gw,
            "POST",
            f"/v1/tasks/{b['id']}/complete",
            {"lease_id": by_id[b["id"]]["lease_id"], "result": 7},
        )
        assert done["status"] == "completed" and done["result"] == 7

        # The janitor now finds nothing to reclaim: a was renewed, b is finished.
        report = await gw.gateway.janitor.run_once()
        assert report.reclaimed == 0, report
        row = await row_of(own_database_url, a["id"])
        assert row["status"] == "claimed" and str(row["lease_id"]) == by_id[a["id"]]["lease_id"]
        assert row["attempts"] == 1
        done = await call_ok(
            gw,
            "POST",
            f"/v1/tasks/{a['id']}/complete",
            {"lease_id": by_id[a["id"]]["lease_id"]},
        )
        assert done["status"] == "completed"


async def no_runtimes(limit: int, after: str = "") -> RuntimePage:
    return RuntimePage(claimable=[], next_after="", visited=0)


async def test_reclaim_wakes_a_parked_poll(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    """The reclaim bumps the runtime's version after its commit (I1): a poll parked
    behind an empty verdict (TTL 60 s, far beyond the bound) gets the task within
    about 2 s of the lease's expiry, through the background loop (interval 0.2 s)."""
    cfg = janitor_settings(
        own_database_url,
        redis_url,
        redis_prefix,
        janitor_interval_seconds=0.2,
        empty_ttl_seconds=60,
    )
    async with running_gateway(cfg) as gw:
        # The repair pass (I6) would also bump the runtime, about a second after the
        # reclaim; keep it out so that only the reclaim's own bump can wake the poll.
        monkeypatch.setattr(gw.gateway.store, "claimable_runtimes", no_runtimes)
        task = await gw.enqueue(runtime_id, {"job": 1})
        [first] = await gw.claim(runtime_id, "daemon-1", lease_seconds=1)
        lease_expiry = time.monotonic() + 1.0  # the lease ends before this moment
        poll_started = time.monotonic()
        status, body = await gw.call(
            "POST",
            f"/v1/runtimes/{runtime_id}/claim",
            {"worker_id": "daemon-2", "wait_seconds": 10, "lease_seconds": 30},
        )
        answered = time.monotonic()
        assert status == 200, body
        assert [t["id"] for t in body["tasks"]] == [first["id"]] == [task["id"]]
        assert body["tasks"][0]["attempts"] == 2
        assert answered - poll_started > 0.5, "answered before the lease could lapse"
        assert answered - lease_expiry < 2.0, (
            f"parked poll answered {answered - lease_expiry:.2f}s after the lease expired"
        )
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="queued") == 1


async def test_late_holder_loses_to_the_new_holder_even_when_racing(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """I7 around the reclaim: the late holder's complete races the reclaim and the
    new claim; whatever the interleaving, at most one of the two leases ends the task,
    and the task's final state matches the winner."""
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"job": 1})
        [first] = await gw.claim(runtime_id, "daemon-1", lease_seconds=1)
        await wait_lapsed(own_database_url, [task["id"]])

        async def reclaim_and_claim() -> list[dict]:
            await gw.gateway.janitor.run_once()
            return await gw.claim(runtime_id, "daemon-2", wait_seconds=0, lease_seconds=30)

        late, got = await asyncio.gather(
            gw.call(
                "POST",
                f"/v1/tasks/{task['id']}/complete",
                {"lease_id": first["lease_id"], "result": "late"},
            ),
            reclaim_and_claim(),
        )
        row = await row_of(own_database_url, task["id"])
        if late[0] == 200:
            # The late complete won: the task is finished and nobody got it again.
            assert got == [] and row["status"] == "completed", (got, row)
        elif got:
            assert late[0] == 409 and late[1]["code"] == "lease_lost", late
            assert [t["id"] for t in got] == [task["id"]]
            assert row["status"] == "claimed" and str(row["lease_id"]) == got[0]["lease_id"]
        else:
            # A late complete locks only a task its lease holds, so it no longer hides
            # the re-queued task from the claim (test_late_lease_lock.py makes that
            # certain). One instant is left: a complete that began while its lease
            # still held the task waits for the reclaim, checks the row again and
            # finds the lease gone, yet keeps that row's lock until its statement
            # ends; a claim in that instant skips the row. Neither holds the task: it
            # is queued, and the janitor's repair (I6) delivers it
            # (test_janitor_repair.py makes this case certain).
            assert late[0] == 409 and late[1]["code"] == "lease_lost", late
            assert row["status"] == "queued", row
            await claimable_for_a_while(own_database_url, [task["id"]])
            await gw.gateway.janitor.run_once()
            again = await gw.claim(runtime_id, "daemon-3", wait_seconds=0, lease_seconds=30)
            assert [t["id"] for t in again] == [task["id"]]
