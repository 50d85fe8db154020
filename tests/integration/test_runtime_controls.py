"""Runtime controls against the real Postgres and Redis, with real concurrent clients on
two gateway instances: pause and resume, max_in_flight, claims_per_second, the cost of
parked polls on a held runtime, and who may change the controls."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from gateway.store.controls import HELD_RECHECK_SECONDS
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.janitor import (
    enqueue_without_bump,
    first_pass_done,
    janitor_settings,
    wait_lapsed,
)
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _controls(inst: Instance, runtime_id: str, **fields: Any) -> dict[str, Any]:
    status, body = await inst.call("PATCH", f"/v1/runtimes/{runtime_id}/controls", fields)
    assert status == 200, body
    return body


async def _listing_rows(inst: Instance, runtime_id: str) -> list[dict[str, Any]]:
    """The runtime's rows in GET /v1/runtimes, paged through: the session's database is
    shared with other tests' runtimes."""
    rows: list[dict[str, Any]] = []
    path: str | None = "/v1/runtimes?limit=1000"
    while path is not None:
        status, page = await inst.call("GET", path)
        assert status == 200, page
        rows += [r for r in page["runtimes"] if r["runtime_id"] == runtime_id]
        cursor = page["next_cursor"]
        path = None if cursor is None else f"/v1/runtimes?limit=1000&cursor={cursor}"
    return rows


async def _post(inst: Instance, path: str) -> dict[str, Any]:
    status, body = await inst.call("POST", path)
    assert status == 200, body
    return body


def _claim_task(inst: Instance, runtime_id: str, **fields: Any) -> asyncio.Task[list[Any]]:
    return asyncio.create_task(inst.claim(runtime_id, **fields))


async def test_pause_on_one_instance_holds_claims_on_the_other_until_resumed(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A poll parked on B stays parked while A pauses the runtime and work arrives; a
    claim without wait on B answers empty at once; resuming on A serves the parked poll
    with the task. Stats and the runtimes listing show the paused state."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        paused = await _post(a, f"/v1/runtimes/{runtime_id}:pause")
        assert paused["paused"] is True and paused["runtime_id"] == runtime_id
        await wait_until(
            lambda: b.gateway.controls.paused(runtime_id), 5, "B to learn of the pause"
        )
        parked = _claim_task(b, runtime_id, wait_seconds=20)
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 1, 5, "the poll parks")
        task = await a.enqueue(runtime_id, {"n": 1})
        # Enqueues still work; B's parked poll was woken by the bump and stayed parked.
        await wait_until(
            lambda: sample(b, "gateway_wakeups_received_total") > 0, 5, "B hears the bump"
        )
        assert await b.claim(runtime_id) == []
        assert not parked.done()
        status, stats = await b.call("GET", f"/v1/runtimes/{runtime_id}/stats")
        assert status == 200 and stats["paused"] is True and stats["counts"]["queued"] == 1
        assert [r["paused"] for r in await _listing_rows(a, runtime_id)] == [True]
        resumed = await _post(a, f"/v1/runtimes/{runtime_id}:resume")
        assert resumed["paused"] is False
        got = await asyncio.wait_for(parked, 10)
        assert [t["id"] for t in got] == [task["id"]]


