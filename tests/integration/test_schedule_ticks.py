"""Exactly one task per schedule tick, over the real Postgres: two instances' tick passes
and backfills racing over the same due ticks, a pass retried with the ticks it had
decided, and a PUT or DELETE while a pass holds the schedule. The control drops the
tick key (schema and statement) and shows that the same race then makes duplicates.

Each test has a database of its own (`own_database_url`); "instances" are Stores on
pools of their own, as two gateway processes would hold them."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from gateway.api.schedule_bodies import parse_schedule
from gateway.metrics import Metrics
from gateway.rows import ScheduleRow, TickPlan
from gateway.schedules import plans, service
from gateway.settings import Settings
from gateway.store import Store
from gateway.store.sql import schedules as schedule_sql
from tests.faults.ticks import drop_tick_key, keyless_record_ticks
from tests.support.databases import execute, fetch
from tests.support.gateways import running_gateway
from tests.support.janitor import janitor_settings
from tests.support.metrics import sample
from tests.support.schedules import duplicates, instances, put
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

SCHEDULES = 8
BEHIND_SECONDS = 20  # each schedule's next tick this far back: that many ticks due


async def behind(url: str, seconds: float) -> None:
    """Every schedule's next tick moved `seconds` back: that many ticks come due."""
    await execute(
        url,
        "UPDATE schedules SET next_tick_at = date_trunc('second', now()) "
        "- make_interval(secs => $1)",
        seconds,
    )


async def race(url: str) -> dict[str, int]:
    """Two instances at once over the same due ticks: each runs tick passes (in batches
    of a few schedules) and backfills every schedule over the range the passes decide;
    then one replays a pass's ticks as a pass retried after its answer was lost would.
    Returns the counts the checks read."""
    async with instances(url) as (a, b):
        for n in range(SCHEDULES):
            await put(a, "rt", f"s{n}", every_seconds=1, overlap="allow", catch_up_seconds=3600)
        await behind(url, BEHIND_SECONDS)
        now = await a.now()
        body = {
            "start": (now - timedelta(seconds=BEHIND_SECONDS + 5)).isoformat(),
            "end": now.isoformat(),
        }
        decided: list[TickPlan] = []

        def recording(rows: list[ScheduleRow], at: datetime) -> TickPlan:
            plan = plans.due_plan(30)(rows, at)
            decided.append(plan)
            return plan

        async def passes(store: Store) -> None:
            for _ in range(4):
                await store.decide_due(3, recording)

        async def backfills(store: Store) -> None:
            for n in range(SCHEDULES):
                start = datetime.fromisoformat(body["start"])
                end = datetime.fromisoformat(body["end"])
                await store.decide_one(
                    "rt", f"s{n}", plans.backfill_plan(start, end), "backfill", upgrade=True
                )

        await asyncio.gather(passes(a), passes(b), backfills(a), backfills(b))
        # A pass retried after its answer was lost decides the same ticks again (each
        # with a new task id, as a new plan draws them): its schedules due again.
        await behind(url, BEHIND_SECONDS)
        first = decided[0]
        again = TickPlan(
            [replace(t, task_id=uuid.uuid4()) if t.task_id else t for t in first.ticks]
        )
        await a.decide_due(SCHEDULES, lambda rows, at: again)
    tasks = await fetch(url, "SELECT count(*) AS n FROM tasks")
    enqueued = await fetch(
        url, "SELECT count(*) AS n FROM schedule_ticks WHERE outcome = 'enqueued'"
    )
    return {
        "tasks": int(tasks[0]["n"]),
        "enqueued": int(enqueued[0]["n"]),
        "duplicates": await duplicates(url),
        "replayed": sum(1 for t in first.ticks if t.outcome == "enqueued"),
    }


async def test_racing_instances_make_exactly_one_task_per_tick(own_database_url: str) -> None:
    counts = await race(own_database_url)
    assert counts["replayed"] > 0, counts
    assert counts["duplicates"] == 0, counts
    # Every enqueued tick has its task, and every task its tick.
    assert counts["tasks"] == counts["enqueued"] >= SCHEDULES * BEHIND_SECONDS, counts
    missing = await fetch(
        own_database_url,
        "SELECT k.* FROM schedule_ticks k LEFT JOIN tasks t ON t.id = k.task_id "
        "WHERE k.outcome = 'enqueued' AND t.id IS NULL",
    )
    assert missing == []


