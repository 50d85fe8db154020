"""A failing janitor step does not stop the others, and the background loop
survives anything a pass throws."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from tests.support.databases import execute
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import (
    empty_verdict,
    enqueue_without_bump,
    first_pass_done,
    janitor_settings,
    row_of,
)
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


async def one_of_each(gw: Instance, database_url: str, rt: str) -> dict[str, str]:
    """One row for every duty: a lapsed lease, a queued task past its expiry, an old
    completed task, and a claimable task behind a lost bump. Ages are set in SQL."""
    await gw.enqueue(f"{rt}-lease", {"duty": "reclaim"})
    [lapsed] = await gw.claim(f"{rt}-lease", "w", lease_seconds=60)
    await execute(
        database_url,
        "UPDATE tasks SET lease_expires_at = now() - interval '5 seconds' WHERE id = $1::uuid",
        lapsed["id"],
    )
    ttl = await gw.enqueue(f"{rt}-ttl", {"duty": "expire"}, ttl_seconds=3600)
    await execute(
        database_url,
        "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE id = $1::uuid",
        ttl["id"],
    )
    await gw.enqueue(f"{rt}-old", {"duty": "purge"})
    [old] = await gw.claim(f"{rt}-old", "w")
    status, body = await gw.complete(old)
    assert status == 200, body
    await execute(
        database_url,
        "UPDATE tasks SET finished_at = now() - interval '2 hours' WHERE id = $1::uuid",
        old["id"],
    )
    await empty_verdict(gw, f"{rt}-stale")
    stale = await enqueue_without_bump(gw, f"{rt}-stale", {"duty": "repair"})
    await execute(
        database_url,
        "UPDATE tasks SET run_at = now() - interval '5 seconds' WHERE id = $1::uuid",
        stale,
    )
    return {"lease": lapsed["id"], "ttl": ttl["id"], "old": old["id"], "stale": stale}


STEPS = {
    "lease reclaim": "reclaim_leases",
    "expiry": "expire_tasks",
    "retention": "purge_finished",
    "verdict repair": "claimable_runtimes",
}


@pytest.mark.parametrize("broken", list(STEPS))
async def test_a_failing_step_does_not_stop_the_others(
    own_database_url: str,
    redis_url: str,
    redis_prefix: str,
    runtime_id: str,
    monkeypatch: Any,
    broken: str,
) -> None:
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, retention_seconds=3600)
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        ids = await one_of_each(gw, own_database_url, runtime_id)

        async def boom(*args: Any) -> Any:
            raise StoreUnavailable("boom")

        monkeypatch.setattr(gw.gateway.store, STEPS[broken], boom)
        report = await gw.gateway.janitor.run_once()
        assert report.errors == [f"{broken}: boom"], report
        assert sample(gw, "gateway_janitor_errors_total") == 1

        works = {name: name != broken for name in STEPS}
        assert report.reclaimed == (1 if works["lease reclaim"] else 0), report
        assert report.expired == (1 if works["expiry"] else 0), report
        assert report.purged == (1 if works["retention"] else 0), report
        stale_rt = f"{runtime_id}-stale"
        assert report.repaired == ([stale_rt] if works["verdict repair"] else []), report
        lease_row = await row_of(own_database_url, ids["lease"])
        assert lease_row["status"] == ("queued" if works["lease reclaim"] else "claimed")
        assert (await row_of(own_database_url, ids["ttl"]))["status"] == (
            "expired" if works["expiry"] else "queued"
        )

        # The next pass, with the step healthy again, does what was left.
        monkeypatch.undo()
        again = await gw.gateway.janitor.run_once()
        assert again.errors == [], again
        assert again.reclaimed + report.reclaimed == 1
        assert again.expired + report.expired == 1
        assert again.purged + report.purged == 1
        assert again.repaired + report.repaired == [stale_rt]


async def test_the_loop_survives_an_unexpected_exception(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch: Any
) -> None:
    cfg = janitor_settings(own_database_url, redis_url, redis_prefix, janitor_interval_seconds=0.2)
    async with running_gateway(cfg) as gw:
        janitor = gw.gateway.janitor
        await wait_until(lambda: janitor.is_leader, 2.0, "the janitor to lead")
        original = janitor.run_once
        calls: list[float] = []

        async def flaky() -> Any:
            calls.append(time.monotonic())
            if len(calls) == 1:
                raise RuntimeError("an unexpected bug in a pass")
            return await original()

        errors_before = sample(gw, "gateway_janitor_errors_total")
        monkeypatch.setattr(janitor, "run_once", flaky)
        await wait_until(lambda: len(calls) >= 1, 2.0, "a pass that raises")
        assert sample(gw, "gateway_janitor_errors_total") == errors_before + 1

        # Later passes still happen, and still work: a lease lapsing now is reclaimed.
        await gw.enqueue(runtime_id, {"job": 1})
        [held] = await gw.claim(runtime_id, "w", lease_seconds=60)
        await execute(
            own_database_url,
            "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            held["id"],
        )
        await wait_until(lambda: len(calls) >= 3, 2.0, "passes after the exception")
        assert janitor.is_leader
        deadline = time.monotonic() + 2.0
        while (await row_of(own_database_url, held["id"]))["status"] != "queued":
            assert time.monotonic() < deadline, "the loop stopped reclaiming"
            await asyncio.sleep(0.05)
        assert sample(gw, "gateway_leases_reclaimed_total", outcome="queued") == 1


async def test_a_pass_without_redis_still_does_the_postgres_work(
    own_database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str
) -> None:
    """Postgres never needs Redis (I5): with Redis gone, a pass still reclaims,
    expires and purges within its short Redis budgets; the lost bumps and the repair
    it cannot do are not errors of the pass."""
    cfg = janitor_settings(
        own_database_url, redis_process.url, redis_prefix, retention_seconds=3600
    )
    async with running_gateway(cfg) as gw:
        await first_pass_done(gw)
        ids = await one_of_each(gw, own_database_url, runtime_id)
        redis_process.kill()

        started = time.monotonic()
        report = await gw.gateway.janitor.run_once()
        assert time.monotonic() - started < 3.0, "the pass hung on Redis"
        assert report.errors == [], report
        assert (report.reclaimed, report.expired, report.purged) == (1, 1, 1), report
        assert report.repaired == []
        assert (await row_of(own_database_url, ids["lease"]))["status"] == "queued"
        assert sample(gw, "gateway_version_bumps_total", outcome="error") >= 1
