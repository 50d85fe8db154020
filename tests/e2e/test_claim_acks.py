"""A claim that carries the previous tasks' reports (`complete`, `fail`) end to end,
against real Postgres and Redis: each item answered in `acks` as the batch endpoints
answer it, committed before the claim parks, replayed safely, limited to the token's
runtimes and scope, bounded at 1,000 items, answered when the claim is refused, and
applied not at all when the database is down.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from gateway_client import AsyncClient, Outcome, Task, TaskFailed, Worker, WorkerOptions
from tests.support.credentials import make_token
from tests.support.databases import execute, fetch, temporary_database
from tests.support.gateways import TOKEN, gateway
from tests.support.http import Resp, get_task, req
from tests.support.lifecycle import UNKNOWN_TASK, claim, enqueue
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.integration]


def item(task: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"id": task["id"], "lease_id": task["lease_id"], **fields}


async def claimed(gw, rt: str, n: int) -> list[dict[str, Any]]:
    """n tasks of runtime rt, enqueued and claimed, in enqueue order."""
    for i in range(n):
        await enqueue(gw, rt, i)
    tasks = await claim(gw, rt, max_tasks=n)
    assert len(tasks) == n
    return tasks


def strangers(n: int) -> list[dict[str, Any]]:
    """n reports of tasks that do not exist, each fit for `complete` and `fail`."""
    return [
        {"id": str(uuid.uuid4()), "lease_id": str(uuid.uuid4()), "error": "e"} for _ in range(n)
    ]


async def claim_with(gw, rt: str, auth: str | None = None, **fields: Any) -> Resp:
    kwargs = {} if auth is None else {"auth": auth}
    return await req(gw, "POST", f"/v1/runtimes/{rt}/claim", {"worker_id": "w", **fields}, **kwargs)


async def acks_of(gw, rt: str, **fields: Any) -> list[dict[str, Any]]:
    resp = await claim_with(gw, rt, **fields)
    assert resp.status == 200, (resp.status, resp.body)
    assert "retry_after_seconds" not in resp.body, resp.body
    return list(resp.body["acks"])


async def status(gw, task: dict[str, Any]) -> str:
    return str((await get_task(gw, task["id"]))["status"])


async def test_a_claim_without_reports_answers_as_before(gw, runtime_id):
    resp = await claim_with(gw, runtime_id)
    assert resp.status == 200 and resp.body == {"tasks": []}
    (task,) = await claimed(gw, runtime_id, 1)
    await enqueue(gw, runtime_id, "next")
    resp = await claim_with(gw, runtime_id)
    assert set(resp.body) == {"tasks"}
    # Present even empty: the answer carries `acks`.
    resp = await claim_with(gw, runtime_id, complete=[], fail=[])
    assert resp.status == 200 and resp.body["acks"] == [] and resp.body["tasks"] == []
    assert await status(gw, task) == "claimed"


async def test_mixed_outcomes_in_request_order_completes_first(gw, runtime_id):
    done, lost, retried, buried = await claimed(gw, runtime_id, 4)
    acks = await acks_of(
        gw,
        runtime_id,
        fail=[item(retried, error="try again"), item(buried, error="no", retry=False)],
        complete=[
            item(done, result={"ok": 1}),
            item(lost, lease_id=str(uuid.uuid4())),
            {"id": UNKNOWN_TASK, "lease_id": str(uuid.uuid4())},
        ],
    )
    assert [a["id"] for a in acks] == [
        done["id"],
        lost["id"],
        UNKNOWN_TASK,
        retried["id"],
        buried["id"],
    ]
    assert [a["outcome"] for a in acks] == [
        "completed",
        "lease_lost",
        "not_found",
        "queued",
        "dead",
    ]
    assert acks[1]["problem"]["status"] == 409 and acks[2]["problem"]["status"] == 404
    assert acks[3]["run_at"]
    # The tasks are as the batch endpoints would have left them.
    assert (await get_task(gw, done["id"]))["result"] == {"ok": 1}
    assert await status(gw, lost) == "claimed"
    assert (await get_task(gw, retried["id"]))["last_error"] == "try again"
    assert await status(gw, buried) == "dead"


async def test_a_replay_answers_as_the_batch_endpoints_do_and_applies_nothing_twice(gw, runtime_id):
    done, failed = await claimed(gw, runtime_id, 2)
    body = {"complete": [item(done, result=1)], "fail": [item(failed, error="e", retry=False)]}
    first = await acks_of(gw, runtime_id, **body)
    assert [a["outcome"] for a in first] == ["completed", "dead"]
    after_first = [await get_task(gw, t["id"]) for t in (done, failed)]
    # The answer was lost: the same request again.
    again = await acks_of(gw, runtime_id, **body)
    completes = await req(gw, "POST", "/v1/tasks:complete", {"tasks": body["complete"]})
    fails = await req(gw, "POST", "/v1/tasks:fail", {"tasks": body["fail"]})
    assert again == completes.body["results"] + fails.body["results"]
    assert [a["outcome"] for a in again] == ["completed", "lease_lost"]
    assert [await get_task(gw, t["id"]) for t in (done, failed)] == after_first


async def test_reports_are_committed_before_the_claim_parks(gw, runtime_id):
    """A producer waiting for the result gets it while the acknowledging claim is still
    parked: it never waits for the worker's next task."""
    (task,) = await claimed(gw, runtime_id, 1)
    results = gw.gateway.results
    waiting = results.waiting()
    waiter = asyncio.create_task(req(gw, "GET", f"/v1/tasks/{task['id']}?wait_seconds=30"))
    await wait_until(lambda: results.waiting() > waiting, 5, "the producer waiting")
    parked = asyncio.create_task(
        claim_with(gw, runtime_id, wait_seconds=30, complete=[item(task, result="r")])
    )
    finished = await waiter
    assert finished.status == 200 and finished.body["status"] == "completed"
    assert finished.body["result"] == "r"
    assert not parked.done(), "the claim answered before its wait ended, with no work"
    # Work arrives: the parked claim takes it and answers its acknowledgement too.
    nxt = await enqueue(gw, runtime_id, "next")
    resp = await parked
    assert resp.status == 200
    assert [t["id"] for t in resp.body["tasks"]] == [nxt["id"]]
    assert [a["outcome"] for a in resp.body["acks"]] == ["completed"]


