"""What a schedule's change or tick decides, as pure functions of the stored row and
the database's clock: the row a PUT, a pause or a resume writes, and the ticks of a
tick pass, a trigger or a backfill with the overlap and catch-up policies applied.

The store runs them inside the transaction that holds the schedule's row
(store/schedules.py), so they see the row as it is and nothing changes it meanwhile.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import orjson

from ..api.schedule_bodies import MAX_BACKFILL_TICKS, ScheduleDefinition
from ..errors import ValidationFailed
from ..rows import PlannedTick, ScheduleRow, ScheduleWrite, TickPlan
from ..store.tasks import new_task_ids
from ..timing import Timing

# The most ticks one schedule decides in one pass. A schedule further behind (a
# every_seconds 1 after an hour down) goes on at the next pass, first in line.
MAX_TICKS_PER_SCHEDULE = 1000
# The most ticks one transaction decides (its one statement's rows): the schedules of a
# batch past it are left as they are, first in line at the next pass.
MAX_TICKS_PER_TRANSACTION = 5000
# A task in these statuses is the schedule's previous task still at work (overlap).
LIVE = ("queued", "claimed")
UPCOMING = 5
ID_BLOCK = 256


def timing_of(row: ScheduleRow) -> Timing:
    return Timing(row.cron, row.every_seconds, row.timezone)


def upcoming(row: ScheduleRow, count: int = UPCOMING) -> list[datetime]:
    """The schedule's next ticks, starting with its next one (one decided ahead of its
    time, if any, else its next tick to decide); none while paused."""
    if row.paused:
        return []
    first = row.next_tick_at if row.decided_ahead is None else row.decided_ahead
    return [first, *timing_of(row).upcoming(first, count - 1)]


def _first_tick(timing: Timing, now: datetime) -> datetime:
    first = timing.next_after(now)
    if first is None:
        raise ValidationFailed("the cron never fires", field="cron")
    return first


def _same_json(stored: object, text: str) -> bool:
    try:
        return bool(orjson.loads(orjson.dumps(stored)) == orjson.loads(text))
    except orjson.JSONDecodeError:  # a number beyond 64 bits: taken as a change
        return False


def put_write(
    definition: ScheduleDefinition, current: ScheduleRow | None, now: datetime
) -> ScheduleWrite | None:
    """The row a PUT writes, or None when it asks for the schedule exactly as stored
    (an idempotent repeat). The next tick stays where it was unless the timing changed
    or the PUT resumes the schedule: then it is the first tick after `now`."""
    timing = definition.timing
    keeps_timing = current is not None and timing_of(current) == timing
    resumes = current is not None and current.paused and not definition.paused
    if current is not None and keeps_timing and not resumes:
        next_tick = current.next_tick_at
    else:
        next_tick = _first_tick(timing, now)
    d = definition
    wanted = ScheduleWrite(
        timing.cron,
        timing.every_seconds,
        timing.timezone,
        d.payload_json,
        d.priority,
        d.ttl_seconds,
        d.max_attempts,
        d.overlap,
        d.catch_up_seconds,
        d.jitter_seconds,
        d.paused,
        d.note,
        next_tick,
    )
    if current is None:
        return wanted
    same_task = (
        _same_json(current.payload, d.payload_json)
        and (current.priority, current.ttl_seconds, current.max_attempts)
        == (d.priority, d.ttl_seconds, d.max_attempts)
        and (current.overlap, current.catch_up_seconds, current.jitter_seconds)
        == (d.overlap, d.catch_up_seconds, d.jitter_seconds)
    )
    if keeps_timing and same_task and (current.paused, current.note) == (d.paused, d.note):
        return None
    # A pause or a note alone leaves the version: ticks decided meanwhile were decided
    # from the same definition.
    return dataclasses.replace(wanted, bumps=not (keeps_timing and same_task))


def pause_write(
    paused: bool, note: str | None
) -> Callable[[ScheduleRow | None, datetime], ScheduleWrite | None]:
    """What :pause (paused) and :resume write: the flag, the note when one is given,
    and on resume the first tick after now: ticks that fell while it was paused are
    neither run nor recorded."""

    def write(current: ScheduleRow | None, now: datetime) -> ScheduleWrite | None:
        assert current is not None
        new_note = current.note if note is None else note
        if current.paused == paused and current.note == new_note:
            return None
        timing = timing_of(current)
        resumes = current.paused and not paused
        return ScheduleWrite(
            current.cron,
            current.every_seconds,
            current.timezone,
            orjson.dumps(current.payload).decode(),
            current.priority,
            current.ttl_seconds,
            current.max_attempts,
            current.overlap,
            current.catch_up_seconds,
            current.jitter_seconds,
            paused,
            new_note,
            _first_tick(timing, now) if resumes else current.next_tick_at,
            bumps=False,
        )

    return write


class _Overlap:
    """One schedule's overlap policy over the ticks of one transaction: whether each
    tick enqueues, given the previous task's status (updated as ticks enqueue)."""

    def __init__(self, row: ScheduleRow) -> None:
        self.policy = row.overlap
        self.status = row.last_task_status

    def allows(self) -> bool:
        if self.policy == "skip" and self.status in LIVE:
            return False
        if self.policy == "buffer_one" and self.status == "queued":
            return False
        self.status = "queued"
        return True


class _TaskIds:
    """New task ids for one plan, made ID_BLOCK at a time: one at a time they were a
    fifth of a tick pass's time in Python."""

    def __init__(self) -> None:
        self._left: Iterator[uuid.UUID] = iter(())

    def __call__(self) -> uuid.UUID:
        for task_id in self._left:
            return task_id
        self._left = iter(new_task_ids(ID_BLOCK))
        return next(self._left)