async def test_parked_polls_on_a_paused_runtime_run_no_claim_statement(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """20 polls parked on a paused runtime with tasks queued, woken by further enqueues:
    the instance's Postgres claim counter does not move until the resume."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a:
        await _post(a, f"/v1/runtimes/{runtime_id}:pause")
        await a.enqueue(runtime_id, {"n": 0})
        before = sample(a, "gateway_postgres_claims_total")
        polls = [_claim_task(a, runtime_id, worker=f"w{i}", wait_seconds=20) for i in range(20)]
        await wait_until(lambda: a.gateway.claimer.parked(runtime_id) == 20, 5, "20 parked polls")
        for n in range(1, 5):
            await a.enqueue(runtime_id, {"n": n})
        for _ in range(5):
            assert await a.claim(runtime_id) == []
        assert sample(a, "gateway_postgres_claims_total") == before
        await _post(a, f"/v1/runtimes/{runtime_id}:resume")
        # Five of the twenty get a task each. Which five follows the order in which
        # their requests reached the gateway, not the order they were made in.
        await wait_until(lambda: sum(p.done() for p in polls) >= 5, 10, "five answered polls")
        got = [p.result() for p in polls if p.done()]
        assert sorted(len(g) for g in got) == [1] * 5
        assert sample(a, "gateway_postgres_claims_total") > before
        for poll in polls:
            poll.cancel()


async def test_max_in_flight_holds_across_two_instances_under_concurrent_claims(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """max_in_flight=3; 16 claimers on two instances (max_tasks 1-3, wait 1 s) hold and
    complete tasks. A sampler reading Postgres all along never sees more than 3 leased."""
    limit, tasks = 3, 60
    cfg = make_settings(database_url, redis_url, redis_prefix)
    rng = random.Random()
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await _controls(a, runtime_id, max_in_flight=limit)
        await wait_until(lambda: b.gateway.controls.limited(runtime_id), 5, "B learns the limit")
        for n in range(tasks):
            await (a, b)[n % 2].enqueue(runtime_id, {"n": n})
        done: list[str] = []
        most = 0
        samples = 0
        stop = asyncio.Event()

        async def sampler() -> None:
            nonlocal most, samples
            conn = await asyncpg.connect(database_url)
            try:
                while not stop.is_set():
                    n = await conn.fetchval(
                        "SELECT count(*) FROM tasks WHERE runtime_id = $1 AND status = 'claimed'",
                        runtime_id,
                    )
                    most, samples = max(most, n), samples + 1
            finally:
                await conn.close()

        async def claimer(k: int) -> None:
            inst = (a, b)[k % 2]
            deadline = time.monotonic() + 40
            while len(done) < tasks and time.monotonic() < deadline:
                got = await inst.claim(
                    runtime_id, f"c{k}", max_tasks=rng.randint(1, 3), wait_seconds=1
                )
                for task in got:
                    await asyncio.sleep(rng.uniform(0, 0.02))
                    status, body = await rng.choice((a, b)).complete(task)
                    assert status == 200, body
                    done.append(task["id"])

        watching = asyncio.create_task(sampler())
        await asyncio.gather(*(claimer(k) for k in range(16)))
        stop.set()
        await watching
        assert sorted(set(done)) == sorted(done) and len(done) == tasks
        assert samples > 10
        assert 1 <= most <= limit


async def test_a_freed_slot_wakes_a_parked_poll(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """max_in_flight=1 with two tasks: the second claim parks (no claim statement while
    it does) and gets the second task when the first is completed on the other instance,
    well inside its wait, which is shorter than the held runtime's own recheck."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    wait = HELD_RECHECK_SECONDS - 2
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await _controls(a, runtime_id, max_in_flight=1)
        await wait_until(lambda: b.gateway.controls.limited(runtime_id), 5, "B learns the limit")
        first = await a.enqueue(runtime_id, {"n": 1})
        second = await a.enqueue(runtime_id, {"n": 2})
        [held] = await a.claim(runtime_id, max_tasks=2)
        assert held["id"] == first["id"]
        parked = _claim_task(b, runtime_id, wait_seconds=wait)
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 1, 5, "the poll parks")
        await wait_until(
            lambda: b.gateway.claimer._states[runtime_id].held_until > 0, 5, "held by the limit"
        )
        claims = sample(b, "gateway_postgres_claims_total")
        more = [_claim_task(b, runtime_id, worker=f"x{i}", wait_seconds=wait) for i in range(5)]
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 6, 5, "six parked")
        assert sample(b, "gateway_postgres_claims_total") == claims
        status, body = await a.complete(held)
        assert status == 200, body
        got = await asyncio.wait_for(asyncio.gather(parked, *more), wait + 5)
        assert [t["id"] for g in got for t in g] == [second["id"]]


