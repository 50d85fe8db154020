"""Schedules in Postgres: a runtime's schedules read, written and deleted, and the
transactions that decide ticks (the tick pass's batch, a trigger, a backfill).

What to decide is the caller's (gateway/schedules/plans.py): each transaction here
locks the schedules it decides for, reads the database's clock, hands both to the
caller's `plan`, and records the plan's ticks with their tasks in one statement
(sql.RECORD_TICKS), whose key on (schedule, tick time) makes each tick's task exactly
one however many instances decide it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import NamedTuple

import asyncpg

from ..errors import NotFound
from ..rows import DecidedTick, ScheduleRow, ScheduleWrite, TickPlan
from .base import Row, StoreBase
from .sql import schedules as sql

# What a PUT, a pause or a resume writes, given the row as it is (None: no such
# schedule yet) and the database's clock; None writes nothing.
Writer = Callable[[ScheduleRow | None, datetime], ScheduleWrite | None]
Planner = Callable[[list[ScheduleRow], datetime], TickPlan]


class Written(NamedTuple):
    """What write_schedule did: the row now, whether it was created, and the ticks due
    before the change that it decided first (with the tasks they cancelled)."""

    row: ScheduleRow
    created: bool
    decided: list[DecidedTick]
    cancelled: list[tuple[uuid.UUID, str]]
    # Tasks of ticks decided ahead that the change withdrew (deleted): requests waiting
    # for their results are to be woken after the commit.
    withdrawn: tuple[uuid.UUID, ...] = ()


async def _withdraw_ahead(
    c: asyncpg.Connection, current: ScheduleRow, wanted: ScheduleWrite
) -> tuple[ScheduleWrite, tuple[uuid.UUID, ...]]:
    """Inside the transaction holding the schedule: its ticks decided ahead whose time
    has not come withdrawn with their tasks (a change of definition or a pause), and its
    last tick and last task those of the latest tick left. When the timing stays, its
    next tick moves back to the earliest withdrawn, which the new definition then
    decides; a new timing has ticks of its own. Returns the write and the tasks
    withdrawn."""
    done = await c.fetchrow(sql.WITHDRAW_AHEAD, current.id)
    earliest: datetime | None = done["earliest"]
    withdrawn = tuple(done["tasks"])
    if earliest is not None:
        await c.execute(sql.RESTORE_LAST_TICK, current.id)
    same_timing = (wanted.cron, wanted.every_seconds, wanted.timezone) == (
        current.cron,
        current.every_seconds,
        current.timezone,
    )
    if earliest is not None and same_timing and earliest < wanted.next_tick_at:
        return replace(wanted, next_tick_at=earliest), withdrawn
    return wanted, withdrawn


async def _hold(c: asyncpg.Connection, runtime_id: str, name: str) -> Row | None:
    """Inside a transaction: the schedule's row held until the commit, and read (with
    the clock) once held, by a statement of its own (see sql.LOCK_SCHEDULE_ID); None
    when there is no such schedule."""
    if await c.fetchval(sql.LOCK_SCHEDULE_ID, runtime_id, name) is None:
        return None
    row: Row | None = await c.fetchrow(sql.LOCK_SCHEDULE, runtime_id, name)
    return row


class ScheduleStatements(StoreBase):
    """A runtime's schedules and their ticks."""

    async def get_schedule(self, runtime_id: str, name: str) -> ScheduleRow | None:
        row = await self._run(lambda c: c.fetchrow(sql.GET_SCHEDULE, runtime_id, name))
        return None if row is None else ScheduleRow.of(row)

    async def list_schedules(self, runtime_id: str, after: str, limit: int) -> list[ScheduleRow]:
        """Up to `limit` of the runtime's schedules named after `after`, in name order."""
        rows = await self._run(lambda c: c.fetch(sql.LIST_SCHEDULES, runtime_id, after, limit))
        return [ScheduleRow.of(r) for r in rows]

    async def now(self) -> datetime:
        """The database's clock, which every tick is computed against."""
        now: datetime = await self._run(lambda c: c.fetchval(sql.NOW))
        return now

    async def next_due_in(self) -> float | None:
        """Seconds until the earliest unpaused schedule's next tick (<= 0: due now), by
        the database's clock; None when there is no such schedule."""
        due: float | None = await self._run(lambda c: c.fetchval(sql.NEXT_DUE_IN))
        return due

    async def write_schedule(
        self,
        runtime_id: str,
        name: str,
        write: Writer,
        create: bool = True,
        settle: Planner | None = None,
    ) -> Written:
        """Create or change the schedule, holding its row. `write` decides from the row
        as it is; a schedule that does not exist is created if `create`, else NotFound.
        Idempotent when `write` is.

        `settle`: the plan of the ticks due and not decided yet (a change that lands
        between a tick and the pass that would decide it), run first in the same
        transaction under the definition the change replaces, so that no tick due
        before the change goes unrecorded. The ticks it decided come back in
        `Written` for the caller to announce after the commit."""

        async def write_in_tx(c: asyncpg.Connection) -> Written | None:
            async with self._transaction(c):
                row = await _hold(c, runtime_id, name)
                now = row["now"] if row is not None else await c.fetchval(sql.NOW)
                current = None if row is None else ScheduleRow.of(row)
                if current is None and not create:
                    raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")
                settled: tuple[list[DecidedTick], list[tuple[uuid.UUID, str]]] = ([], [])
                if (
                    settle is not None
                    and current is not None
                    and not current.paused
                    and current.next_tick_at <= now
                ):
                    settled = await self._record(c, settle([current], now), "schedule", False)
                    row = await c.fetchrow(sql.LOCK_SCHEDULE, runtime_id, name)
                    current, now = ScheduleRow.of(row), row["now"]
                wanted = write(current, now)
                if wanted is None:
                    assert current is not None
                    return Written(current, False, *settled)
                if current is None:
                    made = await c.fetchrow(
                        sql.INSERT_SCHEDULE, runtime_id, name, *wanted.columns()
                    )
                    if made is None:
                        return None  # created meanwhile by a concurrent PUT: again
                    return Written(ScheduleRow.of(made), True, [], [])
                withdrawn: tuple[uuid.UUID, ...] = ()
                if wanted.bumps or (wanted.paused and not current.paused):
                    wanted, withdrawn = await _withdraw_ahead(c, current, wanted)
                changed = await c.fetchrow(
                    sql.UPDATE_SCHEDULE,
                    current.id,
                    runtime_id,
                    *wanted.columns(),
                    int(wanted.bumps),
                )
                return Written(ScheduleRow.of(changed), False, *settled, withdrawn)

        for _ in range(3):
            done = await self._run(write_in_tx)
            if done is not None:
                return done
        raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")

    async def delete_schedule(
        self, runtime_id: str, name: str
    ) -> tuple[bool, tuple[uuid.UUID, ...]]:
        """Delete the schedule, its ticks, and the tasks of its ticks decided ahead
        whose time has not come: (whether there was one, those tasks). Waits for a
        transaction deciding its ticks: none is decided from it once this returns."""

        async def delete_in_tx(c: asyncpg.Connection) -> tuple[bool, tuple[uuid.UUID, ...]]:
            async with self._transaction(c):
                schedule_id = await c.fetchval(sql.LOCK_SCHEDULE_ID, runtime_id, name)
                if schedule_id is None:
                    return False, ()
                done = await c.fetchrow(sql.WITHDRAW_AHEAD, schedule_id)
                await c.execute(sql.DELETE_SCHEDULE, schedule_id)
                return True, tuple(done["tasks"])

        return await self._run(delete_in_tx)

    async def decide_due(
        self, batch: int, plan: Planner, ahead_seconds: float = 0.0
    ) -> tuple[list[DecidedTick], list[tuple[uuid.UUID, str]], int]:
        """One batch of the tick pass, in one transaction: up to `batch` due schedules
        (SKIP LOCKED; those with overlap allow due within `ahead_seconds`), `plan`'s
        ticks recorded with their tasks, and each schedule's next tick. Returns the
        ticks decided, the tasks cancelled for overlap cancel_previous (id, status
        now), and how many schedules were due."""

        async def decide_in_tx(
            c: asyncpg.Connection,
        ) -> tuple[list[DecidedTick], list[tuple[uuid.UUID, str]], int]:
            async with self._transaction(c):
                rows = await c.fetch(sql.DUE_SCHEDULES, batch, ahead_seconds)
                if not rows:
                    return [], [], 0
                schedules = [ScheduleRow.of(r) for r in rows]
                decided, cancelled = await self._record(
                    c, plan(schedules, rows[0]["now"]), "schedule", False
                )
                return decided, cancelled, len(rows)

        return await self._run(decide_in_tx)

    async def decide_one(
        self, runtime_id: str, name: str, plan: Planner, source: str, upgrade: bool = False
    ) -> tuple[ScheduleRow, list[DecidedTick], list[tuple[uuid.UUID, str]]]:
        """A trigger's or a backfill's ticks (`source`) for one schedule, holding its
        row: (the row as it was, the ticks decided, the tasks cancelled). `upgrade`: a
        tick recorded as skipped may become enqueued (a backfill); one enqueued never
        makes a second task."""

        async def decide_in_tx(
            c: asyncpg.Connection,
        ) -> tuple[ScheduleRow, list[DecidedTick], list[tuple[uuid.UUID, str]]]:
            async with self._transaction(c):
                row = await _hold(c, runtime_id, name)
                if row is None:
                    raise NotFound(f"runtime {runtime_id} has no schedule named {name!r}")
                schedule = ScheduleRow.of(row)
                decided, cancelled = await self._record(
                    c, plan([schedule], row["now"]), source, upgrade
                )
                return schedule, decided, cancelled

        return await self._run(decide_in_tx)

    async def _record(
        self, c: asyncpg.Connection, plan: TickPlan, source: str, upgrade: bool
    ) -> tuple[list[DecidedTick], list[tuple[uuid.UUID, str]]]:
        """Inside a transaction holding the plan's schedules: its ticks and their tasks
        (one statement), the tasks they replace cancelled, the schedules advanced."""
        decided: list[DecidedTick] = []
        if plan.ticks:
            ticks = plan.ticks
            rows = await c.fetch(
                sql.RECORD_TICKS,
                [t.schedule_id for t in ticks],
                [t.version for t in ticks],
                [t.tick_at for t in ticks],
                [t.outcome for t in ticks],
                [t.task_id for t in ticks],
                [t.run_at for t in ticks],
                source,
                upgrade,
            )
            decided = [
                DecidedTick(
                    r["schedule_id"],
                    r["tick_at"],
                    r["outcome"],
                    r["task_id"],
                    r["made_in"],
                    r["recorded_at"],
                )
                for r in rows
            ]
        made: dict[int, DecidedTick] = {}
        last: dict[int, datetime] = {}
        for tick in sorted(decided, key=lambda t: t.tick_at):
            last[tick.schedule_id] = tick.tick_at
            if tick.runtime_id is not None:
                made[tick.schedule_id] = tick
        cancelled: list[tuple[uuid.UUID, str]] = []
        replaced = [task for sid, task in plan.replaces.items() if sid in made]
        if replaced:
            rows = await c.fetch(sql.CANCEL_PREVIOUS, replaced)
            cancelled = [(r["id"], r["status"]) for r in rows]
        if source == "backfill":
            return decided, cancelled  # a past range moves neither the next tick nor the last
        ids = sorted(set(plan.next_ticks) | set(last))
        if ids:
            await c.execute(
                sql.ADVANCE_SCHEDULES,
                ids,
                [plan.next_ticks.get(i) for i in ids],
                [last.get(i) for i in ids],
                [made[i].task_id if i in made else None for i in ids],
            )
        return decided, cancelled

    async def purge_ticks(self, days: int, batch: int) -> int:
        """Delete up to `batch` ticks older than `days`; returns how many."""
        status: str = await self._run(lambda c: c.execute(sql.PURGE_TICKS, days, batch))
        return int(status.split()[-1])

    async def schedule_ticks(self, schedule_id: int, start: datetime, end: datetime) -> list[Row]:
        """The recorded ticks of a schedule in [start, end], for tests and checks."""
        return await self._run(lambda c: c.fetch(sql.LIST_TICKS, schedule_id, start, end))