async def test_a_task_of_a_runtime_the_token_does_not_cover_is_not_found(gw, runtime_id):
    covered, foreign = f"{runtime_id}-b", f"{runtime_id}-c"
    token = (await make_token(gw, ["claim"], [runtime_id, covered]))["token"]
    (theirs,) = await claimed(gw, foreign, 1)
    (ours,) = await claimed(gw, covered, 1)
    resp = await claim_with(gw, runtime_id, token, complete=[item(theirs), item(ours)])
    assert resp.status == 200, resp.body
    assert [a["outcome"] for a in resp.body["acks"]] == ["not_found", "completed"]
    assert resp.body["acks"][0]["problem"]["status"] == 404
    assert await status(gw, theirs) == "claimed"
    assert await status(gw, ours) == "completed"


async def test_a_token_without_the_claim_scope_is_403_and_nothing_is_applied(gw, runtime_id):
    token = (await make_token(gw, ["enqueue", "read"], [runtime_id]))["token"]
    (task,) = await claimed(gw, runtime_id, 1)
    resp = await claim_with(gw, runtime_id, token, complete=[item(task)])
    assert resp.status == 403 and resp.body["code"] == "forbidden"
    assert await status(gw, task) == "claimed"


@pytest.mark.parametrize(
    ("completes", "fails", "field"), [(1001, 0, "complete"), (600, 401, "fail")]
)
async def test_more_than_1000_reports_are_422_naming_the_field_and_nothing_is_applied(
    gw, runtime_id, completes, fails, field
):
    (task,) = await claimed(gw, runtime_id, 1)
    body = {"complete": [item(task), *strangers(completes - 1)], "fail": strangers(fails)}
    resp = await claim_with(gw, runtime_id, **body)
    assert resp.status == 422 and resp.body["field"] == field, resp.body
    assert "1000" in resp.body["detail"]
    assert await status(gw, task) == "claimed"


