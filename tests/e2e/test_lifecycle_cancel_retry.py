"""Cancel and retry through the HTTP API (design section 4)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tests.support.http import get_task, req
from tests.support.lifecycle import (
    assert_problem,
    claim,
    claim_one,
    enqueue,
    lease_op,
    now_rfc3339,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def cancel(inst, task):
    return await req(inst, "POST", f"/v1/tasks/{task['id']}/cancel")


async def retry(inst, task):
    return await req(inst, "POST", f"/v1/tasks/{task['id']}/retry")


async def make_dead(inst, rt):
    await enqueue(inst, rt, "doomed", max_attempts=1)
    task = await claim_one(inst, rt)
    resp = await lease_op(inst, "fail", task, error="fatal")
    assert resp.body["status"] == "dead", resp.body
    return resp.body


async def make_completed(inst, rt):
    await enqueue(inst, rt, "fine")
    task = await claim_one(inst, rt)
    resp = await lease_op(inst, "complete", task, result="ok")
    assert resp.body["status"] == "completed", resp.body
    return resp.body


async def wait_past(stamp: str) -> None:
    left = (datetime.fromisoformat(stamp) - datetime.now(UTC)).total_seconds()
    await asyncio.sleep(max(0.0, left) + 0.1)


# -- cancel ---------------------------------------------------------------------------


async def test_cancel_queued_task(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x")
    resp = await cancel(gw, task)
    assert resp.status == 200, resp.body
    assert resp.body["id"] == task["id"]
    assert resp.body["status"] == "cancelled"
    assert (await get_task(gw, task["id"]))["status"] == "cancelled"
    assert await claim(gw, runtime_id, wait_seconds=0.2) == []


async def test_cancel_delayed_task(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x", delay_seconds=0.5)
    assert (await cancel(gw, task)).body["status"] == "cancelled"
    await asyncio.sleep(0.6)
    assert await claim(gw, runtime_id) == []


async def test_cancel_claimed_task_flags_it_until_the_holder_completes(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    resp = await cancel(gw, task)
    assert resp.status == 200, resp.body
    flagged = resp.body
    assert flagged["status"] == "claimed"
    assert flagged["cancel_requested"] is True
    assert flagged["lease_id"] == task["lease_id"]
    beat = await lease_op(gw, "heartbeat", task)
    assert beat.status == 200, beat.body
    assert beat.body["status"] == "claimed" and beat.body["cancel_requested"] is True
    again = await cancel(gw, task)  # asking twice is fine
    assert again.status == 200 and again.body["cancel_requested"] is True, again.body
    done = await lease_op(gw, "complete", task, result="finished anyway")
    assert done.status == 200, done.body
    assert done.body["status"] == "cancelled"
    assert (await get_task(gw, task["id"]))["status"] == "cancelled"
    repeat = await lease_op(gw, "complete", task, result="finished anyway")
    assert repeat.status == 200 and repeat.body["status"] == "cancelled", repeat.body
    assert await claim(gw, runtime_id) == []


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("fail", {"error": "e"}),
        ("fail", {"error": "e", "retry_after_seconds": 0}),
        ("fail", {"error": "e", "retry": False}),
        ("release", {}),
    ],
    ids=["fail", "fail-retry-now", "fail-no-retry", "release"],
)
async def test_cancel_claimed_task_then_fail_or_release_is_cancelled(gw, runtime_id, op, fields):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    assert (await cancel(gw, task)).body["cancel_requested"] is True
    resp = await lease_op(gw, op, task, **fields)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "cancelled"
    assert (await get_task(gw, task["id"]))["status"] == "cancelled"
    assert await claim(gw, runtime_id, wait_seconds=0.2) == []


async def test_cancel_claimed_task_then_lease_expiry_is_cancelled(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id, lease_seconds=1)
    assert (await cancel(gw, task)).body["cancel_requested"] is True
    await wait_past(task["lease_expires_at"])
    await gw.gateway.janitor.run_once()
    assert (await get_task(gw, task["id"]))["status"] == "cancelled"
    assert await claim(gw, runtime_id) == []


async def test_cancel_completed_task_is_409(gw, runtime_id):
    done = await make_completed(gw, runtime_id)
    assert_problem(await cancel(gw, done), 409, "invalid_state")
    assert await get_task(gw, done["id"]) == done


async def test_cancel_dead_task_is_409(gw, runtime_id):
    dead = await make_dead(gw, runtime_id)
    assert_problem(await cancel(gw, dead), 409, "invalid_state")
    assert (await get_task(gw, dead["id"]))["status"] == "dead"


async def test_cancel_cancelled_task_is_200(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x")
    first = await cancel(gw, task)
    again = await cancel(gw, task)
    assert again.status == 200, again.body
    assert again.body["status"] == "cancelled"
    assert again.body == first.body


# -- retry ----------------------------------------------------------------------------


async def test_retry_dead_task(gw, runtime_id):
    dead = await make_dead(gw, runtime_id)
    before = now_rfc3339()
    resp = await retry(gw, dead)
    assert resp.status == 200, resp.body
    queued = resp.body
    assert queued["id"] == dead["id"]
    assert queued["status"] == "queued"
    assert queued["attempts"] == 0
    assert queued["run_at"] >= before and queued["run_at"] <= now_rfc3339()
    again = await claim_one(gw, runtime_id, wait_seconds=0)
    assert again["id"] == dead["id"]
    assert again["attempts"] == 1
    done = await lease_op(gw, "complete", again, result="second life")
    assert done.body["status"] == "completed", done.body


async def test_retry_wakes_a_parked_poll(gw, runtime_id):
    dead = await make_dead(gw, runtime_id)
    poll = asyncio.create_task(claim(gw, runtime_id, wait_seconds=5))
    await asyncio.sleep(0.3)
    assert not poll.done()
    assert (await retry(gw, dead)).status == 200
    got = await asyncio.wait_for(poll, 3)
    assert [t["id"] for t in got] == [dead["id"]]


async def test_retry_cancelled_task(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x")
    await cancel(gw, task)
    resp = await retry(gw, task)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "queued" and resp.body["attempts"] == 0
    got = await claim_one(gw, runtime_id)
    assert got["id"] == task["id"]
    assert got["cancel_requested"] is False


async def test_retry_task_cancelled_while_claimed(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    await cancel(gw, task)
    assert (await lease_op(gw, "release", task)).body["status"] == "cancelled"
    resp = await retry(gw, task)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "queued" and resp.body["attempts"] == 0
    assert "cancel_requested" not in resp.body and "lease_id" not in resp.body
    got = await claim_one(gw, runtime_id)
    assert got["id"] == task["id"] and got["cancel_requested"] is False
    assert got["lease_id"] != task["lease_id"]
    assert_problem(await lease_op(gw, "complete", task), 409, "lease_lost")  # the old lease
    done = await lease_op(gw, "complete", got)
    assert done.body["status"] == "completed", done.body


async def test_retry_expired_task_after_the_janitor_marked_it(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x", ttl_seconds=1)
    await wait_past(task["expires_at"])
    report = await gw.gateway.janitor.run_once()
    assert report.expired >= 1, report
    assert (await get_task(gw, task["id"]))["status"] == "expired"
    resp = await retry(gw, task)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "queued" and resp.body["attempts"] == 0
    got = await claim_one(gw, runtime_id, wait_seconds=0)
    assert got["id"] == task["id"]


async def test_retry_expired_task_before_the_janitor_marked_it(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x", ttl_seconds=1)
    await wait_past(task["expires_at"])
    assert await claim(gw, runtime_id) == []  # expired: never handed out
    resp = await retry(gw, task)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "queued" and resp.body["attempts"] == 0
    got = await claim_one(gw, runtime_id, wait_seconds=0)
    assert got["id"] == task["id"]


async def test_an_expired_task_reads_as_expired_before_the_janitor_marked_it(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "x", ttl_seconds=1)
    await wait_past(task["expires_at"])
    assert (await get_task(gw, task["id"]))["status"] == "expired"
    listed = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/tasks?status=expired")
    assert [t["id"] for t in listed.body["tasks"]] == [task["id"]]
    assert [t["status"] for t in listed.body["tasks"]] == ["expired"]
    queued = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/tasks?status=queued")
    assert queued.body["tasks"] == []
    stats = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/stats")
    assert stats.body["counts"]["expired"] == 1 and stats.body["counts"]["queued"] == 0
    assert stats.body["oldest_queued_age_seconds"] is None
    refused = await cancel(gw, task)
    assert_problem(refused, 409, "invalid_state")
    assert "expired" in refused.body["detail"]


async def test_retry_completed_queued_or_claimed_task_is_409(gw, runtime_id):
    done = await make_completed(gw, runtime_id)
    assert_problem(await retry(gw, done), 409, "invalid_state")
    assert await get_task(gw, done["id"]) == done
    queued = await enqueue(gw, runtime_id, "waiting")
    assert_problem(await retry(gw, queued), 409, "invalid_state")
    assert await get_task(gw, queued["id"]) == queued
    held = await claim_one(gw, runtime_id)
    assert_problem(await retry(gw, held), 409, "invalid_state")
    assert await get_task(gw, held["id"]) == held
