"""Ticks decided ahead of their time, over the real Postgres: a schedule with overlap
allow has its ticks of the next AHEAD seconds decided by the pass, their tasks stored
waiting (scheduled) until their time; no other policy decides early. A change of the
definition, a pause or a DELETE withdraws, in its own transaction, the ticks decided
ahead whose time has not come, with their tasks: none of the old definition runs after
it answered, and the next passes decide those ticks afresh, each exactly once. A note
alone withdraws nothing, nor does a change meet a task a claim already holds."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.schedules import plans
from gateway.store import Store
from tests.support.databases import execute, fetch
from tests.support.gateways import gateway, running_gateway
from tests.support.http import req
from tests.support.janitor import janitor_settings
from tests.support.schedules import duplicates, instances, put
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

AHEAD = 2.0
TASKS = """
SELECT id, payload->>'v' AS v, status, scheduled_for, run_at, created_at
  FROM tasks ORDER BY scheduled_for
"""


async def pass_ahead(store: Store) -> int:
    """One tick pass deciding AHEAD seconds ahead; the number of ticks decided."""
    decided, _, _ = await store.decide_due(100, plans.due_plan(30, ahead_seconds=AHEAD), AHEAD)
    return len(decided)


async def due_now(url: str) -> None:
    """Every schedule's next tick moved to the start of the current second."""
    await execute(url, "UPDATE schedules SET next_tick_at = date_trunc('second', now())")


async def second_begun() -> None:
    """Until just after a second begins: a pass run then decides its ticks and makes
    their tasks within the same second, however slow the machine is that moment."""
    await asyncio.sleep(1.01 - time.time() % 1)


async def test_only_allow_schedules_have_ticks_decided_ahead_and_they_wait(
    own_database_url: str,
) -> None:
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "allow", every_seconds=1, overlap="allow", payload={"v": "a"})
        await put(a, "rt", "skip", every_seconds=1, overlap="skip", payload={"v": "s"})
        await second_begun()
        await due_now(url)
        await pass_ahead(a)
        row = await a.get_schedule("rt", "allow")
        now = await a.now()
    tasks = await fetch(url, TASKS)
    skip = [t for t in tasks if t["v"] == "s"]
    allow = [t for t in tasks if t["v"] == "a"]
    # The tick of this second and the two after it: all within AHEAD of now.
    assert len(allow) == 3 and len(skip) == 1, tasks
    assert skip[0]["scheduled_for"] <= skip[0]["created_at"]
    ahead = [t for t in allow if t["scheduled_for"] > t["created_at"]]
    assert len(ahead) >= 2, allow
    # Waiting for their time: not claimable before it, due exactly at it.
    assert all(t["status"] == "scheduled" and t["run_at"] == t["scheduled_for"] for t in ahead)
    # The API's next run is the first tick to come, decided already.
    assert row is not None and row.decided_ahead is not None
    coming = [t["scheduled_for"] for t in allow if t["scheduled_for"] > now]
    assert row.decided_ahead == coming[0]
    assert plans.upcoming(row)[:2] == [coming[0], coming[0] + timedelta(seconds=1)]


async def change(store: Store, how: str) -> None:
    if how == "payload":
        await put(store, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 2})
    elif how == "timing":
        await put(store, "rt", "s", every_seconds=2, overlap="allow", payload={"v": 2})
    elif how in ("pause", "note"):
        write = plans.pause_write(how == "pause", "a note")
        await store.write_schedule("rt", "s", write, create=False)
    else:
        found, _ = await store.delete_schedule("rt", "s")
        assert found


@pytest.mark.parametrize("how", ["payload", "timing", "pause", "note", "delete"])
async def test_a_change_withdraws_the_ticks_decided_ahead_that_are_still_to_come(
    own_database_url: str, how: str
) -> None:
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await due_now(url)
        await pass_ahead(a)
        before = await fetch(url, TASKS)
        started = await a.now()
        await change(a, how)
        answered = await a.now()
        after = await fetch(url, TASKS)
        # The passes after the change decide the withdrawn ticks under the new one.
        await execute(url, "SELECT pg_sleep(0.1)")
        await pass_ahead(a)
        final = await fetch(url, TASKS)
    old_after = [t for t in after if t["v"] == "1"]
    if how == "note":
        assert [t["id"] for t in after] == [t["id"] for t in before]
        return
    # Nothing of the old definition is left to run after the change answered, and
    # nothing whose time had come before it started is gone.
    assert all(t["scheduled_for"] <= answered for t in old_after), (before, after)
    came = {t["id"] for t in before if t["scheduled_for"] <= started}
    assert came <= {t["id"] for t in old_after}
    assert len(old_after) < len(before)  # something was still to come, and went
    assert await duplicates(url) == 0
    new = [t for t in final if t["v"] == "2"]
    if how == "payload":
        # Same timing: the withdrawn ticks come back, once each, under the new one.
        ticks = [t["scheduled_for"] for t in final]
        steps = {b - a for a, b in itertools.pairwise(ticks)}
        assert steps == {timedelta(seconds=1)}, ticks
        assert new and all(t["scheduled_for"] > old_after[-1]["scheduled_for"] for t in new)
    elif how == "timing":
        assert new and all(int(t["scheduled_for"].timestamp()) % 2 == 0 for t in new)
    else:  # paused or deleted: nothing more
        assert final == after