async def test_a_paused_runtime_still_applies_and_answers_the_reports(gw, runtime_id):
    done, failed = await claimed(gw, runtime_id, 2)
    await enqueue(gw, runtime_id, "waiting")
    assert (await req(gw, "POST", f"/v1/runtimes/{runtime_id}:pause")).status == 200
    resp = await claim_with(gw, runtime_id, complete=[item(done)], fail=[item(failed, error="e")])
    assert resp.status == 200, resp.body
    assert resp.body["tasks"] == []
    assert [a["outcome"] for a in resp.body["acks"]] == ["completed", "queued"]
    assert 1 <= resp.body["retry_after_seconds"] <= 5
    assert await status(gw, done) == "completed"


async def test_a_runtime_at_its_limit_still_applies_and_answers_the_reports(gw, runtime_id):
    other = f"{runtime_id}-other"
    (report,) = await claimed(gw, other, 1)
    limits = {"max_in_flight": 1}
    assert (await req(gw, "PATCH", f"/v1/runtimes/{runtime_id}/controls", limits)).status == 200
    (held,) = await claimed(gw, runtime_id, 1)
    await enqueue(gw, runtime_id, "over the limit")
    resp = await claim_with(gw, runtime_id, complete=[item(report)])
    assert resp.status == 200, resp.body
    assert resp.body["tasks"] == [] and resp.body["acks"][0]["outcome"] == "completed"
    assert 1 <= resp.body["retry_after_seconds"] <= 5
    assert await status(gw, held) == "claimed"


async def test_an_overloaded_claim_still_answers_the_reports(database_url, redis_url, runtime_id):
    async with gateway(database_url, redis_url, max_parked_polls=0) as full:
        (task,) = await claimed(full, runtime_id, 1)
        plain = await claim_with(full, runtime_id, wait_seconds=5)
        assert plain.status == 429
        resp = await claim_with(full, runtime_id, wait_seconds=5, complete=[item(task)])
        assert resp.status == 200, resp.body
        assert resp.body["tasks"] == [] and resp.body["acks"][0]["outcome"] == "completed"
        assert resp.body["retry_after_seconds"] == int(plain.headers["Retry-After"])


