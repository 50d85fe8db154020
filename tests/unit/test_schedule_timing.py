"""When a schedule ticks (gateway/timing.py) and what a pass decides of its ticks
(gateway/schedules/plans.py): intervals on multiples since the epoch, crons of 5 and 6
fields, the two daylight-saving changes, the refusals, and the overlap and catch-up
policies, all on fixed instants."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.errors import ValidationFailed
from gateway.rows import ScheduleRow
from gateway.schedules import plans
from gateway.timing import Timing

NOW = datetime(2026, 6, 1, 12, 0, 0, 500_000, tzinfo=UTC)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def test_an_interval_ticks_on_multiples_since_the_epoch() -> None:
    minute = Timing(None, 60, "Europe/Paris")  # the zone does not move an interval
    assert minute.upcoming(utc(2026, 1, 1, 0, 0, 30), 2) == [
        utc(2026, 1, 1, 0, 1),
        utc(2026, 1, 1, 0, 2),
    ]
    # A tick is strictly after the instant given.
    assert minute.next_after(utc(2026, 1, 1, 0, 1)) == utc(2026, 1, 1, 0, 2)
    seven = Timing(None, 7, "UTC")
    tick = seven.next_after(NOW)
    assert tick is not None and int(tick.timestamp()) % 7 == 0 and tick > NOW


def test_a_six_field_cron_has_seconds_first() -> None:
    every_20s = Timing("*/20 * * * * *", None, "UTC")
    assert every_20s.upcoming(utc(2026, 1, 1, 0, 0, 5), 3) == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1, 0),
    ]
    five = Timing("30 9 * * 1-5", None, "UTC")  # 09:30 on weekdays
    assert five.next_after(utc(2026, 11, 27, 10)) == utc(2026, 11, 30, 9, 30)  # Fri -> Mon


def test_spring_forward_runs_a_missing_time_once_at_the_end_of_the_gap() -> None:
    # New York, 8 March 2026: 02:00 EST becomes 03:00 EDT (07:00 UTC); 02:30 never is.
    nightly = Timing("30 2 * * *", None, "America/New_York")
    assert nightly.upcoming(utc(2026, 3, 7, 12), 3) == [
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT, the first instant after the gap
        utc(2026, 3, 9, 6, 30),  # 02:30 EDT
        utc(2026, 3, 10, 6, 30),
    ]
    # Several ticks inside the gap run once, together.
    quarter = Timing("*/15 2 * * *", None, "America/New_York")
    ticks = quarter.ticks_between(utc(2026, 3, 8, 0), utc(2026, 3, 8, 12), 100)
    assert ticks == [utc(2026, 3, 8, 7, 0)]
    # With seconds, in Paris (29 March 2026, 02:00 CET becomes 03:00 CEST, 01:00 UTC).
    paris = Timing("15 30 2 * * *", None, "Europe/Paris")
    assert paris.next_after(utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1, 0)


def test_fall_back_runs_a_repeated_time_once() -> None:
    # New York, 1 November 2026: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
    nightly = Timing("30 1 * * *", None, "America/New_York")
    assert nightly.upcoming(utc(2026, 10, 31, 12), 2) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT, its first occurrence only
        utc(2026, 11, 2, 6, 30),  # 01:30 EST
    ]
    half_hourly = Timing("*/30 * * * *", None, "America/New_York")
    ticks = half_hourly.ticks_between(utc(2026, 11, 1, 4, 45), utc(2026, 11, 1, 7, 15), 100)
    # 01:00 and 01:30 EDT, then 02:00 EST: no tick in the repeated hour's second pass.
    assert ticks == [utc(2026, 11, 1, 5, 0), utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 0)]


@pytest.mark.parametrize(
    ("cron", "every", "zone", "field"),
    [
        ("0 0 30 2 *", None, "UTC", "cron"),  # never fires
        ("61 * * * *", None, "UTC", "cron"),
        ("* * *", None, "UTC", "cron"),
        ("* * * * * * *", None, "UTC", "cron"),
        ("0 3 * * *", None, "Mars/Olympus", "timezone"),
        ("0 3 * * *", None, "../etc/passwd", "timezone"),
        (None, None, "UTC", "cron"),
        ("0 3 * * *", 60, "UTC", "cron"),
    ],
)
def test_bad_timings_are_refused_naming_the_field(
    cron: str | None, every: int | None, zone: str, field: str
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        Timing.checked(cron, every, zone, NOW)
    assert caught.value.extra["field"] == field


def row(**over: Any) -> ScheduleRow:
    base = ScheduleRow(
        id=1,
        runtime_id="rt",
        name="s",
        version=3,
        cron=None,
        every_seconds=10,
        timezone="UTC",
        payload=None,
        priority=50,
        ttl_seconds=None,
        max_attempts=5,
        overlap="skip",
        catch_up_seconds=60.0,
        jitter_seconds=0.0,
        paused=False,
        note=None,
        next_tick_at=utc(2026, 6, 1, 11, 59, 10),
        last_tick_at=None,
        last_task_id=None,
        created_at=NOW,
        updated_at=NOW,
        last_task_status=None,
    )
    return replace(base, **over)


def decide(schedule: ScheduleRow) -> list[tuple[int, str]]:
    plan = plans.due_plan(30, random.Random(1))([schedule], NOW)
    assert all(t.version == schedule.version for t in plan.ticks)
    return [(t.tick_at.second + 60 * t.tick_at.minute, t.outcome) for t in plan.ticks]


def test_a_pass_decides_every_due_tick_and_moves_the_next_one_past_now() -> None:
    schedule = row(overlap="allow")
    plan = plans.due_plan(30)([schedule], NOW)
    assert [t.tick_at for t in plan.ticks] == [
        utc(2026, 6, 1, 11, 59, s) for s in range(10, 60, 10)
    ] + [utc(2026, 6, 1, 12, 0)]
    assert {t.outcome for t in plan.ticks} == {"enqueued"}
    assert plan.next_ticks == {1: utc(2026, 6, 1, 12, 0, 10)}


def test_ticks_older_than_catch_up_are_skipped_late() -> None:
    outcomes = decide(row(overlap="allow", catch_up_seconds=25))
    minute = 59 * 60
    assert outcomes[:3] == [(minute + s, "skipped_late") for s in (10, 20, 30)]
    assert [o for _, o in outcomes[3:]] == ["enqueued"] * 3


def test_overlap_skip_enqueues_one_and_skips_while_it_is_live() -> None:
    assert [o for _, o in decide(row())] == ["enqueued"] + ["skipped_overlap"] * 5
    assert {o for _, o in decide(row(last_task_status="claimed"))} == {"skipped_overlap"}
    after_done = decide(row(last_task_status="completed"))
    assert after_done[0][1] == "enqueued"


def test_overlap_buffer_one_enqueues_behind_a_running_task_only() -> None:
    running = decide(row(overlap="buffer_one", last_task_status="claimed"))
    assert [o for _, o in running] == ["enqueued"] + ["skipped_overlap"] * 5
    waiting = decide(row(overlap="buffer_one", last_task_status="queued"))
    assert {o for _, o in waiting} == {"skipped_overlap"}


def test_overlap_cancel_previous_enqueues_the_newest_and_replaces_the_live_task() -> None:
    previous = uuid.uuid4()
    schedule = row(overlap="cancel_previous", last_task_status="claimed", last_task_id=previous)
    plan = plans.due_plan(30)([schedule], NOW)
    assert [t.outcome for t in plan.ticks] == ["skipped_overlap"] * 5 + ["enqueued"]
    assert plan.replaces == {1: previous}
    finished = row(overlap="cancel_previous", last_task_status="completed", last_task_id=previous)
    assert plans.due_plan(30)([finished], NOW).replaces == {}


def test_jitter_delays_the_task_not_the_tick() -> None:
    plan = plans.due_plan(30, random.Random(7))([row(overlap="allow", jitter_seconds=30)], NOW)
    for tick in plan.ticks:
        assert tick.run_at is not None
        assert tick.tick_at <= tick.run_at <= tick.tick_at + timedelta(seconds=30)
    assert len({t.run_at - t.tick_at for t in plan.ticks if t.run_at}) > 1


def test_a_schedule_far_behind_decides_a_bounded_number_per_pass() -> None:
    behind = row(overlap="allow", every_seconds=1, next_tick_at=NOW - timedelta(hours=1))
    plan = plans.due_plan(30)([behind], NOW)
    assert len(plan.ticks) == plans.MAX_TICKS_PER_SCHEDULE
    # The rest is due at once, first in line at the next pass.
    assert plan.next_ticks[1] == plan.ticks[-1].tick_at + timedelta(seconds=1) <= NOW


def test_a_pass_bounds_the_ticks_of_one_transaction() -> None:
    far = [
        row(id=n, overlap="allow", every_seconds=1, next_tick_at=NOW - timedelta(hours=1))
        for n in range(10)
    ]
    plan = plans.due_plan(30)(far, NOW)
    assert len(plan.ticks) == plans.MAX_TICKS_PER_TRANSACTION
    # The schedules past the bound keep their next tick: decided at the next pass.
    assert set(plan.next_ticks) == {t.schedule_id for t in plan.ticks} == set(range(5))


def test_a_backfill_longer_than_its_bound_is_refused_naming_end() -> None:
    every_second = row(every_seconds=1)
    plan = plans.backfill_plan(NOW - timedelta(hours=1), NOW)
    with pytest.raises(ValidationFailed) as caught:
        plan([every_second], NOW)
    assert caught.value.extra["field"] == "end"
    ten = plans.backfill_plan(NOW - timedelta(seconds=9.5), NOW)([every_second], NOW)
    assert len(ten.ticks) == 10 and {t.outcome for t in ten.ticks} == {"enqueued"}
