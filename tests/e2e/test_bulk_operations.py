"""A runtime's tasks retried and cancelled in bulk, and its error groups, through the
HTTP API: each task changes exactly as the single retry or cancel changes one, a call
changes at most its limit and says whether more matched, the prefix is literal, bad
input changes nothing, and a bulk retry racing claims and single retries hands each
task out once, loses none, keeps the counts right and wakes parked polls.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.http import get_task, req
from tests.support.lifecycle import all_tasks, assert_problem, claim, enqueue

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def make_dead(inst, rt: str, errors: list[str]) -> list[dict[str, Any]]:
    """One dead task per error, in order: enqueued, claimed and failed without retry."""
    batch = [{"payload": {"i": i}, "max_attempts": 1} for i in range(len(errors))]
    made = await req(inst, "POST", f"/v1/runtimes/{rt}/tasks:batch", {"tasks": batch})
    assert made.status == 201, made.body
    claimed: list[dict[str, Any]] = []
    while len(claimed) < len(errors):
        claimed += await claim(inst, rt, max_tasks=100)
    by_id = {t["id"]: t for t in claimed}
    items = [
        {"id": t["id"], "lease_id": by_id[t["id"]]["lease_id"], "error": error, "retry": False}
        for t, error in zip(made.body["tasks"], errors, strict=True)
    ]
    failed = await req(inst, "POST", "/v1/tasks:fail", {"tasks": items})
    assert failed.status == 200, failed.body
    assert {r["outcome"] for r in failed.body["results"]} == {"dead"}, failed.body
    return [await get_task(inst, t["id"]) for t in made.body["tasks"]]


async def bulk_retry(inst, rt: str, **body: Any):
    return await req(inst, "POST", f"/v1/runtimes/{rt}/tasks:retry", body)


async def bulk_cancel(inst, rt: str, **body: Any):
    return await req(inst, "POST", f"/v1/runtimes/{rt}/tasks:cancel", body)


async def counts(inst, rt: str) -> dict[str, int]:
    resp = await req(inst, "GET", f"/v1/runtimes/{rt}/stats")
    assert resp.status == 200, resp.body
    return dict(resp.body["counts"])


# Fields that differ between two tasks retried at different instants, or made apart.
APART = {"id", "payload", "run_at", "updated_at", "created_at"}


async def test_a_bulk_retry_does_to_each_task_what_a_single_retry_does(gw, runtime_id):
    dead = await make_dead(gw, runtime_id, ["boom\nline 2"] * 4)
    assert (await counts(gw, runtime_id))["dead"] == 4
    single = await req(gw, "POST", f"/v1/tasks/{dead[0]['id']}/retry")
    assert single.status == 200, single.body
    resp = await bulk_retry(gw, runtime_id, status="dead")
    assert resp.status == 200, resp.body
    assert resp.body == {"retried": 3, "more": False}
    for task in dead[1:]:
        after = await get_task(gw, task["id"])
        assert {k: v for k, v in after.items() if k not in APART} == {
            k: v for k, v in single.body.items() if k not in APART
        }
        assert after["status"] == "queued" and after["attempts"] == 0
        assert after["last_error"] == "boom\nline 2"  # kept, as a single retry keeps it
    assert (await counts(gw, runtime_id))["dead"] == 0
    assert (await counts(gw, runtime_id))["queued"] == 4
    # Each retried task is claimable again, once.
    taken = await claim(gw, runtime_id, max_tasks=10)
    assert sorted(t["id"] for t in taken) == sorted(t["id"] for t in dead)


async def test_limit_and_more(gw, runtime_id):
    await make_dead(gw, runtime_id, ["e"] * 5)
    seen = [(await bulk_retry(gw, runtime_id, status="dead", limit=2)).body for _ in range(4)]
    assert seen == [
        {"retried": 2, "more": True},
        {"retried": 2, "more": True},
        {"retried": 1, "more": False},
        {"retried": 0, "more": False},
    ]


async def test_the_prefix_is_literal_and_case_sensitive(gw, runtime_id):
    errors = ["100% failed", "100x failed", "a_b", "aXb", "Boom", "boom", "back\\slash"]
    dead = {t["last_error"]: t for t in await make_dead(gw, runtime_id, errors)}
    for prefix, retried in [
        ("100%", "100% failed"),
        ("a_", "a_b"),
        ("B", "Boom"),
        ("back\\", "back\\slash"),
    ]:
        resp = await bulk_retry(gw, runtime_id, status="dead", error_prefix=prefix)
        assert resp.body == {"retried": 1, "more": False}, (prefix, resp.body)
        assert (await get_task(gw, dead[retried]["id"]))["status"] == "queued"
    left = {e for e, t in dead.items() if (await get_task(gw, t["id"]))["status"] == "dead"}
    assert left == {"100x failed", "aXb", "boom"}


async def test_a_bulk_retry_wakes_a_parked_poll(gw, runtime_id):
    await make_dead(gw, runtime_id, ["e"])
    started = time.monotonic()
    poll = asyncio.create_task(claim(gw, runtime_id, wait_seconds=10))
    await asyncio.sleep(0.3)  # parked on an empty verdict
    assert (await bulk_retry(gw, runtime_id, status="dead")).body["retried"] == 1
    tasks = await asyncio.wait_for(poll, 5)
    assert len(tasks) == 1 and time.monotonic() - started < 5


async def test_a_bulk_cancel_does_what_a_single_cancel_of_a_queued_task_does(gw, runtime_id):
    queued = [await enqueue(gw, runtime_id, i) for i in range(3)]
    delayed = await enqueue(gw, runtime_id, "later", delay_seconds=3600)
    holder = await enqueue(gw, runtime_id, "held", priority=1000)
    [held] = await claim(gw, runtime_id)
    assert held["id"] == holder["id"]
    single = await req(gw, "POST", f"/v1/tasks/{queued[0]['id']}/cancel")
    assert single.status == 200, single.body
    # A wait on a task's result ends when the bulk cancel ends the task.
    waiting = asyncio.create_task(req(gw, "GET", f"/v1/tasks/{queued[1]['id']}?wait_seconds=10"))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    resp = await bulk_cancel(gw, runtime_id, status="queued")
    assert resp.body == {"cancelled": 3, "more": False}, resp.body
    woken = await asyncio.wait_for(waiting, 5)
    assert woken.body["status"] == "cancelled" and time.monotonic() - started < 5
    for task in [*queued[1:], delayed]:
        after = await get_task(gw, task["id"])
        keep = APART | {"priority", "expires_at"}
        assert {k: v for k, v in after.items() if k not in keep} == {
            k: v for k, v in single.body.items() if k not in keep
        }
    after_held = await get_task(gw, held["id"])
    assert after_held["status"] == "claimed" and not after_held["cancel_requested"]
    assert (await counts(gw, runtime_id))["cancelled"] == 4
    assert await claim(gw, runtime_id) == []


async def test_a_bulk_cancel_takes_at_most_its_limit(gw, runtime_id):
    for i in range(3):
        await enqueue(gw, runtime_id, i)
    assert (await bulk_cancel(gw, runtime_id, status="queued", limit=2)).body == {
        "cancelled": 2,
        "more": True,
    }
    assert (await bulk_cancel(gw, runtime_id, status="queued", limit=2)).body == {
        "cancelled": 1,
        "more": False,
    }


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("retry", {"status": "queued"}, "status"),
        ("retry", {"status": "claimed"}, "status"),
        ("retry", {}, "status"),
        ("retry", {"status": 1}, "status"),
        ("retry", {"status": "dead", "limit": 0}, "limit"),
        ("retry", {"status": "dead", "limit": 1001}, "limit"),
        ("retry", {"status": "dead", "limit": 2.5}, "limit"),
        ("retry", {"status": "dead", "error_prefix": 7}, "error_prefix"),
        ("retry", {"status": "dead", "error_prefix": ""}, "error_prefix"),
        ("retry", {"status": "dead", "error_prefix": "x" * 1001}, "error_prefix"),
        ("retry", {"status": "dead", "error_prefix": "a\u0000"}, "error_prefix"),
        ("retry", {"status": "dead", "everything": True}, "everything"),
        ("cancel", {"status": "dead"}, "status"),
        ("cancel", {"status": "queued", "limit": 0}, "limit"),
        ("cancel", {"status": "queued", "error_prefix": "x"}, "error_prefix"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field_and_changes_nothing(
    gw, runtime_id, path, body, field
):
    await make_dead(gw, runtime_id, ["e"])
    await enqueue(gw, runtime_id, "q")
    before = await all_tasks(gw, runtime_id)
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks:{path}", body)
    assert_problem(resp, 422, field=field)
    assert await all_tasks(gw, runtime_id) == before


async def test_error_groups_and_retrying_one_group(gw, runtime_id):
    long = "x" * 250
    errors = ["Timeout\nat a"] * 3 + ["Timeout\nat b"] + ["Refused: 50%"] * 2 + [long, "\nlead"]
    dead = await make_dead(gw, runtime_id, errors)
    resp = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/errors")
    assert resp.status == 200, resp.body
    body = resp.body
    assert body["runtime_id"] == runtime_id and body["status"] == "dead"
    assert body["tasks_read"] == len(errors) and body["truncated"] is False
    groups = body["groups"]
    assert [(g["error"], g["count"]) for g in groups[:2]] == [("Timeout", 4), ("Refused: 50%", 2)]
    assert sorted(g["error"] for g in groups[2:]) == sorted(["x" * 200, "\nlead"])
    newest = max(dead[:4], key=lambda t: (t["updated_at"], t["id"]))
    assert groups[0]["example_task_id"] == newest["id"]
    assert groups[0]["last_at"] >= dead[0]["updated_at"]
    limited = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/errors?limit=1&status=dead")
    assert [g["error"] for g in limited.body["groups"]] == ["Timeout"]
    # "Retry this group": each group's line is accepted as the prefix, and retries it.
    for group in groups:
        retried = await bulk_retry(gw, runtime_id, status="dead", error_prefix=group["error"])
        assert retried.body == {"retried": group["count"], "more": False}, group
    after = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/errors")
    assert after.body["groups"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=queued", "status"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=", "limit"),
    ],
)
async def test_error_groups_refuse_a_bad_query(gw, runtime_id, query, field):
    resp = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/errors?{query}")
    assert_problem(resp, 422, field=field)


async def test_a_bulk_retry_racing_claims_and_single_retries(gw, runtime_id):
    """Two bulk retries going on until nothing is left, a single retry of every task,
    and four workers claiming with parked polls, all at once: every task is retried by
    exactly one of them and handed out exactly once, none is lost, and the counts
    follow."""
    n = 120
    dead = await make_dead(gw, runtime_id, ["e"] * n)
    ids = {t["id"] for t in dead}
    handed: list[str] = []
    done = asyncio.Event()

    async def worker(name: str) -> None:
        while not done.is_set():
            for task in await claim(gw, runtime_id, worker=name, max_tasks=10, wait_seconds=1):
                handed.append(task["id"])
                assert task["attempts"] == 1, task

    async def bulk() -> int:
        total = 0
        while True:
            body = (await bulk_retry(gw, runtime_id, status="dead", limit=25)).body
            total += body["retried"]
            if not body["more"]:
                return total

    # Eight at a time: all at once, the instance's line for a connection sheds some.
    line = asyncio.Semaphore(8)

    async def single(task_id: str):
        async with line:
            return await req(gw, "POST", f"/v1/tasks/{task_id}/retry")

    async def singles() -> int:
        answers = await asyncio.gather(*(single(task_id) for task_id in ids))
        assert {a.status for a in answers} <= {200, 409}, {a.status for a in answers}
        return sum(a.status == 200 for a in answers)

    workers = [asyncio.create_task(worker(f"w{i}")) for i in range(4)]
    try:
        await asyncio.sleep(0.2)  # the workers park first
        retried = await asyncio.gather(bulk(), bulk(), singles())
        assert sum(retried) == n, retried
        deadline = time.monotonic() + 10
        while len(handed) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        done.set()
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
    assert sorted(handed) == sorted(ids)  # each once, none lost
    final = await counts(gw, runtime_id)
    assert final["dead"] == 0 and final["claimed"] == n and final["queued"] == 0, final