async def test_a_change_leaves_a_task_a_claim_holds_and_its_tick(own_database_url: str) -> None:
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await due_now(url)
        await pass_ahead(a)
        last = (await fetch(url, TASKS))[-1]
        # As if a claim had taken it (it cannot before its time; this stands for a
        # claim that took it at its time, racing the change).
        await execute(
            url,
            "UPDATE tasks SET status = 'claimed', lease_id = gen_random_uuid(), "
            "lease_expires_at = now() + interval '1 minute' WHERE id = $1",
            last["id"],
        )
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 2})
        ticks = await fetch(url, "SELECT tick_at, task_id FROM schedule_ticks")
    kept: dict[str, Any] = {t["task_id"]: t["tick_at"] for t in ticks}
    assert kept.get(last["id"]) == last["scheduled_for"]
    assert any(t["id"] == last["id"] for t in await fetch(url, TASKS))


async def test_a_task_decided_ahead_is_handed_out_at_its_time_not_before(
    own_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    """End to end on a running gateway: the leader's passes decide an every-second
    schedule's ticks ahead; a claim parked on the runtime gets each task once its tick
    has come, never before, and every tick's task comes in turn."""
    settings = janitor_settings(own_database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw:
        await wait_until(lambda: gw.gateway.janitor.is_leader, 5.0, "the janitor to lead")
        status, body = await gw.call(
            "PUT",
            "/v1/runtimes/rt/schedules/every",
            {"every_seconds": 1, "overlap": "allow", "payload": {"tick": True}},
        )
        assert status == 201, body
        got = []
        for _ in range(4):
            [task] = await gw.claim("rt", wait_seconds=10)
            answered = datetime.now(UTC)
            assert answered >= datetime.fromisoformat(task["scheduled_for"]), task
            got.append(datetime.fromisoformat(task["scheduled_for"]))
        ahead = await fetch(own_database_url, "SELECT 1 FROM tasks WHERE status = 'scheduled'")
    assert [b - a for a, b in itertools.pairwise(got)] == [timedelta(seconds=1)] * 3
    assert ahead, "no tick was decided ahead of its time"


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "cancel_previous"])
async def test_a_change_from_allow_leaves_the_new_policy_the_task_still_to_run(
    own_database_url: str, overlap: str
) -> None:
    """A PUT from allow to another policy, its timing kept, withdraws the ticks decided
    ahead; the schedule's last tick and last task are then the latest left (a task not
    yet claimed), not a withdrawn one, so that the new policy sees that task still
    queued at its first tick: skip and buffer_one skip the tick, cancel_previous
    cancels the task. Taken as the last task, a withdrawn one (deleted) looked finished,
    and every policy enqueued beside the task still queued."""
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await due_now(url)
        await pass_ahead(a)
        await put(a, "rt", "s", every_seconds=1, overlap=overlap, payload={"v": 1})
        row = await a.get_schedule("rt", "s")
        left = await fetch(url, TASKS)
        assert row is not None and left, left
        latest = left[-1]
        assert (row.last_tick_at, row.last_task_id) == (latest["scheduled_for"], latest["id"])
        assert row.last_task_status == "queued"
        # The first tick under the new policy, once it has come.
        wait = (row.next_tick_at - await a.now()).total_seconds()
        await execute(url, "SELECT pg_sleep($1)", max(wait, 0.0) + 0.05)
        decided, cancelled, _ = await a.decide_due(100, plans.due_plan(30))
        final = await fetch(url, TASKS)
    first = [t for t in decided if t.tick_at == row.next_tick_at]
    assert len(first) == 1, decided
    if overlap == "cancel_previous":
        assert first[0].outcome == "enqueued"
        assert cancelled == [(latest["id"], "cancelled")]
    else:
        assert first[0].outcome == "skipped_overlap"
        assert [t["id"] for t in final] == [t["id"] for t in left]


async def test_a_wait_for_the_result_of_a_withdrawn_task_ends_when_it_is_withdrawn(
    own_database_url: str, redis_url: str
) -> None:
    """The schedule shows its task decided ahead as its last task, and a client may
    wait for that task's result. A PUT that withdraws the task ends the wait at once
    (the task is gone: 404), as a finish wakes the waits on its task."""
    url = own_database_url
    async with gateway(url, redis_url) as gw:
        status, body = await gw.call(
            "PUT",
            "/v1/runtimes/rt/schedules/s",
            {"every_seconds": 1, "overlap": "allow", "payload": {"v": 1}},
        )
        assert status == 201, body
        await due_now(url)
        # Ticks decided far ahead, so that the one waited on is still to come at the PUT.
        await gw.gateway.store.decide_due(100, plans.due_plan(30, ahead_seconds=30), 30)
        [far] = await fetch(
            url,
            "SELECT id FROM tasks WHERE status = 'scheduled' "
            "AND scheduled_for > now() + interval '20 seconds' ORDER BY scheduled_for LIMIT 1",
        )
        task_id = str(far["id"])
        results = gw.gateway.results
        waiter = asyncio.create_task(req(gw, "GET", f"/v1/tasks/{task_id}?wait_seconds=30"))
        await wait_until(lambda: results.waiting() >= 1, 10, "the wait to park")
        status, body = await gw.call(
            "PUT",
            "/v1/runtimes/rt/schedules/s",
            {"every_seconds": 1, "overlap": "allow", "payload": {"v": 2}},
        )
        assert status == 200, body
        assert not await fetch(url, "SELECT 1 FROM tasks WHERE id = $1", far["id"])
        try:
            answer = await asyncio.wait_for(waiter, 5)
        finally:
            waiter.cancel()
    assert answer.status == 404, (answer.status, answer.body)