@pytest.mark.parametrize("kinds", ["complete and fail", "complete"])
async def test_with_the_database_down_the_claim_is_503_and_nothing_is_applied(
    pg_admin_url, redis_url, runtime_id, kinds
):
    """The gateway's database (one of its own) stops taking connections and every
    connection to it is cut, as when Postgres stops or restarts. Completes alone ride
    in the claim's own statement; with fails, they are applied before it."""
    async with temporary_database(pg_admin_url) as url:
        name = (await fetch(url, "SELECT current_database() AS name"))[0]["name"]
        try:
            async with gateway(url, redis_url) as gw:
                done, failed = await claimed(gw, runtime_id, 2)
                await execute(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                await execute(
                    pg_admin_url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                    name,
                )
                reports: dict[str, Any] = {"complete": [item(done)]}
                if kinds == "complete and fail":
                    reports["fail"] = [item(failed, error="e")]
                resp = await claim_with(gw, runtime_id, **reports)
                assert resp.status == 503 and resp.body["code"] == "store_unavailable", resp.body
        finally:
            await execute(pg_admin_url, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        found = await fetch(
            url,
            "SELECT status, lease_id::text AS lease FROM tasks WHERE id = ANY($1::uuid[])",
            [uuid.UUID(done["id"]), uuid.UUID(failed["id"])],
        )
        assert sorted((r["status"], r["lease"]) for r in found) == sorted(
            ("claimed", t["lease_id"]) for t in (done, failed)
        )


async def test_completes_ride_in_the_claims_own_statement(gw, runtime_id):
    """Workers that each finished a task claim the next one at once, each claim carrying
    its complete: the completes commit with the claims, in the statements that claim
    for them (leases.CLAIM_ACKED), and none in a statement of its own."""
    held = await claimed(gw, runtime_id, 8)
    for i in range(8):
        await enqueue(gw, runtime_id, f"next-{i}")
    own = sample(gw, "gateway_complete_statements_total")
    claims = sample(gw, "gateway_postgres_claims_total")
    answers = await asyncio.gather(
        *(
            acks_and_tasks(gw, runtime_id, complete=[item(task, result=i)])
            for i, task in enumerate(held)
        )
    )
    assert [acks for acks, _ in answers] == [["completed"]] * 8
    assert sorted(n for _, n in answers) == [1] * 8
    assert sample(gw, "gateway_complete_statements_total") == own
    assert 1 <= sample(gw, "gateway_postgres_claims_total") - claims <= 8
    assert [await status(gw, task) for task in held] == ["completed"] * 8


async def test_a_complete_carried_twice_at_once_is_applied_once_and_answered_twice(gw, runtime_id):
    """A worker whose claim's answer was lost sends it again while the first is still
    being served: the two may reach the same claim statement, which would apply the
    task once, for one of them. Each is answered `completed` (the second as a replay)."""
    for round_ in range(5):
        (task,) = await claimed(gw, runtime_id, 1)
        answers = await asyncio.gather(
            *(
                acks_and_tasks(gw, runtime_id, complete=[item(task, result=round_)])
                for _ in range(3)
            )
        )
        assert [acks for acks, _ in answers] == [["completed"]] * 3, round_
        found = await get_task(gw, task["id"])
        assert (found["status"], found["result"]) == ("completed", round_)


async def acks_and_tasks(gw, rt: str, **fields: Any) -> tuple[list[str], int]:
    """A claim's ack outcomes and how many tasks it got."""
    resp = await claim_with(gw, rt, **fields)
    assert resp.status == 200, (resp.status, resp.body)
    return [a["outcome"] for a in resp.body["acks"]], len(resp.body["tasks"])


def requests_to(gw, route: str) -> float:
    """The gateway's answered POSTs to `route` (a route template) that succeeded."""
    return sample(gw, "gateway_http_requests_total", route=route, method="POST", status_class="2xx")


async def test_the_worker_loop_sends_each_report_with_its_next_claim(gw, runtime_id):
    """One task at a time: one request per task, where it took two (claim, then
    complete or fail)."""
    tasks = [await enqueue(gw, runtime_id, n) for n in range(6)]
    routes = ("/v1/runtimes/{rt}/claim", "/v1/tasks/{task_id}/complete", "/v1/tasks/{task_id}/fail")
    before = [requests_to(gw, route) for route in routes]

    async def handler(task: Task) -> Any:
        if task.payload == 3:
            raise TaskFailed("three is wrong", retry=False)
        return task.payload * 2

    async with AsyncClient(gw.url, TOKEN) as client:
        w = Worker(client, runtime_id, handler, WorkerOptions(wait_seconds=5, worker_id="w"))
        job = asyncio.create_task(w.run())
        await wait_until(lambda: sum(w.outcomes.values()) == len(tasks), 10, "every task reported")
        w.stop()
        await asyncio.wait_for(job, 10)
    assert w.outcomes == {Outcome.COMPLETED: 5, Outcome.FAILED: 1}
    claims, completes, fails = (requests_to(gw, r) - b for r, b in zip(routes, before, strict=True))
    # A claim per task, and the one that reported the last task; no report of its own.
    assert (claims, completes, fails) == (len(tasks) + 1, 0, 0)
    finished = [await get_task(gw, t["id"]) for t in tasks]
    assert [t["status"] for t in finished] == ["completed"] * 3 + ["dead"] + ["completed"] * 2
    assert [t.get("result") for t in finished] == [0, 2, 4, None, 8, 10]


@pytest.mark.parametrize("levels", [1024, 5000])
async def test_a_result_nested_past_the_parsers_is_422_naming_the_report(gw, runtime_id, levels):
    """As a batch names its item (test_hostile_bodies.py)."""
    (task,) = await claimed(gw, runtime_id, 1)
    deep = "[" * levels + "1" + "]" * levels
    report = f'{{"id": "{task["id"]}", "lease_id": "{task["lease_id"]}", "result": {deep}}}'
    raw = f'{{"worker_id": "w", "complete": [{report}]}}'.encode()
    resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/claim", raw=raw)
    assert resp.status == 422 and resp.body["field"] == "complete[0].result", resp.body
    assert await status(gw, task) == "claimed"
