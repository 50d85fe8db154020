"""Exactly one holder (I7, I9): many concurrent claimers on two instances never get
the same task twice, and a lease that was replaced is refused everywhere."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import pytest

from tests.support.claims import task_rows
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.http import get_task

# A load test with a bound of its own: claimers give up once nothing has been enqueued
# or handed out for STALL_SECONDS, so a slow machine only makes it longer, and a hang
# still ends it with a report of what went wrong before the hang guard below.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = 2000
CLAIMERS = 60
ENQUEUERS = 40
STALL_SECONDS = 20.0


async def test_every_task_is_completed_exactly_once(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """2 instances, 2000 tasks enqueued while 60 claimers (30 per instance, max_tasks
    1-5, wait_seconds 1) claim and complete everything they get. Every task is handed
    out once, with one lease, completed once, and has attempts == 1 in Postgres."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    rng = random.Random()
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        instances = (a, b)
        enqueued: list[str] = []
        handed_out: list[tuple[str, str, str]] = []  # (task id, lease id, claimer)
        completed: list[str] = []
        problems: list[Any] = []
        all_enqueued = asyncio.Event()
        progress = [time.monotonic()]  # when a task was last enqueued or handed out

        async def enqueuer(k: int) -> None:
            inst = instances[k % 2]
            for n in range(k, TASKS, ENQUEUERS):
                task = await inst.enqueue(runtime_id, {"n": n})
                enqueued.append(task["id"])
                progress[0] = time.monotonic()

        async def claimer(k: int) -> None:
            inst = instances[k % 2]
            name = f"claimer-{k}"
            while time.monotonic() - progress[0] < STALL_SECONDS:
                if all_enqueued.is_set() and len(completed) >= TASKS:
                    return
                status, body = await inst.call(
                    "POST",
                    f"/v1/runtimes/{runtime_id}/claim",
                    {
                        "worker_id": name,
                        "max_tasks": rng.randint(1, 5),
                        "wait_seconds": 1,
                        "lease_seconds": 120,
                    },
                )
                if status != 200:
                    problems.append(("claim", status, body))
                    return
                for task in body["tasks"]:
                    handed_out.append((task["id"], task["lease_id"], name))
                    progress[0] = time.monotonic()
                    if task["status"] != "claimed" or task["worker_id"] != name:
                        problems.append(("claimed task", task))
                    # Complete through either instance: leases live in Postgres.
                    status, done = await rng.choice(instances).complete(task, result=name)
                    if status != 200 or done["status"] != "completed":
                        problems.append(("complete", status, done))
                    completed.append(task["id"])

        claimers = [asyncio.create_task(claimer(k)) for k in range(CLAIMERS)]
        await asyncio.gather(*(enqueuer(k) for k in range(ENQUEUERS)))
        all_enqueued.set()
        await asyncio.wait_for(asyncio.gather(*claimers), timeout=250)

        assert problems == []
        assert len(enqueued) == len(set(enqueued)) == TASKS
        ids = [task_id for task_id, _, _ in handed_out]
        twice = {task_id: n for task_id, n in Counter(ids).items() if n > 1}
        assert twice == {}, f"{len(twice)} tasks were handed out more than once"
        assert set(ids) == set(enqueued)
        leases = [lease for _, lease, _ in handed_out]
        assert len(set(leases)) == len(leases), "a lease_id was handed out twice"
        assert sorted(completed) == sorted(enqueued)
        # Both instances took part.
        by_instance = Counter(int(name.split("-")[1]) % 2 for _, _, name in handed_out)
        assert by_instance[0] > 0 and by_instance[1] > 0

        rows = await task_rows(database_url, runtime_id)
        assert len(rows) == TASKS
        assert Counter(r["status"] for r in rows) == {"completed": TASKS}
        assert Counter(r["attempts"] for r in rows) == {1: TASKS}
        final_lease = {str(r["id"]): str(r["lease_id"]) for r in rows}
        assert final_lease == {task_id: lease for task_id, lease, _ in handed_out}


def _lease_calls(task_id: str, lease_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("heartbeat", {"lease_id": lease_id, "lease_seconds": 600}),
        ("complete", {"lease_id": lease_id, "result": {"stale": True}}),
        ("fail", {"lease_id": lease_id, "error": "stale", "retry": True}),
        ("fail", {"lease_id": lease_id, "error": "stale", "retry": False}),
        ("release", {"lease_id": lease_id}),
    ]


async def _assert_refused(inst: Instance, task_id: str, stale_lease: str) -> None:
    """Every lease operation with the stale lease is 409 lease_lost and changes nothing."""
    for op, body in _lease_calls(task_id, stale_lease):
        before = await get_task(inst, task_id)
        status, problem = await inst.call("POST", f"/v1/tasks/{task_id}/{op}", body)
        assert status == 409, (op, status, problem)
        assert problem["code"] == "lease_lost", (op, problem)
        after = await get_task(inst, task_id)
        assert after == before, f"{op} with a stale lease changed the task"


async def test_a_replaced_lease_is_refused_and_changes_nothing(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Claim (lease 1), release, claim again (lease 2): heartbeat, complete, fail and
    release with lease 1 answer 409 lease_lost through either instance and leave the
    row as it was; lease 2 still works. After lease 2 completes, lease 1 is still
    refused and the result is lease 2's."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        task = await a.enqueue(runtime_id, {"job": 1})
        [first] = await a.claim(runtime_id, "w1", lease_seconds=60)
        assert first["id"] == task["id"] and first["attempts"] == 1
        status, released = await a.call(
            "POST", f"/v1/tasks/{task['id']}/release", {"lease_id": first["lease_id"]}
        )
        assert status == 200 and released["status"] == "queued", released
        [second] = await b.claim(runtime_id, "w2", lease_seconds=60)
        assert second["id"] == task["id"]
        assert second["lease_id"] != first["lease_id"]
        assert second["attempts"] == 2 and second["worker_id"] == "w2"

        for inst in (a, b):
            await _assert_refused(inst, task["id"], first["lease_id"])
        held = await get_task(a, task["id"])
        assert held["status"] == "claimed" and held["lease_id"] == second["lease_id"]

        # The current holder is unaffected by all of that.
        status, beat = await b.call(
            "POST", f"/v1/tasks/{task['id']}/heartbeat", {"lease_id": second["lease_id"]}
        )
        assert status == 200 and beat["lease_id"] == second["lease_id"], beat
        status, done = await a.complete(second, result={"by": "w2"})
        assert status == 200 and done["status"] == "completed", done

        for inst in (a, b):
            await _assert_refused(inst, task["id"], first["lease_id"])
        final = await get_task(b, task["id"])
        assert final["status"] == "completed" and final["result"] == {"by": "w2"}
        assert final["attempts"] == 2
        # Repeating complete with the current lease is a replay, not a change.
        status, again = await b.complete(second, result={"by": "someone else"})
        assert status == 200 and again["result"] == {"by": "w2"}, again
        assert await get_task(a, task["id"]) == final