def _enqueued(
    row: ScheduleRow, tick: datetime, rng: random.Random, ids: Callable[[], uuid.UUID]
) -> PlannedTick:
    jitter = rng.uniform(0.0, row.jitter_seconds) if row.jitter_seconds > 0 else 0.0
    return PlannedTick(
        row.id,
        row.version,
        tick,
        "enqueued",
        ids(),
        tick + timedelta(seconds=jitter),
    )


def _decide(
    row: ScheduleRow,
    ticks: list[datetime],
    now: datetime,
    plan: TickPlan,
    rng: random.Random,
    ids: Callable[[], uuid.UUID],
) -> None:
    """The ticks' outcomes by the schedule's policies, added to `plan`. Ticks older than
    catch_up_seconds are skipped_late. With cancel_previous only the newest of the
    others enqueues (the older ones would be cancelled by it at once: they are
    skipped_overlap), and it replaces the previous task if that one is still live."""
    late_before = now - timedelta(seconds=row.catch_up_seconds)
    timely = [t for t in ticks if t >= late_before]
    for tick in ticks:
        if tick < late_before:
            plan.ticks.append(PlannedTick(row.id, row.version, tick, "skipped_late"))
    if row.overlap == "cancel_previous":
        for tick in timely[:-1]:
            plan.ticks.append(PlannedTick(row.id, row.version, tick, "skipped_overlap"))
        if timely:
            plan.ticks.append(_enqueued(row, timely[-1], rng, ids))
            if row.last_task_id is not None and row.last_task_status in LIVE:
                plan.replaces[row.id] = row.last_task_id
        return
    overlap = _Overlap(row)
    for tick in timely:
        if overlap.allows():
            plan.ticks.append(_enqueued(row, tick, rng, ids))
        else:
            plan.ticks.append(PlannedTick(row.id, row.version, tick, "skipped_overlap"))


def due_plan(
    ticks_days: int, rng: random.Random | None = None, *, ahead_seconds: float = 0.0
) -> Callable[[list[ScheduleRow], datetime], TickPlan]:
    """The tick pass's plan for a batch of due schedules: every tick from each one's
    next tick up to now (at most MAX_TICKS_PER_SCHEDULE; the rest next pass), decided,
    and its next tick after them; once MAX_TICKS_PER_TRANSACTION are decided, the rest
    of the batch waits for the next pass. Ticks older than the tick record
    (`ticks_days`) are passed over: no record of them would outlive the janitor's
    retention.

    A schedule with overlap allow also decides its ticks of the next `ahead_seconds`:
    their tasks are made now, waiting (scheduled) until their time, so that they are
    claimable at their tick however long the pass takes. No other policy can decide
    early: each depends on how the previous task stands at the tick."""
    chance = rng or random.Random()
    ahead = timedelta(seconds=ahead_seconds)

    def plan(rows: list[ScheduleRow], now: datetime) -> TickPlan:
        out = TickPlan()
        ids = _TaskIds()
        horizon = now - timedelta(days=ticks_days)
        for row in rows:
            if len(out.ticks) >= MAX_TICKS_PER_TRANSACTION:
                break  # left as they are: their next tick stays, due at the next pass
            timing = timing_of(row)
            until = now + ahead if row.overlap == "allow" else now
            first = row.next_tick_at
            if first < horizon:
                first = _first_tick(timing, horizon)
            ticks = [first] if first <= until else []
            if ticks:
                ticks += timing.ticks_between(first, until, MAX_TICKS_PER_SCHEDULE - 1)
            _decide(row, ticks, now, out, chance, ids)
            out.next_ticks[row.id] = _first_tick(timing, ticks[-1] if ticks else until)
        return out

    return plan


def trigger_plan(
    rng: random.Random | None = None,
) -> Callable[[list[ScheduleRow], datetime], TickPlan]:
    """A trigger: one tick now, under the schedule's overlap policy (catch-up does not
    apply: it is not late). Its next tick stays."""
    chance = rng or random.Random()

    def plan(rows: list[ScheduleRow], now: datetime) -> TickPlan:
        out = TickPlan()
        row = rows[0]
        if row.overlap == "cancel_previous" or _Overlap(row).allows():
            out.ticks.append(_enqueued(row, now, chance, _TaskIds()))
            if row.overlap == "cancel_previous" and row.last_task_status in LIVE:
                assert row.last_task_id is not None
                out.replaces[row.id] = row.last_task_id
        else:
            out.ticks.append(PlannedTick(row.id, row.version, now, "skipped_overlap"))
        return out

    return plan


def backfill_plan(
    start: datetime, end: datetime, rng: random.Random | None = None
) -> Callable[[list[ScheduleRow], datetime], TickPlan]:
    """A backfill: each tick in [start, end] enqueued (no overlap policy: a past range
    runs whole), at most MAX_BACKFILL_TICKS of them; a tick already enqueued makes no
    second task (the tick key), one recorded as skipped is enqueued now."""
    chance = rng or random.Random()

    def plan(rows: list[ScheduleRow], now: datetime) -> TickPlan:
        row = rows[0]
        ticks = timing_of(row).ticks_between(
            start - timedelta(microseconds=1), end, MAX_BACKFILL_TICKS + 1
        )
        if len(ticks) > MAX_BACKFILL_TICKS:
            raise ValidationFailed(
                f"the range holds more than {MAX_BACKFILL_TICKS} ticks; backfill it in parts",
                field="end",
            )
        ids = _TaskIds()
        return TickPlan(ticks=[_enqueued(row, tick, chance, ids) for tick in ticks])

    return plan
