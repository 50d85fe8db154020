"""The schedules class over a real run, with its tick key and without: two gateway
processes, the row's schedules ticking every second, and a backfill of one of them over
its last seconds every 0.2 s, through each gateway in turn, while the leader's tick
passes decide the same ticks. With the key, every due tick has one task or a recorded
skip. With the key dropped from the table and its conflict clause from the gateways'
statement (tests/faults/ticks.py), the same run makes a second task for a tick decided
twice, and the class must say so: a check that cannot fail checks nothing.

Tick passes alone would make no duplicate even without the key: a pass locks its due
schedules and moves their next tick in the same transaction, so a second pass finds
nothing due. A backfill decides ticks whatever the next tick says, which is the race
the key is for (docs/design.md, 5.3)."""

from __future__ import annotations

import asyncio

import pytest

from tests.faults.checker import ScheduleVerdict
from tests.faults.load import Load, LoadShape
from tests.faults.rig import rig
from tests.faults.ticks import row_schedules, settled_verdict

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TICKING_SECONDS = 3.0
BACKFILL_EVERY_SECONDS = 0.2


async def ticking(admin_url: str, *, tick_key: bool) -> ScheduleVerdict:
    """The run: schedules ticking and backfilled for TICKING_SECONDS (with a trickle
    of producers' tasks, which the load always sends), then the schedules class."""
    prefix = "keyed" if tick_key else "keyless"
    shape = LoadShape(
        runtimes=(f"{prefix}-0", f"{prefix}-sparse"),
        enqueue_rate=2.0,
        schedules=row_schedules(prefix),
        backfill_every_seconds=BACKFILL_EVERY_SECONDS,
    )
    async with rig(admin_url, tick_key=tick_key) as r:
        load = Load(r.urls, r.token, shape)
        await load.start()
        try:
            await asyncio.sleep(TICKING_SECONDS)
            await load.stop_producing()
        finally:
            await load.stop()
        assert load.backfills["answered 200"] > 0, load.backfills
        return await settled_verdict(r.database_url, load.first_ticks)


@pytest.mark.timeout(120)
async def test_with_the_tick_key_every_due_tick_has_one_task_or_a_skip(pg_admin_url: str) -> None:
    verdict = await ticking(pg_admin_url, tick_key=True)
    assert verdict.due > 0 and verdict.clean, verdict.problems()


@pytest.mark.timeout(120)
async def test_without_the_tick_key_the_schedules_class_reports_duplicates(
    pg_admin_url: str,
) -> None:
    verdict = await ticking(pg_admin_url, tick_key=False)
    assert verdict.duplicated, verdict.summary()
    assert not verdict.clean
