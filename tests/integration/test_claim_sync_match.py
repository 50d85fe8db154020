"""Sync match (GATEWAY_SYNC_MATCH): an enqueue on an instance with polls parked for its
runtime writes the task already leased to the oldest one, in the enqueue's own
statement, with no claim statement and no bump. Every claim invariant holds: each task
reaches one poll, a poll that left gets nothing and its task goes back to the queue,
and any doubt (controls, a pending wake-up, the setting off) takes the usual path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import StoreUnavailable
from tests.support.claims import (
    cancel_all,
    pg_claims,
    poll,
    task_rows,
    wait_parked,
)
from tests.support.gateways import make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.stores import holding
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

TTL = 30  # a verdict outliving every test: only a wake-up or a match answers a poll


def matches(inst: Any, outcome: str = "handed") -> float:
    return sample(inst, "gateway_sync_matches_total", outcome=outcome)


async def test_an_enqueue_hands_its_task_to_the_oldest_parked_poll_without_a_claim(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as gw:
        oldest = asyncio.create_task(poll(gw, runtime_id, "oldest", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        newer = asyncio.create_task(poll(gw, runtime_id, "newer", wait_seconds=10))
        await wait_parked(gw, runtime_id, 2)
        claims = pg_claims(gw)
        task = await gw.enqueue(runtime_id, {"n": 1})
        # The producer sees the task as enqueued: no lease of the poll's in its answer.
        assert task["status"] == "queued" and task["attempts"] == 0 and "lease_id" not in task
        answer = await asyncio.wait_for(oldest, 5)
        [got] = answer.tasks
        assert got["id"] == task["id"] and got["worker_id"] == "oldest"
        assert got["status"] == "claimed" and got["attempts"] == 1
        assert pg_claims(gw) == claims, "a claim statement ran"
        assert matches(gw) == 1
        assert not newer.done()
        status, body = await gw.complete(got, result={"ok": True})
        assert status == 200, body
        await cancel_all([newer])


async def test_concurrent_enqueues_and_polls_each_task_reaches_exactly_one_poll(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """30 polls park, then 40 tasks are enqueued at once through the same instance,
    while the polls that got one come back for more: every task is delivered once,
    leased to the worker that received it, and none is left leased to nobody."""
    # No load shedding: 40 enqueues at once beside 30 polls can outlast the line's
    # 250 ms on a slow machine, and this test is about who gets each task (shedding has
    # tests of its own: test_db_admission).
    cfg = make_settings(
        database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL, db_queue_budget_ms=600_000
    )
    async with running_gateway(cfg) as gw:
        received: dict[str, str] = {}
        duplicates: list[str] = []

        async def worker(name: str) -> None:
            while True:
                answer = await poll(gw, runtime_id, name, wait_seconds=10)
                for t in answer.tasks:
                    if t["id"] in received:
                        duplicates.append(t["id"])
                    received[t["id"]] = name
                    assert t["worker_id"] == name

        workers = [asyncio.create_task(worker(f"w{i}")) for i in range(30)]
        await wait_parked(gw, runtime_id, 30)
        tasks = await asyncio.gather(*(gw.enqueue(runtime_id, {"n": i}) for i in range(40)))
        await wait_until(lambda: len(received) == 40, 10, "every task delivered")
        await cancel_all(workers)
        assert duplicates == []
        assert set(received) == {t["id"] for t in tasks}
        assert matches(gw) >= 1
        rows = await task_rows(database_url, runtime_id)
        assert len(rows) == 40 and all(r["status"] == "claimed" for r in rows), rows
        assert len({r["lease_id"] for r in rows}) == 40


async def test_a_poll_that_left_during_the_enqueue_gets_nothing_and_the_task_goes_back(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as gw:
        store = gw.gateway.store
        original = store.enqueue
        written = asyncio.Event()

        async def slow_enqueue(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)  # the row is written leased now
            written.set()
            await asyncio.sleep(0.5)  # ...while the poll's client hangs up
            return result

        leaver = asyncio.create_task(poll(gw, runtime_id, "leaver", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        monkeypatch.setattr(store, "enqueue", slow_enqueue)
        enqueue = asyncio.create_task(gw.enqueue(runtime_id, {"n": 1}))
        await asyncio.wait_for(written.wait(), 5)
        [row] = await task_rows(database_url, runtime_id)
        assert row["status"] == "claimed"  # leased to the poll that is about to leave
        await cancel_all([leaver])
        task = await asyncio.wait_for(enqueue, 5)
        monkeypatch.setattr(store, "enqueue", original)
        await wait_until(lambda: matches(gw, "given_back") == 1, 5, "the lease given back")
        [row] = await task_rows(database_url, runtime_id)
        assert row["status"] == "queued" and row["attempts"] == 0 and row["lease_id"] is None
        assert matches(gw) == 0
        [again] = await gw.claim(runtime_id, "stayer", wait_seconds=2)
        assert again["id"] == task["id"] and again["attempts"] == 1


async def test_with_the_setting_off_an_enqueue_wakes_the_poll_through_a_claim(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(
        database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL, sync_match_enabled=False
    )
    async with running_gateway(cfg) as gw:
        waiting = asyncio.create_task(poll(gw, runtime_id, "w", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        claims = pg_claims(gw)
        task = await gw.enqueue(runtime_id, {"n": 1})
        [got] = (await asyncio.wait_for(waiting, 5)).tasks
        assert got["id"] == task["id"]
        assert pg_claims(gw) > claims and matches(gw) == 0


async def test_a_runtime_with_a_concurrency_limit_takes_the_usual_path(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as gw:
        status, body = await gw.call(
            "PATCH", f"/v1/runtimes/{runtime_id}/controls", {"max_in_flight": 5}
        )
        assert status == 200, body
        await wait_until(
            lambda: gw.gateway.controls.limited(runtime_id), 5, "the limit seen by the claimer"
        )
        waiting = asyncio.create_task(poll(gw, runtime_id, "w", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        task = await gw.enqueue(runtime_id, {"n": 1})
        [got] = (await asyncio.wait_for(waiting, 5)).tasks
        assert got["id"] == task["id"]
        assert matches(gw) == 0


async def test_a_delayed_task_is_not_handed_to_a_parked_poll(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as gw:
        waiting = asyncio.create_task(poll(gw, runtime_id, "w", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        await gw.enqueue(runtime_id, {"n": 1}, delay_seconds=60)
        [row] = await task_rows(database_url, runtime_id)
        assert row["status"] == "scheduled" and matches(gw) == 0
        assert not waiting.done()
        await cancel_all([waiting])


async def test_an_enqueue_whose_answer_was_lost_gives_its_task_back(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str, monkeypatch
) -> None:
    """The insert of a matched task commits, but its answer is lost (a dropped
    connection, a timeout after the commit): the producer gets 503, and the task must
    not wait out a lease its poll was never handed. It goes back to the queue, with its
    bump, and a poll gets it as a first attempt (max_attempts 1: not buried unrun)."""
    cfg = make_settings(database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL)
    async with running_gateway(cfg) as gw:
        store = gw.gateway.store
        real_run = store._run
        calls = 0

        async def answer_lost(fn: Any) -> Any:
            # Only the enqueue's own statement: the janitor and the pumps share the store.
            nonlocal calls
            out = await real_run(fn)
            if fn.__qualname__ == "TaskStatements.enqueue.<locals>.go":
                calls += 1
                if calls == 1:
                    raise StoreUnavailable("the connection dropped after the commit")
            return out

        parked = asyncio.create_task(poll(gw, runtime_id, "parked", wait_seconds=10))
        await wait_parked(gw, runtime_id, 1)
        monkeypatch.setattr(store, "_run", answer_lost)
        status, body = await gw.call(
            "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": {"n": 1}, "max_attempts": 1}
        )
        monkeypatch.setattr(store, "_run", real_run)
        assert status == 503, body
        answer = await asyncio.wait_for(parked, 5)
        [got] = answer.tasks
        assert got["status"] == "claimed" and got["attempts"] == 1
        [row] = await task_rows(database_url, runtime_id)
        assert row["status"] == "claimed" and row["attempts"] == 1
        assert matches(gw) == 0


async def test_no_match_while_every_connection_is_busy_so_the_poll_keeps_its_deadline(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """A reserved poll waits for its enqueue: with every pooled connection busy, that
    would be up to GATEWAY_DB_ACQUIRE_TIMEOUT_MS past its own wait_seconds. The match
    is skipped, so the poll is answered at its deadline."""
    cfg = make_settings(
        database_url,
        redis_url,
        redis_prefix,
        empty_ttl_seconds=TTL,
        db_pool_max=2,
        db_acquire_timeout_ms=4_000,
    )
    async with running_gateway(cfg) as gw:
        waiting = asyncio.create_task(poll(gw, runtime_id, "w", wait_seconds=1.0))
        await wait_parked(gw, runtime_id, 1)
        async with holding(gw.gateway.store, 2):
            enqueue = asyncio.create_task(
                gw.call("POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": {"n": 1}})
            )
            answer = await asyncio.wait_for(waiting, 10)
            # Its 1 s wait, not the 4 s the enqueue waits for a connection.
            assert answer.status == 200 and answer.body["tasks"] == []
            assert answer.elapsed < 2.5, answer.elapsed
            assert matches(gw) == 0
            status, body = await enqueue
            assert status == 503 and body["code"] == "database_busy", body