async def test_control_without_the_tick_key_the_same_race_makes_duplicates(
    own_database_url: str, monkeypatch: Any
) -> None:
    """The check above can fail: with the key dropped from the table and its conflict
    clause from the statement, the racing backfills and the retried pass each make a
    second task for ticks already enqueued."""
    await drop_tick_key(own_database_url)
    monkeypatch.setattr(schedule_sql, "RECORD_TICKS", keyless_record_ticks())
    counts = await race(own_database_url)
    assert counts["duplicates"] > 0, counts


async def waiting_for_locks(conn: asyncpg.Connection, count: int) -> None:
    """Until `count` backends of this database wait for a lock."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    for _ in range(1000):
        if await conn.fetchval(query) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} backends never waited for a lock")


@dataclass
class Held:
    """The tick record locked by a connection of its own (see ticks_held)."""

    blocker: asyncpg.Connection
    tx: Any

    async def waiting(self, count: int) -> None:
        """Until `count` backends wait for a lock."""
        await waiting_for_locks(self.blocker, count)

    async def release(self) -> None:
        await self.tx.rollback()


@contextlib.asynccontextmanager
async def ticks_held(url: str) -> AsyncIterator[Held]:
    """schedule_ticks locked (SHARE) until release(): a transaction that records ticks
    (a pass, a trigger, a backfill) waits at its write, holding the schedules it locked."""
    blocker = await asyncpg.connect(url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE schedule_ticks IN SHARE MODE")
        yield Held(blocker, tx)
    finally:
        await blocker.close()


@pytest.mark.parametrize("change", ["put", "delete"])
async def test_a_put_or_delete_mid_pass_waits_and_then_nothing_old_is_made(
    own_database_url: str, change: str
) -> None:
    """A pass holds the schedule (its ticks' write made to wait on a table lock); a PUT
    or DELETE of it waits for the pass's commit. Once it has answered, no task of the
    old definition is made: the next passes make the new one's, or nothing."""
    url = own_database_url
    async with instances(url) as (a, b):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await behind(url, 3)  # four ticks due, five if a second begins before the pass
        async with ticks_held(url) as held:
            passing = asyncio.create_task(a.decide_due(10, plans.due_plan(30)))
            await held.waiting(1)  # the pass, at its ticks' write
            if change == "put":
                changing: asyncio.Task[Any] = asyncio.create_task(
                    put(b, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 2})
                )
            else:
                changing = asyncio.create_task(b.delete_schedule("rt", "s"))
            await held.waiting(2)  # the change, at the schedule's row
            assert not changing.done()
            await held.release()
            decided, _, _ = await passing
            await changing
        outcomes = [t.outcome for t in decided]
        assert outcomes in (["enqueued"] * 4, ["enqueued"] * 5), outcomes
        answered = (await fetch(url, "SELECT clock_timestamp() AS t"))[0]["t"]
        # The next tick comes due within a second; the passes after it decide it.
        for _ in range(300):
            later, _, _ = await a.decide_due(10, plans.due_plan(30))
            if later or change == "delete":
                break
            await asyncio.sleep(0.01)
    made = await fetch(url, "SELECT payload::text AS p, created_at FROM tasks ORDER BY created_at")
    old = [r for r in made if r["p"] == '{"v": 1}']
    assert len(old) == len(outcomes) and all(r["created_at"] < answered for r in old)
    new = [r for r in made if r["p"] == '{"v": 2}']
    assert (len(new) > 0) == (change == "put"), made


async def test_ticks_computed_from_a_replaced_definition_make_no_task(
    own_database_url: str,
) -> None:
    """The version join: ticks decided from a definition that was replaced since (a
    stale plan) are dropped, with no record and no task."""
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await behind(url, 3)
        row = await a.get_schedule("rt", "s")
        assert row is not None
        stale = plans.due_plan(30)([row], await a.now())
        assert stale.ticks and {t.version for t in stale.ticks} == {1}
        replaced = await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 2})
        assert replaced.version == 2
        decided, _, due = await a.decide_due(10, lambda rows, at: stale)
    assert due == 1 and decided == []
    assert await fetch(url, "SELECT * FROM tasks") == []


