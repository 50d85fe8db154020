"""TTL expiry and the retention purge (design section 4).

Rows are made through the API and finished the ordinary way; only their age is
adjusted in Postgres (`finished_at`, `expires_at`), so that the tests need not wait
hours.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway import janitor as janitor_module
from tests.support.databases import execute, fetch
from tests.support.gateways import Instance, running_gateway
from tests.support.http import call_ok
from tests.support.janitor import (
    first_pass_done,
    janitor_settings,
    row_of,
)
from tests.support.metrics import sample

pytestmark = pytest.mark.integration


async def age(database_url: str, task_id: str, interval: str) -> None:
    """Make a finished row look finished `interval` ago."""
    status = await execute(
        database_url,
        "UPDATE tasks SET finished_at = now() - $2::text::interval WHERE id = $1::uuid",
        task_id,
        interval,
    )
    assert status == "UPDATE 1"


async def statuses(database_url: str, runtime: str) -> dict[str, str]:
    rows = await fetch(database_url, "SELECT id, status FROM tasks WHERE runtime_id = $1", runtime)
    return {str(r["id"]): r["status"] for r in rows}


# -- TTL expiry ---------------------------------------------------------------------


async def test_queued_tasks_past_their_ttl_expire_and_are_never_claimed(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    doomed_rt, live_rt = f"{runtime_id}-doomed", f"{runtime_id}-live"
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        doomed = [await gw.enqueue(doomed_rt, {"n": i}, ttl_seconds=1) for i in range(2)]
        later = await gw.enqueue(live_rt, {"n": "later"}, ttl_seconds=3600)
        never = await gw.enqueue(live_rt, {"n": "never"})
        await execute(
            own_database_url,
            "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE id = ANY($1::uuid[])",
            [t["id"] for t in doomed],
        )
        before = {t["id"]: await row_of(own_database_url, t["id"]) for t in (later, never)}

        # Past its expiry a task is never handed out, even before the janitor marks it.
        assert await gw.claim(doomed_rt, "w", max_tasks=10, wait_seconds=0) == []

        report = await gw.gateway.janitor.run_once()
        assert report.expired == 2, report
        assert report.errors == []
        assert sample(gw, "gateway_tasks_expired_total") == 2
        for t in doomed:
            row = await row_of(own_database_url, t["id"])
            assert row["status"] == "expired"
            assert row["finished_at"] is not None
            assert row["attempts"] == 0
        for t in (later, never):
            assert await row_of(own_database_url, t["id"]) == before[t["id"]], (
                "untouched by the janitor"
            )

        assert await gw.claim(doomed_rt, "w", max_tasks=10, wait_seconds=0) == []
        again = await gw.gateway.janitor.run_once()
        assert again.expired == 0, again
        got = await gw.claim(live_rt, "w", max_tasks=10, wait_seconds=0)
        assert sorted(t["id"] for t in got) == sorted([later["id"], never["id"]])


async def test_ttl_expiry_through_the_clock(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """The same without touching expires_at: ttl_seconds=1, then wait it out."""
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, {"n": 1}, ttl_seconds=1)
        assert (await gw.gateway.janitor.run_once()).expired == 0
        assert (await row_of(own_database_url, task["id"]))["status"] == "queued"
        rows: list[Any] = []

        async def past() -> bool:
            rows[:] = await fetch(
                own_database_url,
                "SELECT expires_at <= now() AS p FROM tasks WHERE id = $1::uuid",
                task["id"],
            )
            return bool(rows[0]["p"])

        deadline = time.monotonic() + 3.0
        while not await past():
            assert time.monotonic() < deadline, "expires_at never passed"
            await asyncio.sleep(0.05)
        report = await gw.gateway.janitor.run_once()
        assert report.expired == 1, report
        assert (await row_of(own_database_url, task["id"]))["status"] == "expired"
        assert await gw.claim(runtime_id, "w", wait_seconds=0) == []


# -- retention ----------------------------------------------------------------------


async def claimed(gw: Instance, runtime: str, payload: Any, **fields: Any) -> dict[str, Any]:
    """Enqueue one task on a fresh runtime of its own and claim it."""
    task = await gw.enqueue(runtime, payload, **fields)
    [held] = await gw.claim(runtime, "w", lease_seconds=3600)
    assert held["id"] == task["id"]
    return held


async def test_retention_deletes_exactly_the_old_finished_rows(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """retention 1 h for completed/cancelled/expired, 2 h for dead; queued and
    claimed rows are never deleted, whatever their age."""
    cfg = janitor_settings(
        own_database_url,
        redis_url,
        redis_prefix,
        retention_seconds=3600,
        dead_retention_seconds=7200,
    )
    rt = runtime_id
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        ids: dict[str, str] = {}

        for name in ("completed_2h", "completed_10min"):
            held = await claimed(gw, f"{rt}-{name}", {"name": name})
            await call_ok(
                gw, "POST", f"/v1/tasks/{held['id']}/complete", {"lease_id": held["lease_id"]}
            )
            ids[name] = held["id"]
        for name in ("dead_90min", "dead_3h"):
            held = await claimed(gw, f"{rt}-{name}", {"name": name})
            body = {"lease_id": held["lease_id"], "error": "boom", "retry": False}
            dead = await call_ok(gw, "POST", f"/v1/tasks/{held['id']}/fail", body)
            assert dead["status"] == "dead"
            ids[name] = held["id"]
        cancelled = await gw.enqueue(f"{rt}-cancelled_2h", {"name": "cancelled"})
        await call_ok(gw, "POST", f"/v1/tasks/{cancelled['id']}/cancel")
        ids["cancelled_2h"] = cancelled["id"]
        expired = await gw.enqueue(f"{rt}-expired_2h", {"name": "expired"}, ttl_seconds=3600)
        await execute(
            own_database_url,
            "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            expired["id"],
        )
        ids["expired_2h"] = expired["id"]
        queued = await gw.enqueue(f"{rt}-queued_old", {"name": "queued"}, delay_seconds=86400)
        ids["queued_old"] = queued["id"]
        ids["claimed_old"] = (await claimed(gw, f"{rt}-claimed_old", {"name": "claimed"}))["id"]

        first = await gw.gateway.janitor.run_once()  # marks expired_2h; nothing is old yet
        assert (first.expired, first.purged, first.errors) == (1, 0, []), first

        await age(own_database_url, ids["completed_2h"], "2 hours")
        await age(own_database_url, ids["completed_10min"], "10 minutes")
        await age(own_database_url, ids["dead_90min"], "90 minutes")
        await age(own_database_url, ids["dead_3h"], "3 hours")
        await age(own_database_url, ids["cancelled_2h"], "2 hours")
        await age(own_database_url, ids["expired_2h"], "2 hours")
        # Rows that are not finished keep their place even with an old finished_at
        # (which only a bug could leave there): the status decides, not the timestamp.
        await execute(
            own_database_url,
            "UPDATE tasks SET created_at = now() - interval '400 days', "
            "finished_at = now() - interval '400 days' WHERE id = ANY($1::uuid[])",
            [ids["queued_old"], ids["claimed_old"]],
        )

        report = await gw.gateway.janitor.run_once()
        assert report.purged == 4, report
        assert report.errors == []
        assert sample(gw, "gateway_tasks_purged_total") == 4
        left = {
            r["id"]: r["status"]
            for r in await fetch(
                own_database_url,
                "SELECT id::text, status FROM tasks WHERE runtime_id LIKE $1",
                rt + "-%",
            )
        }
        names = {v: k for k, v in ids.items()}
        assert {names[i]: s for i, s in left.items()} == {
            "completed_10min": "completed",
            "dead_90min": "dead",
            "queued_old": "scheduled",  # a delayed task: stored so, shown as queued
            "claimed_old": "claimed",
        }
        assert (await gw.gateway.janitor.run_once()).purged == 0


async def test_retention_deletes_in_bounded_batches(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    """janitor_batch_size=10 and 35 old completed rows: one pass deletes them all, in
    four statements of at most 10 rows each (10, 10, 10, 5), plus one for dead rows."""
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_batch_size=10, retention_seconds=3600
    )
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        ids = await finished_rows(gw, own_database_url, runtime_id, 35)

        store = gw.gateway.store
        original = store.purge_finished
        calls: list[tuple[tuple[str, ...], float, int, int]] = []

        async def recording(statuses: Any, age_seconds: float, limit: int) -> int:
            n = await original(statuses, age_seconds, limit)
            calls.append((tuple(statuses), age_seconds, limit, n))
            return n

        monkeypatch.setattr(store, "purge_finished", recording)
        report = await gw.gateway.janitor.run_once()
        assert report.purged == 35, report
        assert [c[2] for c in calls] == [10] * 5, calls
        finished_calls = [c for c in calls if c[0] != ("dead",)]
        assert [c[3] for c in finished_calls] == [10, 10, 10, 5], calls
        assert all(c[1] == 3600 for c in finished_calls)
        assert [c for c in calls if c[0] == ("dead",)] == [
            (("dead",), cfg.dead_retention_seconds, 10, 0)
        ]
        gone = await fetch(own_database_url, "SELECT id FROM tasks WHERE id = ANY($1::uuid[])", ids)
        assert gone == []


async def test_one_pass_is_bounded_and_the_rest_waits_for_the_next(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """At most MAX_BATCHES_PER_STEP batches per step and pass: 105 old rows with
    batch size 10 take two passes (100, then 5)."""
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_batch_size=10, retention_seconds=3600
    )
    n = janitor_module.MAX_BATCHES_PER_STEP * 10 + 5
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        await finished_rows(gw, own_database_url, runtime_id, n)
        first = await gw.gateway.janitor.run_once()
        assert first.purged == n - 5, first
        second = await gw.gateway.janitor.run_once()
        assert second.purged == 5, second
        assert await statuses(own_database_url, runtime_id) == {}


async def finished_rows(gw: Instance, database_url: str, runtime: str, n: int) -> list[str]:
    """n tasks enqueued in one batch, claimed and completed through the API, then
    made two hours old. Returns their ids."""
    status, body = await gw.call(
        "POST", f"/v1/runtimes/{runtime}/tasks:batch", {"tasks": [{"payload": i} for i in range(n)]}
    )
    assert status == 201, body
    ids = [t["id"] for t in body["tasks"]]
    held: list[dict[str, Any]] = []
    while len(held) < n:
        got = await gw.claim(runtime, "w", max_tasks=100, wait_seconds=0, lease_seconds=600)
        assert got, f"claimed only {len(held)} of {n}"
        held.extend(got)
    for task in held:
        await call_ok(
            gw, "POST", f"/v1/tasks/{task['id']}/complete", {"lease_id": task["lease_id"]}
        )
    status_line = await execute(
        database_url,
        "UPDATE tasks SET finished_at = now() - interval '2 hours' "
        "WHERE runtime_id = $1 AND status = 'completed'",
        runtime,
    )
    assert status_line == f"UPDATE {n}"
    return ids
