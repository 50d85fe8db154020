"""Leases through the HTTP API: claim, heartbeat, complete, fail, release, lease
expiry, and the refusals of each (design sections 4 and 5, I7)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tests.support.gateways import gateway
from tests.support.http import get_task, req
from tests.support.lifecycle import (
    RANDOM_LEASE,
    UNKNOWN_TASK,
    UUID_RE,
    assert_problem,
    assert_task_times,
    claim,
    claim_one,
    enqueue,
    lease_op,
    now_rfc3339,
)

LEASE_FIELDS = ("lease_id", "lease_expires_at", "worker_id", "cancel_requested")


pytestmark = pytest.mark.asyncio(loop_scope="module")


def seconds_until(stamp: str) -> float:
    return (datetime.fromisoformat(stamp) - datetime.now(UTC)).total_seconds()


# -- claim ----------------------------------------------------------------------------


async def test_claim_leases_the_task(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "p")
    got = await claim_one(gw, runtime_id, worker="worker-7", lease_seconds=120)
    assert got["id"] == task["id"]
    assert got["status"] == "claimed"
    assert got["attempts"] == 1
    assert got["worker_id"] == "worker-7"
    assert got["cancel_requested"] is False
    assert UUID_RE.match(got["lease_id"]), got
    assert 100 < seconds_until(got["lease_expires_at"]) <= 120, got
    assert_task_times(got)
    assert await get_task(gw, task["id"]) == got
    assert await claim(gw, runtime_id) == []  # held by one lease only


async def test_claim_default_lease_and_max_tasks(gw, runtime_id):
    for i in range(5):
        await enqueue(gw, runtime_id, i)
    got = await claim(gw, runtime_id)
    assert [t["payload"] for t in got] == [0]  # max_tasks defaults to 1
    assert 50 < seconds_until(got[0]["lease_expires_at"]) <= 60  # default lease 60 s
    got = await claim(gw, runtime_id, max_tasks=3)
    assert [t["payload"] for t in got] == [1, 2, 3]
    assert len({t["lease_id"] for t in got}) == 3
    got = await claim(gw, runtime_id, max_tasks=100)
    assert [t["payload"] for t in got] == [4]


CLAIM_REFUSALS = [
    ("worker_id", {}),
    ("worker_id", {"worker_id": ""}),
    ("worker_id", {"worker_id": "w" * 201}),
    ("worker_id", {"worker_id": 5}),
    ("max_tasks", {"max_tasks": 0}),
    ("max_tasks", {"max_tasks": 101}),
    ("max_tasks", {"max_tasks": "2"}),
    ("wait_seconds", {"wait_seconds": -1}),
    ("wait_seconds", {"wait_seconds": 61}),
    ("wait_seconds", {"wait_seconds": "1"}),
    ("lease_seconds", {"lease_seconds": 0}),
    ("lease_seconds", {"lease_seconds": 3601}),
    ("lease_seconds", {"lease_seconds": True}),
]


@pytest.mark.parametrize(
    ("field", "body"), CLAIM_REFUSALS, ids=[repr(c[1]) for c in CLAIM_REFUSALS]
)
async def test_claim_bad_field_is_422_and_leases_nothing(gw, runtime_id, field, body):
    task = await enqueue(gw, runtime_id, 1)
    body = body if "worker_id" in body or field == "worker_id" else {"worker_id": "w", **body}
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/claim", body)
    assert_problem(resp, 422, "validation_failed", field)
    assert (await get_task(gw, task["id"]))["status"] == "queued"


async def test_claim_body_not_json_is_400(gw, runtime_id):
    task = await enqueue(gw, runtime_id, 1)
    for raw in (b"nope", b'["worker_id"]'):
        resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/claim", raw=raw)
        assert_problem(resp, 400, "bad_request")
    assert (await get_task(gw, task["id"]))["status"] == "queued"


# -- heartbeat ------------------------------------------------------------------------


async def test_heartbeat_extends_the_lease(gw, runtime_id):
    await enqueue(gw, runtime_id, 1)
    task = await claim_one(gw, runtime_id, lease_seconds=5)
    resp = await lease_op(gw, "heartbeat", task, lease_seconds=600)
    assert resp.status == 200, resp.body
    beat = resp.body
    assert beat["status"] == "claimed"
    assert beat["lease_id"] == task["lease_id"]
    assert beat["cancel_requested"] is False
    assert beat["lease_expires_at"] > task["lease_expires_at"]
    assert 590 < seconds_until(beat["lease_expires_at"]) <= 600
    assert beat["attempts"] == 1
    resp = await lease_op(gw, "heartbeat", task)  # lease_seconds is optional
    assert resp.status == 200, resp.body
    assert 50 < seconds_until(resp.body["lease_expires_at"]) <= 60
    last = resp.body
    for bad in (0, 3601, "10"):
        refused = await lease_op(gw, "heartbeat", task, lease_seconds=bad)
        assert_problem(refused, 422, "validation_failed", "lease_seconds")
    assert await get_task(gw, task["id"]) == last


# -- complete -------------------------------------------------------------------------


async def test_complete_with_result(gw, runtime_id):
    await enqueue(gw, runtime_id, "work")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "complete", task, result={"answer": 42})
    assert resp.status == 200, resp.body
    done = resp.body
    assert done["status"] == "completed"
    assert done["result"] == {"answer": 42}
    assert done["attempts"] == 1
    for key in LEASE_FIELDS:
        assert key not in done, (key, done)
    assert await get_task(gw, task["id"]) == done
    assert await claim(gw, runtime_id) == []


async def test_complete_without_result(gw, runtime_id):
    await enqueue(gw, runtime_id, "work")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "complete", task)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "completed"
    assert resp.body.get("result") is None


async def test_complete_repeated_with_the_same_lease_is_200(gw, runtime_id):
    await enqueue(gw, runtime_id, "work")
    task = await claim_one(gw, runtime_id)
    first = await lease_op(gw, "complete", task, result="r")
    assert first.status == 200, first.body
    again = await lease_op(gw, "complete", task, result="r")
    assert again.status == 200, again.body
    assert again.body == first.body


async def test_complete_with_another_lease_is_409_and_changes_nothing(gw, runtime_id):
    await enqueue(gw, runtime_id, "work")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "complete", task, RANDOM_LEASE, result="stolen")
    assert_problem(resp, 409, "lease_lost")
    assert await get_task(gw, task["id"]) == task
    ok = await lease_op(gw, "complete", task, result="mine")
    assert ok.status == 200 and ok.body["result"] == "mine", ok.body
    resp = await lease_op(gw, "complete", task, RANDOM_LEASE, result="stolen")
    assert_problem(resp, 409, "lease_lost")
    assert (await get_task(gw, task["id"]))["result"] == "mine"


@pytest.mark.parametrize("op", ["heartbeat", "fail", "release"])
async def test_other_lease_ops_with_another_lease_are_409(gw, runtime_id, op):
    await enqueue(gw, runtime_id, "work")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, op, task, RANDOM_LEASE, error="e", lease_seconds=999)
    assert_problem(resp, 409, "lease_lost")
    assert await get_task(gw, task["id"]) == task
    assert await claim(gw, runtime_id) == []


async def test_lease_ops_on_a_queued_task_are_409(gw, runtime_id):
    task = await enqueue(gw, runtime_id, "never claimed")
    for op in ("heartbeat", "complete", "fail", "release"):
        resp = await lease_op(gw, op, task, RANDOM_LEASE, error="e")
        assert_problem(resp, 409, "lease_lost")
    assert (await get_task(gw, task["id"]))["status"] == "queued"


# -- fail -----------------------------------------------------------------------------


async def test_fail_with_retry_backs_off(gw, runtime_id):
    await enqueue(gw, runtime_id, "flaky")
    task = await claim_one(gw, runtime_id)
    before = now_rfc3339()
    resp = await lease_op(gw, "fail", task, error="boom")
    assert resp.status == 200, resp.body
    failed = resp.body
    assert failed["status"] == "queued"
    assert failed["attempts"] == 1
    assert failed["last_error"] == "boom"
    assert failed["run_at"] > before, (failed["run_at"], before)
    for key in LEASE_FIELDS:
        assert key not in failed, (key, failed)
    assert await claim(gw, runtime_id, wait_seconds=0) == []  # backing off
    again = await lease_op(gw, "fail", task, error="twice")
    assert_problem(again, 409, "lease_lost")


async def test_fail_with_retry_after_seconds(gw, runtime_id):
    await enqueue(gw, runtime_id, "flaky")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "fail", task, error="later", retry_after_seconds=120)
    assert resp.status == 200, resp.body
    assert 110 < seconds_until(resp.body["run_at"]) <= 120, resp.body
    assert await claim(gw, runtime_id) == []


async def test_fail_with_retry_after_zero_is_claimable_at_once(gw, runtime_id):
    await enqueue(gw, runtime_id, "flaky")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "fail", task, error="again", retry_after_seconds=0)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "queued" and resp.body["attempts"] == 1
    second = await claim_one(gw, runtime_id, wait_seconds=0)
    assert second["id"] == task["id"]
    assert second["attempts"] == 2
    assert second["lease_id"] != task["lease_id"]
    assert_problem(await lease_op(gw, "complete", task), 409, "lease_lost")  # old lease
    done = await lease_op(gw, "complete", second)
    assert done.status == 200 and done.body["status"] == "completed"


async def test_fail_at_max_attempts_is_dead(gw, runtime_id):
    await enqueue(gw, runtime_id, "fragile", max_attempts=1)
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "fail", task, error="fatal", retry_after_seconds=0)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "dead"
    assert resp.body["attempts"] == 1
    assert resp.body["last_error"] == "fatal"
    for key in LEASE_FIELDS:
        assert key not in resp.body, (key, resp.body)
    assert await claim(gw, runtime_id) == []


async def test_fail_reaches_dead_after_max_attempts_claims(gw, runtime_id):
    await enqueue(gw, runtime_id, "x", max_attempts=3)
    statuses = []
    for attempt in (1, 2, 3):
        task = await claim_one(gw, runtime_id)
        assert task["attempts"] == attempt
        resp = await lease_op(gw, "fail", task, error=f"e{attempt}", retry_after_seconds=0)
        statuses.append(resp.body["status"])
    assert statuses == ["queued", "queued", "dead"]
    assert await claim(gw, runtime_id) == []


async def test_fail_without_retry_is_dead(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "fail", task, error="permanent", retry=False)
    assert resp.status == 200, resp.body
    assert resp.body["status"] == "dead"
    assert resp.body["attempts"] == 1 and resp.body["max_attempts"] == 5
    assert await claim(gw, runtime_id) == []


async def test_backed_off_task_reaches_a_parked_poll_when_due(gw, runtime_id):
    await enqueue(gw, runtime_id, "flaky")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "fail", task, error="e", retry_after_seconds=1)
    assert resp.body["status"] == "queued", resp.body
    started = asyncio.get_running_loop().time()
    got = await claim(gw, runtime_id, worker="patient", wait_seconds=5)
    waited = asyncio.get_running_loop().time() - started
    assert [t["id"] for t in got] == [task["id"]]
    assert got[0]["attempts"] == 2
    assert 0.5 < waited < 3, waited


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("error", {}),
        ("error", {"error": 5}),
        ("retry", {"error": "e", "retry": "no"}),
        ("retry_after_seconds", {"error": "e", "retry_after_seconds": -1}),
        ("retry_after_seconds", {"error": "e", "retry_after_seconds": "5"}),
    ],
)
async def test_fail_bad_field_is_422(gw, runtime_id, field, fields):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    resp = await req(
        gw, "POST", f"/v1/tasks/{task['id']}/fail", {"lease_id": task["lease_id"], **fields}
    )
    assert_problem(resp, 422, "validation_failed", field)
    assert await get_task(gw, task["id"]) == task


# -- release --------------------------------------------------------------------------


async def test_release_queues_at_once(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, "release", task)
    assert resp.status == 200, resp.body
    released = resp.body
    assert released["status"] == "queued"
    assert released["run_at"] <= now_rfc3339()
    for key in LEASE_FIELDS:
        assert key not in released, (key, released)
    again = await claim_one(gw, runtime_id, wait_seconds=0)
    assert again["id"] == task["id"]
    assert again["attempts"] == 2
    assert_problem(await lease_op(gw, "release", task), 409, "lease_lost")


async def test_released_task_wakes_a_parked_poll(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    poll = asyncio.create_task(claim(gw, runtime_id, worker="other", wait_seconds=5))
    await asyncio.sleep(0.3)
    assert not poll.done()
    resp = await lease_op(gw, "release", task)
    assert resp.status == 200
    got = await asyncio.wait_for(poll, 3)
    assert [(t["id"], t["worker_id"]) for t in got] == [(task["id"], "other")]


# -- unknown and malformed ids, malformed leases --------------------------------------

OPS = ("heartbeat", "complete", "fail", "release", "cancel", "retry")


@pytest.mark.parametrize("task_id", [UNKNOWN_TASK, "not-a-uuid", "1234", "0" * 40])
async def test_unknown_or_malformed_task_id_is_404(gw, task_id):
    for op in OPS:
        body = {"lease_id": RANDOM_LEASE, "error": "e"}
        resp = await req(gw, "POST", f"/v1/tasks/{task_id}/{op}", body)
        assert_problem(resp, 404, "not_found")
    assert_problem(await req(gw, "GET", f"/v1/tasks/{task_id}"), 404, "not_found")


@pytest.mark.parametrize("lease", ["not-a-uuid", "", 12, None, "x" * 100])
async def test_malformed_lease_id_is_422(gw, runtime_id, lease):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id)
    for op in ("heartbeat", "complete", "fail", "release"):
        body = {"error": "e"} if lease is None else {"lease_id": lease, "error": "e"}
        resp = await req(gw, "POST", f"/v1/tasks/{task['id']}/{op}", body)
        assert_problem(resp, 422, "validation_failed", "lease_id")
    assert await get_task(gw, task["id"]) == task


# -- lease expiry ---------------------------------------------------------------------


async def test_lapsed_lease_is_honoured_until_reclaimed_then_refused(gw, runtime_id):
    a = await enqueue(gw, runtime_id, "a")
    b = await enqueue(gw, runtime_id, "b", max_attempts=2)
    ta, tb = await claim(gw, runtime_id, max_tasks=2, lease_seconds=1)
    assert (ta["id"], tb["id"]) == (a["id"], b["id"])
    await asyncio.sleep(1.15)
    # Ran out, but nobody replaced it: still honoured (as SQS does).
    resp = await lease_op(gw, "complete", ta, result="late")
    assert resp.status == 200 and resp.body["status"] == "completed", resp.body
    # The janitor's lease reclaim queues b again at once.
    await gw.gateway.janitor.run_once()
    after = await get_task(gw, b["id"])
    assert after["status"] == "queued" and after["attempts"] == 1, after
    assert_problem(await lease_op(gw, "heartbeat", tb), 409, "lease_lost")
    tb2 = await claim_one(gw, runtime_id, lease_seconds=1)
    assert tb2["id"] == b["id"] and tb2["attempts"] == 2
    assert_problem(await lease_op(gw, "complete", tb), 409, "lease_lost")
    # Lease expiry at max_attempts makes it dead.
    await asyncio.sleep(1.15)
    report = await gw.gateway.janitor.run_once()
    assert report.reclaimed >= 1, report
    assert (await get_task(gw, b["id"]))["status"] == "dead"
    assert_problem(await lease_op(gw, "complete", tb2), 409, "lease_lost")
    assert await claim(gw, runtime_id) == []


# -- results and values the database cannot hold --------------------------------------


async def test_result_over_payload_limit_is_413(database_url, redis_url, runtime_id):
    async with gateway(database_url, redis_url, max_payload_bytes=1000) as small:
        await enqueue(small, runtime_id, "x")
        task = await claim_one(small, runtime_id)
        resp = await lease_op(small, "complete", task, result="r" * 2000)
        assert_problem(resp, 413, "payload_too_large", "result")
        assert await get_task(small, task["id"]) == task
        ok = await lease_op(small, "complete", task, result="r" * 998)
        assert ok.status == 200 and ok.body["result"] == "r" * 998, ok.body


@pytest.mark.parametrize(
    ("op", "field", "value"),
    [
        ("claim", "worker_id", "w\u0000"),
        ("complete", "result", "r\u0000"),
        ("fail", "error", "e\u0000"),
    ],
    ids=["worker_id", "result", "error"],
)
async def test_nul_characters_are_not_a_server_outage(gw, runtime_id, op, field, value):
    await enqueue(gw, runtime_id, "x")
    if op == "claim":
        resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/claim", {"worker_id": value})
        assert_problem(resp, 422, "validation_failed", field)
        return
    task = await claim_one(gw, runtime_id)
    resp = await lease_op(gw, op, task, **{field: value})
    if resp.status == 200:  # storing it (intact, or the error text without NUL) is fine too
        stored = resp.body["result" if op == "complete" else "last_error"]
        assert stored in (
            value,
            value.replace("\u0000", ""),
            value.replace("\u0000", "\ufffd"),
        ), resp.body
        return
    assert_problem(resp, 422, field=field)
    assert await get_task(gw, task["id"]) == task


async def test_reclaimed_lease_reaches_a_parked_poll(gw, runtime_id):
    await enqueue(gw, runtime_id, "x")
    task = await claim_one(gw, runtime_id, lease_seconds=1)
    poll = asyncio.create_task(claim(gw, runtime_id, worker="next", wait_seconds=5))
    await asyncio.sleep(max(0.0, seconds_until(task["lease_expires_at"])) + 0.1)
    assert not poll.done()
    report = await gw.gateway.janitor.run_once()
    assert report.reclaimed >= 1, report
    got = await asyncio.wait_for(poll, 3)
    assert [(t["id"], t["worker_id"], t["attempts"]) for t in got] == [(task["id"], "next", 2)]


async def test_completes_sent_together_each_get_their_own_answer(gw, runtime_id):
    # Completes that arrive together share a statement (gateway/claim/completions.py); each is
    # still answered as if it were alone: its own result, a repeat by the same lease as
    # the first, another lease refused, a requested cancel honoured.
    for i in range(40):
        await enqueue(gw, runtime_id, i)
    tasks = await claim(gw, runtime_id, max_tasks=40)
    assert len(tasks) == 40
    cancel = await req(gw, "POST", f"/v1/tasks/{tasks[0]['id']}/cancel")
    assert cancel.status == 200, cancel.body
    sends = [lease_op(gw, "complete", t, result={"n": t["payload"]}) for t in tasks]
    sends += [lease_op(gw, "complete", t, result={"n": t["payload"]}) for t in tasks[:10]]
    sends += [lease_op(gw, "complete", t, RANDOM_LEASE, result="stolen") for t in tasks[10:20]]
    answers = await asyncio.gather(*sends)
    mine, repeats, stolen = answers[:40], answers[40:50], answers[50:]
    assert [a.status for a in mine] == [200] * 40, [a.body for a in mine]
    assert mine[0].body["status"] == "cancelled"
    for task, answer in zip(tasks[1:], mine[1:], strict=True):
        assert answer.body["id"] == task["id"]
        assert answer.body["status"] == "completed"
        assert answer.body["result"] == {"n": task["payload"]}
    assert [a.status for a in repeats] == [200] * 10
    assert [a.body for a in repeats] == [a.body for a in mine[:10]]
    for answer in stolen:
        assert_problem(answer, 409, "lease_lost")
    assert (await get_task(gw, tasks[0]["id"]))["status"] == "cancelled"
    for task in tasks[1:]:
        stored = await get_task(gw, task["id"])
        assert stored["result"] == {"n": task["payload"]}