async def test_the_leaders_loop_enqueues_and_wakes_a_parked_claim(
    own_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    """End to end on a running gateway: its tick pass (on the janitor's leader) makes an
    every-second schedule's task, and the bump after the commit hands it to a claim
    parked on the runtime."""
    settings = janitor_settings(own_database_url, redis_url, redis_prefix)
    async with running_gateway(settings) as gw:
        await wait_until(lambda: gw.gateway.janitor.is_leader, 5.0, "the janitor to lead")
        status, body = await gw.call(
            "PUT",
            "/v1/runtimes/rt/schedules/every",
            {"every_seconds": 1, "payload": {"tick": True}},
        )
        assert status == 201, body
        [task] = await gw.claim("rt", wait_seconds=10)
        assert task["schedule"] == "every" and task["payload"] == {"tick": True}
        assert datetime.fromisoformat(task["scheduled_for"]).microsecond == 0


async def test_the_janitor_deletes_ticks_older_than_the_record_keeps(
    own_database_url: str,
) -> None:
    url = own_database_url
    async with instances(url, 1) as (a,):
        row = await put(a, "rt", "s", every_seconds=60)
        await execute(
            url,
            "INSERT INTO schedule_ticks (schedule_id, tick_at, outcome, version, source) "
            "SELECT $1, now() - make_interval(days => d), 'skipped_late', 1, 'schedule' "
            "FROM generate_series(1, 40) AS d WHERE d <> 30",
            row.id,
        )
        assert await a.purge_ticks(30, 4) == 4  # a batch, oldest first
        assert await a.purge_ticks(30, 100) == 6
        assert await a.purge_ticks(30, 100) == 0
    left = await fetch(
        url, "SELECT min(tick_at) > now() - interval '31 days' AS ok FROM schedule_ticks"
    )
    assert left[0]["ok"]


async def test_a_pass_runs_batches_at_once_and_stops_at_its_bound(
    own_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a full first batch, batches run BATCHES_AT_ONCE at a time on connections of
    their own: each takes schedules of its own (no tick twice), and the pass takes no
    more than MAX_BATCHES_PER_PASS batches; the next pass takes what is left."""
    monkeypatch.setattr(service, "BATCH_SCHEDULES", 3)
    monkeypatch.setattr(service, "MAX_BATCHES_PER_PASS", 4)
    url = own_database_url
    bumped: list[str] = []

    async def announce(runtime_ids: Sequence[str]) -> None:
        bumped.extend(runtime_ids)

    async with instances(url, 1) as (a,):
        for n in range(20):
            await put(a, f"rt{n % 5}", f"s{n}", every_seconds=3600, overlap="allow")
        await behind(url, 1)
        settings = Settings(database_url=url)
        metrics = Metrics()
        scheduler = service.Scheduler(a, announce, settings, metrics, leading=lambda: True)
        first = await scheduler.run_once()
        assert first.schedules == 12 and first.count("enqueued") == 12
        assert sorted(set(bumped)) == [f"rt{n}" for n in range(5)]
        second = await scheduler.run_once()
        assert second.schedules == 8 and second.count("enqueued") == 8
        assert (await scheduler.run_once()).schedules == 0
    # Two passes found schedules due; the empty third is not counted.
    assert sample(metrics, "gateway_schedule_pass_seconds_count") == 2
    assert await duplicates(url) == 0
    assert len(await fetch(url, "SELECT 1 FROM tasks")) == 20


@pytest.mark.parametrize("change", ["pause", "put"])
async def test_a_change_first_decides_the_ticks_that_came_due_before_it(
    own_database_url: str, change: str
) -> None:
    """Ticks that came due before a pause or a PUT and that no pass has decided yet (the
    change landed between a tick and its pass, or no leader ran) are decided in the
    change's transaction, under the definition they came due in: none goes
    unrecorded, and none is made from the new definition."""
    url = own_database_url
    async with instances(url, 1) as (a,):
        await put(a, "rt", "s", every_seconds=1, overlap="allow", payload={"v": 1})
        await behind(url, 3)  # four ticks due, none decided
        settle = plans.due_plan(30)
        if change == "pause":
            written = await a.write_schedule(
                "rt", "s", plans.pause_write(True, "quiet"), create=False, settle=settle
            )
        else:
            definition = parse_schedule(
                {"every_seconds": 7, "overlap": "allow", "payload": {"v": 2}}, 1_000_000, 64
            )
            written = await a.write_schedule(
                "rt",
                "s",
                lambda current, now: plans.put_write(definition, current, now),
                settle=settle,
            )
        answered = await a.now()
    # Four ticks were due, and a fifth if a second began before the change ran: every
    # one from the first due to the change's instant, each a second after the one
    # before, all enqueued from the old definition.
    outcomes = [t.outcome for t in written.decided]
    assert outcomes in (["enqueued"] * 4, ["enqueued"] * 5), outcomes
    made = await fetch(url, "SELECT payload->>'v' AS v, scheduled_for FROM tasks")
    assert sorted(r["v"] for r in made) == ["1"] * len(outcomes)
    assert all(r["scheduled_for"] <= answered for r in made)
    ticks = [
        r["tick_at"] for r in await fetch(url, "SELECT tick_at FROM schedule_ticks ORDER BY 1")
    ]
    assert len(ticks) == len(outcomes) and await duplicates(url) == 0
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize("overlap", ["skip", "cancel_previous"])
async def test_a_trigger_that_waited_for_a_pass_sees_the_task_the_pass_made(
    own_database_url: str, overlap: str
) -> None:
    """A trigger at a tick's instant waits for the pass holding the schedule (its ticks'
    write made to wait on a table lock), which enqueues the tick's task. The trigger then
    applies its overlap policy to that task, still queued: skip skips, cancel_previous
    cancels it. Read in the statement that waited for the lock, the task was not yet
    visible (its snapshot predates the pass's commit) and looked finished."""
    url = own_database_url
    async with instances(url) as (a, b):
        await put(a, "rt", "s", every_seconds=3600, overlap=overlap)
        await behind(url, 0)
        async with ticks_held(url) as held:
            passing = asyncio.create_task(a.decide_due(10, plans.due_plan(30)))
            await held.waiting(1)  # the pass, at its ticks' write
            triggering = asyncio.create_task(
                b.decide_one("rt", "s", plans.trigger_plan(), "trigger")
            )
            await held.waiting(2)  # the trigger, at the schedule's row
            await held.release()
            passed, _, _ = await passing
            _, triggered, cancelled = await triggering
    [made] = passed
    assert made.outcome == "enqueued"
    [tick] = triggered
    if overlap == "skip":
        assert tick.outcome == "skipped_overlap"
    else:
        assert tick.outcome == "enqueued" and cancelled == [(made.task_id, "cancelled")]
    live = await fetch(url, "SELECT id FROM tasks WHERE status IN ('queued', 'scheduled')")
    assert len(live) == 1, live


async def test_a_put_that_waited_for_a_backfill_decides_the_tick_that_came_meanwhile(
    own_database_url: str,
) -> None:
    """A PUT that changes the timing waits for a backfill holding the schedule (which
    writes no schedule row), and a tick of the old timing comes due meanwhile. The PUT
    decides that tick first: its clock is read once it holds the row. Read in the
    statement that waited, the clock was from before the wait, the tick looked still
    to come, and the new timing passed over it: a tick due, never recorded."""
    url = own_database_url
    async with instances(url) as (a, b):
        row = await put(a, "rt", "s", every_seconds=1, overlap="skip")
        created = await a.now()
        async with ticks_held(url) as held:
            past = plans.backfill_plan(
                created - timedelta(seconds=10), created - timedelta(seconds=5)
            )
            backfilling = asyncio.create_task(a.decide_one("rt", "s", past, "backfill"))
            await held.waiting(1)  # the backfill, at its ticks' write
            definition = parse_schedule(
                {"every_seconds": 3600, "overlap": "skip", "payload": {"from": "s"}}, 1_000_000, 64
            )
            changing = asyncio.create_task(
                b.write_schedule(
                    "rt",
                    "s",
                    lambda current, now: plans.put_write(definition, current, now),
                    settle=plans.due_plan(30),
                )
            )
            await held.waiting(2)  # the PUT, at the schedule's row
            # The old timing's next tick comes due while both wait.
            wait = (row.next_tick_at - await a.now()).total_seconds() + 0.1
            await asyncio.sleep(max(wait, 0.0))
            await held.release()
            await backfilling
            written = await changing
    assert written.row.every_seconds == 3600
    ticks = await fetch(url, "SELECT tick_at, source FROM schedule_ticks WHERE source = 'schedule'")
    assert [t["tick_at"] for t in ticks] == [row.next_tick_at], ticks
