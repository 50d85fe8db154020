"""Waiting for a task's result (GET /v1/tasks/{id}?wait_seconds, gateway/claim/results.py):
woken once by the request (or the janitor's pass) that finishes the task, through
Redis pub/sub, with no Postgres read while it waits; bounded by
GATEWAY_MAX_PARKED_POLLS; answered at once on drain; ended by a client that leaves."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis

from gateway.api import render
from gateway.claim.results import done_channel
from gateway.errors import CacheUnavailable
from tests.support.databases import execute
from tests.support.gateways import (
    TOKEN,
    Instance,
    make_settings,
    running_gateway,
    serve_env,
    serve_process,
)
from tests.support.http import req, req_past_busy
from tests.support.janitor import first_pass_done, janitor_settings, wait_lapsed
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

LONG = 30  # a wait that must be cut short by a wake-up; the client's timeout is 60 s


def reads(inst: Instance) -> float:
    """Postgres reads made by waiting requests (the app's own counter)."""
    return sample(inst, "gateway_result_wait_reads_total")


def parked(inst: Instance) -> float:
    return sample(inst, "gateway_parked_polls")


async def wait_for_result(inst: Instance, task_id: str, wait_seconds: float = LONG) -> Any:
    # Many waits at once each read the task first: a refused read is asked again.
    resp = await req_past_busy(inst, "GET", f"/v1/tasks/{task_id}?wait_seconds={wait_seconds:g}")
    assert resp.status == 200, (resp.status, resp.body)
    return resp.body


async def waiting(inst: Instance, n: int) -> None:
    """Until n requests wait here and each has subscribed (its first read is done)."""
    results = inst.gateway.results
    await wait_until(lambda: results.waiting() >= n, 10, f"{n} waiting requests")
    await wait_until(lambda: reads(inst) >= n, 10, f"{n} first reads")


async def claim_one(inst: Instance, runtime_id: str, **fields: Any) -> dict[str, Any]:
    [task] = await inst.claim(runtime_id, **fields)
    return task


async def test_a_complete_wakes_the_waiter_which_read_nothing_while_it_waited(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, {"n": 1})
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        assert parked(gw) == 1
        before = reads(gw)
        # Longer than the degraded poll interval (1 s): a polling wait would read here.
        await asyncio.sleep(1.5)
        assert reads(gw) == before, "the wait read Postgres while nothing happened"
        claimed = await claim_one(gw, runtime_id)
        status, _ = await gw.complete(claimed, result={"answer": 42})
        assert status == 200
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "completed" and answer["result"] == {"answer": 42}
        assert reads(gw) == before + 1, "one read when woken"
        assert sample(gw, "gateway_result_publishes_total", outcome="ok") >= 1
        await wait_until(lambda: parked(gw) == 0, 5, "the parked gauge back to 0")


async def test_a_finished_task_is_answered_at_once_without_waiting(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        await gw.complete(await claim_one(gw, runtime_id), result="done")
        answer = await asyncio.wait_for(wait_for_result(gw, task["id"]), 5)
        assert answer["status"] == "completed" and answer["result"] == "done"
        assert reads(gw) == 0 and gw.gateway.results.waiting() == 0


async def test_a_wait_that_runs_out_answers_the_unfinished_task(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        answer = await wait_for_result(gw, task["id"], 0.3)
        assert answer["status"] == "queued" and answer["id"] == task["id"]
        claimed = await claim_one(gw, runtime_id)
        answer = await wait_for_result(gw, claimed["id"], 0.3)
        assert answer["status"] == "claimed" and answer["lease_id"] == claimed["lease_id"]
        assert parked(gw) == 0


async def test_a_lease_expiry_to_dead_by_the_janitor_wakes_the_waiter(
    own_database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(janitor_settings(own_database_url, redis_url, redis_prefix)) as gw:
        await first_pass_done(gw)
        task = await gw.enqueue(runtime_id, "x", max_attempts=1)
        await claim_one(gw, runtime_id, lease_seconds=60)
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        before = reads(gw)
        await execute(
            own_database_url,
            "UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1::uuid",
            task["id"],
        )
        await wait_lapsed(own_database_url, [task["id"]])
        report = await gw.gateway.janitor.run_once()
        assert report.reclaimed == 1, report
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "dead" and answer["last_error"] == "lease expired"
        assert reads(gw) == before + 1, "woken by the janitor's publish, not by polling"


async def test_an_expiry_ends_the_wait_at_the_tasks_expires_at(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Expiry publishes nothing: the wait sleeps until expires_at, then reads once."""
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x", ttl_seconds=1)
        answer = await asyncio.wait_for(wait_for_result(gw, task["id"]), 10)
        assert answer["status"] == "expired"


@pytest.mark.parametrize("how", ["batch complete", "batch fail", "fail", "cancel", "release"])
async def test_every_way_a_request_finishes_a_task_wakes_its_waiter(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, how: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        if how == "cancel":
            waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
            await waiting(gw, 1)
            status, _ = await gw.call("POST", f"/v1/tasks/{task['id']}/cancel")
            expected = "cancelled"
        else:
            claimed = await claim_one(gw, runtime_id)
            waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
            await waiting(gw, 1)
            item = {"id": claimed["id"], "lease_id": claimed["lease_id"]}
            lease = {"lease_id": claimed["lease_id"]}
            if how == "batch complete":
                status, body = await gw.call("POST", "/v1/tasks:complete", {"tasks": [item]})
                expected = "completed"
            elif how == "batch fail":
                failing = {**item, "error": "boom", "retry": False}
                status, body = await gw.call("POST", "/v1/tasks:fail", {"tasks": [failing]})
                expected = "dead"
            elif how == "fail":
                body = {**lease, "error": "boom", "retry": False}
                status, _ = await gw.call("POST", f"/v1/tasks/{task['id']}/fail", body)
                expected = "dead"
            else:  # a release after a cancel was requested ends it cancelled
                await gw.call("POST", f"/v1/tasks/{task['id']}/cancel")
                status, _ = await gw.call("POST", f"/v1/tasks/{task['id']}/release", lease)
                expected = "cancelled"
        assert status == 200
        before = reads(gw)
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == expected
        assert reads(gw) <= before + 1


async def test_a_retry_that_queues_the_task_again_does_not_end_the_wait(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        claimed = await claim_one(gw, runtime_id)
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        body = {"lease_id": claimed["lease_id"], "error": "flaky", "retry_after_seconds": 0}
        status, failed = await gw.call("POST", f"/v1/tasks/{task['id']}/fail", body)
        assert status == 200 and failed["status"] == "queued"
        await asyncio.sleep(0.3)
        assert not waiter.done(), "a task queued again is not finished"
        again = await claim_one(gw, runtime_id)
        await gw.complete(again, result="second try")
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "completed" and answer["attempts"] == 2


async def test_many_waiters_on_one_task_are_all_woken_by_one_complete(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with (
        running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw,
        redis.Redis.from_url(redis_url) as listener,
        listener.pubsub() as pubsub,
    ):
        task = await gw.enqueue(runtime_id, "x")
        # Counted on the task's own channel: the gateway's counter also counts the
        # finishes its janitor publishes for other tests' leftover tasks.
        await pubsub.subscribe(done_channel(redis_prefix, uuid.UUID(task["id"])))
        assert (await pubsub.get_message(timeout=5))["type"] == "subscribe"
        waiters = [asyncio.create_task(wait_for_result(gw, task["id"])) for _ in range(25)]
        await waiting(gw, 25)
        await gw.complete(await claim_one(gw, runtime_id), result="all of you")
        answers = await asyncio.wait_for(asyncio.gather(*waiters), 15)
        assert [a["status"] for a in answers] == ["completed"] * 25
        messages = []
        while (message := await pubsub.get_message(timeout=0.5)) is not None:
            messages.append(message)
        assert [m["data"] for m in messages] == [task["id"].encode()], "one publish per finish"
        await wait_until(lambda: parked(gw) == 0, 5, "the parked gauge back to 0")


async def test_a_waiter_on_another_instance_is_woken(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    settings = make_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as a, running_gateway(settings) as b:
        task = await a.enqueue(runtime_id, "x")
        waiter = asyncio.create_task(wait_for_result(a, task["id"]))
        await waiting(a, 1)
        await b.complete(await claim_one(b, runtime_id), result="from b")
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["result"] == "from b"


async def test_waits_count_against_the_parked_limit(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, max_parked_polls=2)
    async with running_gateway(cfg) as gw:
        task = await gw.enqueue(runtime_id, "x")
        claim = asyncio.create_task(gw.claim(f"{runtime_id}-other", wait_seconds=LONG))
        await wait_until(lambda: parked(gw) == 1, 10, "a parked claim")
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        resp = await req(gw, "GET", f"/v1/tasks/{task['id']}?wait_seconds=5")
        assert resp.status == 429, resp.body
        assert (
            resp.body["code"] == "overloaded" and "GATEWAY_MAX_PARKED_POLLS" in resp.body["detail"]
        )
        assert int(resp.headers["Retry-After"]) >= 1
        # A claim that would park is refused too, now that a result wait holds a place.
        status, body = await gw.call(
            "POST", f"/v1/runtimes/{runtime_id}-third/claim", {"worker_id": "w", "wait_seconds": 5}
        )
        assert status == 429, body
        # Without a wait, the task is answered as usual.
        status, body = await gw.call("GET", f"/v1/tasks/{task['id']}")
        assert status == 200 and body["status"] == "queued"
        gw.gateway.claimer.drain()
        assert (await asyncio.wait_for(waiter, 5))["status"] == "queued"
        assert await asyncio.wait_for(claim, 5) == []


async def test_a_client_that_leaves_ends_its_wait(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, max_parked_polls=1)
    async with running_gateway(cfg) as gw:
        task = await gw.enqueue(runtime_id, "x")
        subscriber = gw.gateway.subscriber
        channel = done_channel(gw.gateway.settings.redis_prefix, uuid.UUID(task["id"]))

        async def get_and_leave() -> None:
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{gw.url}/v1/tasks/{task['id']}?wait_seconds={LONG}",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ),
            ):
                pytest.fail("the wait was answered")

        leaving = asyncio.create_task(get_and_leave())
        await waiting(gw, 1)
        assert subscriber.confirmed(channel)
        leaving.cancel()  # closes the connection
        with contextlib.suppress(asyncio.CancelledError):
            await leaving
        await wait_until(lambda: gw.gateway.results.waiting() == 0, 5, "the wait to end")
        await wait_until(lambda: parked(gw) == 0, 5, "the parked gauge back to 0")
        assert not subscriber.confirmed(channel), "the task's channel is still wanted"
        # Its place under GATEWAY_MAX_PARKED_POLLS (1 here) was given back.
        assert (await wait_for_result(gw, task["id"], 0.2))["status"] == "queued"


async def test_a_drain_answers_every_wait_at_once(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        waiters = [asyncio.create_task(wait_for_result(gw, task["id"])) for _ in range(3)]
        await waiting(gw, 3)
        gw.gateway.claimer.drain()  # what SIGTERM calls
        answers = await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert [a["status"] for a in answers] == ["queued"] * 3
        # Once draining, a new wait answers at once.
        answer = await asyncio.wait_for(wait_for_result(gw, task["id"]), 5)
        assert answer["status"] == "queued"


async def test_a_foreign_task_is_not_found_and_bad_waits_are_refused(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, "x")
        status, minted = await gw.call(
            "POST",
            "/v1/admin/tokens",
            {"name": f"{runtime_id}-reader", "scopes": ["read"], "runtimes": ["elsewhere-*"]},
        )
        assert status == 201, minted
        path = f"/v1/tasks/{task['id']}?wait_seconds=5"
        resp = await req(gw, "GET", path, auth=minted["token"])
        assert resp.status == 404 and resp.body["code"] == "not_found", resp.body
        for bad in ("-1", "60.5", "abc", "nan", "inf", "1e999"):
            resp = await req(gw, "GET", f"/v1/tasks/{task['id']}?wait_seconds={bad}")
            assert resp.status == 422, (bad, resp.body)
            assert resp.body["field"] == "wait_seconds", (bad, resp.body)
        resp = await req(gw, "GET", f"/v1/tasks/{task['id']}?wait_seconds=0")
        assert resp.status == 200 and resp.body["status"] == "queued"
        assert gw.gateway.results.waiting() == 0 and reads(gw) == 0


async def test_a_lost_publish_is_found_by_the_fallback_read_while_redis_is_unhealthy(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    """While Redis fails (here: its publishes), a wait re-reads the task once per
    degraded poll interval, so a finish whose wake-up was lost still ends it."""
    cfg = make_settings(database_url, redis_url, redis_prefix, degraded_poll_seconds=0.2)
    async with running_gateway(cfg) as gw:
        task = await gw.enqueue(runtime_id, "x")
        claimed = await claim_one(gw, runtime_id)
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        cache = gw.gateway.cache

        lost: list[str] = []

        async def failing_publish(messages: list[tuple[str, str]]) -> None:
            lost.extend(message for _, message in messages)
            cache.breaker.record_failure()  # what a failed Redis call does
            gw.gateway.results.redis_trouble()
            raise CacheUnavailable("Redis result publish failed: test")

        monkeypatch.setattr(cache, "publish", failing_publish)
        status, _ = await gw.complete(claimed, result="late")
        assert status == 200
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "completed"
        assert task["id"] in lost
        # Every lost wake-up is counted (the janitor may have finished others' tasks).
        assert sample(gw, "gateway_result_publishes_total", outcome="error") == len(lost)


async def test_a_complete_never_waits_for_the_result_publish(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    """The publish goes out in the background: a complete is answered while Redis has
    not answered the publish yet, and finishes made meanwhile go out together."""
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        first, second = await gw.enqueue(runtime_id, 1), await gw.enqueue(runtime_id, 2)
        a, b = await gw.claim(runtime_id, max_tasks=2)
        waiter = asyncio.create_task(wait_for_result(gw, second["id"]))
        await waiting(gw, 1)
        cache = gw.gateway.cache
        publish = cache.publish
        release = asyncio.Event()
        batches: list[list[tuple[str, str]]] = []

        async def held_publish(messages: list[tuple[str, str]]) -> None:
            batches.append(list(messages))
            await release.wait()
            await publish(messages)

        monkeypatch.setattr(cache, "publish", held_publish)
        assert (await gw.complete(a))[0] == 200  # answered while its publish is held
        assert (await gw.complete(b))[0] == 200
        assert len(batches) == 1 and not waiter.done()
        release.set()
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "completed"
        assert [len(batch) for batch in batches] == [1, 1]
        assert {m for batch in batches for _, m in batch} == {first["id"], second["id"]}


async def test_a_finish_during_a_redis_outage_reaches_the_wait(
    database_url: str, redis_process: Any, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    """A waits; Redis dies; the task is completed through B (its publish is lost);
    Redis comes back. The wait finds the finish long before its 30 s run out: by its
    fallback reads while A's subscription is down, or by the re-read every wait makes
    once the subscription is restored (I5, I8)."""
    cfg = make_settings(
        database_url, redis_process.url, redis_prefix, redis_timeout_ms=100,
        degraded_poll_seconds=3,
    )  # fmt: skip
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        task = await a.enqueue(runtime_id, "x")
        claimed = await claim_one(b, runtime_id)
        waiter = asyncio.create_task(wait_for_result(a, task["id"]))
        await waiting(a, 1)
        publish, lost = b.gateway.cache.publish, []

        async def recorded_publish(messages: list[tuple[str, str]]) -> None:
            try:
                await publish(messages)
            except CacheUnavailable:
                lost.extend(message for _, message in messages)
                raise

        monkeypatch.setattr(b.gateway.cache, "publish", recorded_publish)
        redis_process.kill()
        await wait_until(lambda: not a.gateway.subscriber.healthy, 3, "subscriber to notice")
        assert (await b.complete(claimed, result="in the dark"))[0] == 200
        await wait_until(lambda: task["id"] in lost, 5, "the lost publish")
        redis_process.start()
        answer = await asyncio.wait_for(waiter, 15)
        assert answer["status"] == "completed" and answer["result"] == "in the dark"


async def test_sigterm_to_gateway_serve_answers_a_waiting_request_at_once(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    env = serve_env(database_url, redis_url, redis_prefix)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with serve_process(env=env) as (proc, base), aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/runtimes/{runtime_id}/tasks", json={"payload": 1}, headers=auth
        ) as resp:
            task = await resp.json()

        async def wait() -> tuple[int, Any]:
            async with http.get(f"{base}/v1/tasks/{task['id']}?wait_seconds=50", headers=auth) as r:
                return r.status, await r.json()

        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0.5)
        assert not waiter.done()
        proc.send_signal(signal.SIGTERM)
        status, answer = await asyncio.wait_for(waiter, 5)  # not the 50 s of its wait
        assert status == 200 and answer["status"] == "queued"
        assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_claimed_task_ended_dead_because_it_cannot_be_shown_wakes_its_waiter(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        task = await gw.enqueue(runtime_id, {"poison": True})
        waiter = asyncio.create_task(wait_for_result(gw, task["id"]))
        await waiting(gw, 1)
        before = reads(gw)
        real = render.task_bytes

        def broken(row: Any) -> bytes:
            if row.status == "claimed":
                raise ValueError("this row cannot be written")
            return real(row)

        monkeypatch.setattr(render, "task_bytes", broken)
        assert await gw.claim(runtime_id) == []
        answer = await asyncio.wait_for(waiter, 10)
        assert answer["status"] == "dead" and "could not turn" in answer["last_error"]
        assert reads(gw) == before + 1