async def test_claims_per_second_holds_over_a_window(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """claims_per_second=5 (burst 5): claimers on two instances asking for 5 tasks at a
    time for about 2 s lease at most 5 + 5 per second elapsed since the limit was set."""
    rate = 5.0
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        for n in range(100):
            await a.enqueue(runtime_id, {"n": n})
        started = time.monotonic()
        await _controls(a, runtime_id, claims_per_second=rate)
        await wait_until(lambda: b.gateway.controls.limited(runtime_id), 5, "B learns the limit")
        leased: list[str] = []

        async def claimer(k: int) -> None:
            inst = (a, b)[k % 2]
            while time.monotonic() - started < 2.0:
                got = await inst.claim(runtime_id, f"c{k}", max_tasks=5, wait_seconds=0.5)
                leased.extend(t["id"] for t in got)

        await asyncio.gather(*(claimer(k) for k in range(6)))
        elapsed = time.monotonic() - started
        assert len(set(leased)) == len(leased)
        assert rate <= len(leased) <= rate + rate * elapsed + 1


async def test_controls_read_and_validation(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A runtime never changed reads as no controls; bad values are 422 naming the field
    and store nothing; null removes a limit."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a:
        path = f"/v1/runtimes/{runtime_id}/controls"
        status, body = await a.call("GET", path)
        assert status == 200
        assert body == {
            "runtime_id": runtime_id,
            "paused": False,
            "max_in_flight": None,
            "claims_per_second": None,
            "updated_at": None,
            "paused_reason": None,
            "paused_since": None,
            "paused_until": None,
        }
        for bad, field in (
            ({"max_in_flight": 0}, "max_in_flight"),
            ({"max_in_flight": 100001}, "max_in_flight"),
            ({"max_in_flight": 1.5}, "max_in_flight"),
            ({"claims_per_second": 0}, "claims_per_second"),
            ({"claims_per_second": 100000.5}, "claims_per_second"),
            ({"paused": "yes"}, "paused"),
            ({"pause": True}, "pause"),
        ):
            status, problem = await a.call("PATCH", path, bad)
            assert status == 422, (bad, problem)
            assert problem["field"] == field, problem
        status, body = await a.call("GET", path)
        assert body["updated_at"] is None
        body = await _controls(a, runtime_id, max_in_flight=7, claims_per_second=2.5)
        assert (body["max_in_flight"], body["claims_per_second"]) == (7, 2.5)
        body = await _controls(a, runtime_id, paused=True)
        assert (body["paused"], body["max_in_flight"]) == (True, 7)
        body = await _controls(a, runtime_id, max_in_flight=None)
        assert (body["max_in_flight"], body["claims_per_second"]) == (None, 2.5)
        status, read = await a.call("GET", path)
        assert read == body


async def test_only_the_control_scope_on_covered_runtimes_may_change_controls(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A `claim` token may read stats but not pause (403); a `control` token for
    `<runtime>*` pauses its runtime and gets 403 on another."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a:

        async def token(scopes: list[str]) -> str:
            status, body = await a.call(
                "POST",
                "/v1/admin/tokens",
                {
                    "name": f"{runtime_id}-{scopes[0]}",
                    "scopes": scopes,
                    "runtimes": [runtime_id + "*"],
                },
            )
            assert status == 201, body
            return str(body["token"])

        claim_token, control_token = await token(["claim"]), await token(["control"])

        def auth(secret: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {secret}"}

        status, _ = await a.call(
            "POST", f"/v1/runtimes/{runtime_id}:pause", headers=auth(claim_token)
        )
        assert status == 403
        status, body = await a.call(
            "POST", f"/v1/runtimes/{runtime_id}:pause", headers=auth(control_token)
        )
        assert status == 200 and body["paused"] is True
        status, _ = await a.call(
            "POST", f"/v1/runtimes/other-{runtime_id}:pause", headers=auth(control_token)
        )
        assert status == 403


async def test_a_lease_reclaimed_as_dead_wakes_a_parked_poll(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """max_in_flight=1: the held task (max_attempts 1) lapses and the janitor's pass ends
    it dead; the poll parked behind the limit gets the next task (stored without a bump,
    so only the freed slot can wake it) inside its wait, which is shorter than the held
    runtime's own recheck."""
    wait = HELD_RECHECK_SECONDS - 1
    async with running_gateway(janitor_settings(database_url, redis_url, redis_prefix)) as a:
        await first_pass_done(a)
        await _controls(a, runtime_id, max_in_flight=1)
        await a.enqueue(runtime_id, {"n": 1}, max_attempts=1)
        [held] = await a.claim(runtime_id, lease_seconds=1)
        parked = _claim_task(a, runtime_id, worker="x", wait_seconds=wait)
        await wait_until(
            lambda: a.gateway.claimer._states[runtime_id].held_until > 0, 5, "held by the limit"
        )
        await wait_lapsed(database_url, [held["id"]])
        second = await enqueue_without_bump(a, runtime_id, {"n": 2})
        report = await a.gateway.janitor.run_once()
        # At least ours: the session's database may hold other tests' lapsed leases too.
        assert report.reclaimed >= 1 and report.errors == [], report
        got = await asyncio.wait_for(parked, wait + 5)
        assert [t["id"] for t in got] == [second]
        status, dead = await a.call("GET", f"/v1/tasks/{held['id']}")
        assert status == 200 and dead["status"] == "dead"


def _in(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize("limited", [False, True], ids=["unlimited", "max_in_flight"])
async def test_a_pause_with_until_ends_by_itself_and_wakes_parked_polls_on_every_instance(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, limited: bool
) -> None:
    """A pauses for 2 s with a reason; a poll parked on B (and one on A) while a task is
    queued is served once the pause ends, with no resume. Before the end both instances
    show the reason and end; after it, controls and stats read as not paused. With a
    max_in_flight the limited claim's SQL must see the end too. Parked polls would
    otherwise sleep out the 60 s empty TTL, and the janitor's wake-ups of runtimes with
    claimable work are an hour apart: only the pause's end can serve them in time."""
    cfg = make_settings(
        database_url,
        redis_url,
        redis_prefix,
        empty_ttl_seconds=60,
        janitor_interval_seconds=3600,
    )
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        if limited:
            await _controls(a, runtime_id, max_in_flight=5)
        status, paused = await a.call(
            "POST", f"/v1/runtimes/{runtime_id}:pause", {"reason": "db failover", "until": _in(2)}
        )
        assert status == 200, paused
        assert (paused["paused"], paused["paused_reason"]) == (True, "db failover")
        assert paused["paused_since"] is not None and paused["paused_until"] is not None
        await wait_until(lambda: b.gateway.controls.paused(runtime_id), 5, "B learns the pause")
        status, stats = await b.call("GET", f"/v1/runtimes/{runtime_id}/stats")
        assert status == 200
        assert {k: stats[k] for k in paused if k.startswith("paused")} == {
            k: paused[k] for k in paused if k.startswith("paused")
        }
        on_b = _claim_task(b, runtime_id, worker="on-b", wait_seconds=20)
        on_a = _claim_task(a, runtime_id, worker="on-a", wait_seconds=20)
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 1, 5, "B's poll parks")
        await wait_until(lambda: a.gateway.claimer.parked(runtime_id) == 1, 5, "A's poll parks")
        first = await a.enqueue(runtime_id, {"n": 1})
        second = await b.enqueue(runtime_id, {"n": 2})
        assert await b.claim(runtime_id) == []
        assert not on_b.done() and not on_a.done()
        got = await asyncio.wait_for(asyncio.gather(on_a, on_b), 15)
        assert sorted(t["id"] for g in got for t in g) == sorted([first["id"], second["id"]])
        for inst in (a, b):
            status, controls = await inst.call("GET", f"/v1/runtimes/{runtime_id}/controls")
            assert status == 200 and controls["paused"] is False
            assert controls["paused_reason"] is None and controls["paused_until"] is None
            status, stats = await inst.call("GET", f"/v1/runtimes/{runtime_id}/stats")
            assert stats["paused"] is False and stats["paused_reason"] is None


async def test_pause_reason_and_since_kept_or_replaced_and_cleared_by_resume(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A second pause replaces the reason and end but keeps paused_since; a PATCH pause
    has no reason; a resume clears all three; an empty body pauses until resumed."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a:
        pause = f"/v1/runtimes/{runtime_id}:pause"
        status, first = await a.call("POST", pause, {"reason": "deploy", "until": _in(3600)})
        assert status == 200 and first["paused_reason"] == "deploy"
        status, second = await a.call("POST", pause, {"reason": "x" * 500})
        assert status == 200, second
        assert second["paused_reason"] == "x" * 500 and second["paused_until"] is None
        assert second["paused_since"] == first["paused_since"]
        resumed = await _post(a, f"/v1/runtimes/{runtime_id}:resume")
        assert [resumed[k] for k in ("paused", "paused_reason", "paused_since")] == [
            False,
            None,
            None,
        ]
        body = await _controls(a, runtime_id, paused=True)
        assert body["paused"] is True and body["paused_reason"] is None
        assert body["paused_since"] is not None and body["paused_since"] > first["paused_since"]
        await _post(a, f"/v1/runtimes/{runtime_id}:resume")
        plain = await _post(a, pause)
        assert (plain["paused"], plain["paused_reason"], plain["paused_until"]) == (
            True,
            None,
            None,
        )


async def test_bad_pause_bodies_are_422_naming_the_field_and_store_nothing(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Each bad body answers 422 naming its field; the runtime stays without controls."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a:
        for bad, field in (
            ({"reason": "x" * 501}, "reason"),
            ({"reason": ""}, "reason"),
            ({"reason": 5}, "reason"),
            ({"until": (datetime.now(UTC) - timedelta(seconds=5)).isoformat()}, "until"),
            ({"until": "tomorrow"}, "until"),
            ({"until": "2099-01-01T00:00:00"}, "until"),
            ({"until": 4102444800}, "until"),
            ({"reason": "ok", "for": 5}, "for"),
        ):
            status, problem = await a.call("POST", f"/v1/runtimes/{runtime_id}:pause", bad)
            assert status == 422, (bad, problem)
            assert problem["field"] == field, (bad, problem)
        status, problem = await a.call("POST", f"/v1/runtimes/{runtime_id}:pause", [1, 2])
        assert status == 400, problem
        status, body = await a.call("GET", f"/v1/runtimes/{runtime_id}/controls")
        assert status == 200 and body["updated_at"] is None and body["paused"] is False
        assert not a.gateway.controls.paused(runtime_id)


async def test_the_listing_counts_parked_polls_of_every_instance(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Two polls parked on B and one on A (the runtime is paused, with a task queued):
    A's listing shows 3 once B has reported, and 1 again once B's polls left and B
    reported that; each instance's own count is live."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        status, body = await a.call(
            "POST",
            "/v1/admin/tokens",
            {"name": f"{runtime_id}-list", "scopes": ["read"], "runtimes": [runtime_id]},
        )
        assert status == 201, body
        reader = {"Authorization": f"Bearer {body['token']}"}

        async def listed(inst: Instance) -> int:
            status, page = await inst.call("GET", "/v1/runtimes", headers=reader)
            assert status == 200, page
            [row] = [r for r in page["runtimes"] if r["runtime_id"] == runtime_id]
            return int(row["parked_pollers"])

        await _post(a, f"/v1/runtimes/{runtime_id}:pause")
        await wait_until(lambda: b.gateway.controls.paused(runtime_id), 5, "B learns the pause")
        await a.enqueue(runtime_id, {"n": 1})
        on_b = [_claim_task(b, runtime_id, worker=f"b{i}", wait_seconds=30) for i in range(2)]
        on_a = _claim_task(a, runtime_id, worker="a0", wait_seconds=30)
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 2, 5, "B's polls park")
        await wait_until(lambda: a.gateway.claimer.parked(runtime_id) == 1, 5, "A's poll parks")
        assert await listed(b) >= 2  # its own, live
        await b.gateway.parked.report()
        assert await listed(a) == 3
        for poll in on_b:
            poll.cancel()
        await wait_until(lambda: b.gateway.claimer.parked(runtime_id) == 0, 5, "B's polls leave")
        await b.gateway.parked.report()
        assert await listed(a) == 1
        on_a.cancel()


async def test_the_listing_sums_claims_per_minute_of_every_instance(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Three tasks claimed on A and two on B, by concurrent pollers: either instance's
    listing shows 5 once the other has reported; a minute later (on the instances'
    adjustable clock) each shows 0 once the other reported its count gone."""
    cfg = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        now = [1000.0]
        for inst in (a, b):
            inst.gateway.claimer.activity.clock = lambda: now[0]
            await inst.gateway.parked.stop()  # the test reports by hand, when it says

        async def listed(inst: Instance) -> int:
            [row] = await _listing_rows(inst, runtime_id)
            return int(row["claims_per_minute"])

        for i in range(5):
            await a.enqueue(runtime_id, {"n": i})
        polls = [
            inst.claim(runtime_id, worker=f"{name}{i}", wait_seconds=10)
            for name, inst, n in (("a", a, 3), ("b", b, 2))
            for i in range(n)
        ]
        got = await asyncio.gather(*polls)
        assert [len(tasks) for tasks in got] == [1] * 5
        assert await listed(a) == 3  # its own, live; B has not reported yet
        await b.gateway.parked.report()
        assert await listed(a) == 5
        await a.gateway.parked.report()
        assert await listed(b) == 5

        now[0] += 60.0
        assert await listed(a) == 2  # its own is gone; B's report still stands
        await b.gateway.parked.report()
        await a.gateway.parked.report()
        assert await listed(a) == 0
        assert await listed(b) == 0
