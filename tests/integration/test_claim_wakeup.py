"""Wake-ups (I1, I8, I9): parked polls are answered by a bump from any instance, each
task goes to exactly one poll, parked polls leave Postgres alone, and one enqueue
costs one Postgres claim however many polls are parked."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.settings import Settings
from tests.support.claims import (
    Poll,
    cancel_all,
    pg_claims,
    poll,
    timed_enqueue,
    wait_parked,
    wait_quiet,
)
from tests.support.gateways import Instance, make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

# A verdict TTL far beyond every bound below: a lost wake-up cannot hide behind it.
TTL = 30


def wake_settings(database_url: str, redis_url: str, redis_prefix: str) -> Settings:
    """Redis calls get 2 s here, not the default 250 ms: on a loaded machine one slow
    call counts as Redis trouble, and a poll then answered by the fallbacks (the
    degraded poll, the janitor's repair) would pass for a late wake-up. The fail-open
    paths have tests of their own (test_claim_fail_open.py)."""
    return make_settings(
        database_url, redis_url, redis_prefix, empty_ttl_seconds=TTL, redis_timeout_ms=2000
    )


def bumps(inst: Instance) -> dict[str, float]:
    """This instance's version bumps by outcome: said when a wake-up came late."""
    return {o: sample(inst, "gateway_version_bumps_total", outcome=o) for o in ("ok", "error")}


async def test_poll_parked_on_one_instance_is_woken_by_an_enqueue_on_another(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    cfg = wake_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        for round_ in range(3):
            waiting = asyncio.create_task(poll(a, runtime_id, f"w{round_}", wait_seconds=10))
            await wait_parked(a, runtime_id, 1)
            assert a.gateway.subscriber.healthy
            task, sent = await timed_enqueue(b, runtime_id, {"round": round_})
            answer = await asyncio.wait_for(waiting, 3)
            assert [t["id"] for t in answer.tasks] == [task["id"]]
            late = answer.answered - sent
            assert late < 1.0, f"woken {late:.2f}s late; bumps of the enqueuer {bumps(b)}"
            status, body = await b.complete(answer.tasks[0])
            assert status == 200, body


async def test_twenty_parked_polls_twenty_tasks_each_to_one_poll(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """20 polls park on one runtime of one instance. While nothing comes, Postgres is
    not asked (the claim counter stays flat for 2 s). Then 20 tasks are enqueued one
    by one through a second instance: every poll is answered with exactly one task,
    each within 1 s of its enqueue, no task twice."""
    cfg = wake_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        polls = [
            asyncio.create_task(poll(a, runtime_id, f"w{i}", wait_seconds=10, max_tasks=1))
            for i in range(20)
        ]
        await wait_parked(a, runtime_id, 20)
        claims = pg_claims(a)
        await asyncio.sleep(2)
        assert pg_claims(a) == claims, "parked polls must not touch Postgres"
        assert a.gateway.claimer.parked(runtime_id) == 20
        assert not any(p.done() for p in polls)

        # Through the other instance: each task reaches instance A only by pub/sub.
        sent_at = {}
        for i in range(20):
            task, sent = await timed_enqueue(b, runtime_id, {"i": i})
            sent_at[task["id"]] = sent
        answers: list[Poll] = await asyncio.wait_for(asyncio.gather(*polls), 5)
        assert all(len(answer.tasks) == 1 for answer in answers), [a.tasks for a in answers]
        got = [answer.tasks[0]["id"] for answer in answers]
        assert sorted(got) == sorted(sent_at)
        late = {
            task_id: round(answer.answered - sent_at[task_id], 2)
            for answer, task_id in zip(answers, got, strict=True)
            if answer.answered - sent_at[task_id] > 1.0
        }
        assert late == {}, f"claimed more than 1 s after their enqueue; bumps {bumps(b)}"
        # One claim per enqueue at most, plus the ones that parked the polls.
        assert pg_claims(a) - claims <= 20
        await asyncio.gather(*(a.complete(t) for answer in answers for t in answer.tasks))


async def test_one_enqueue_one_postgres_claim_for_fifty_parked_polls(
    database_url: str, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Herd control (I9): 50 polls parked on one runtime; one enqueue through another
    instance wakes them all, but a single Postgres claim serves them and exactly one
    poll gets the task."""
    cfg = wake_settings(database_url, redis_url, redis_prefix)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        polls = [
            asyncio.create_task(poll(a, runtime_id, f"w{i}", wait_seconds=10, max_tasks=1))
            for i in range(50)
        ]
        try:
            await wait_parked(a, runtime_id, 50)
            claims = pg_claims(a)
            wakeups = sample(a, "gateway_wakeups_received_total")
            task, sent = await timed_enqueue(b, runtime_id, "one")
            done, _ = await asyncio.wait(polls, timeout=3, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, "the task should have reached a parked poll"
            [answer] = [p.result() for p in done]
            assert [t["id"] for t in answer.tasks] == [task["id"]]
            assert answer.answered - sent < 1.0
            assert sample(a, "gateway_wakeups_received_total") > wakeups, "woken by pub/sub"
            await wait_quiet(a)
            assert pg_claims(a) - claims <= 2, f"{pg_claims(a) - claims} claims for one task"
            assert sum(p.done() for p in polls) == 1
            assert a.gateway.claimer.parked(runtime_id) == 49
            status, body = await a.complete(answer.tasks[0])
            assert status == 200, body
        finally:
            await cancel_all(polls)
        # The polls that went away leave this process.
        started = time.monotonic()
        await wait_until(lambda: a.gateway.claimer.parked(runtime_id) == 0, 5, "polls to leave")
        assert time.monotonic() - started < 5
