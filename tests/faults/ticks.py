"""The schedules class of the fault matrix: the schedules a row creates, their data read
back from Postgres in one snapshot, and the wait until every tick due by the check's
cut-off has been decided. Also what the class's broken variant needs: the tick key
dropped from the table, and a gateway whose statement no longer names it.

`python -m tests.faults.ticks serve ...` runs that gateway: `gateway` itself, its
statement that records ticks (RECORD_TICKS) without its conflict clause, as
tests/integration/test_schedule_ticks.py's control has it. Only the broken variant
starts it, on a database whose tick key it dropped first (`drop_tick_key`).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import asyncpg

from gateway.cli.main import main
from gateway.store.sql import schedules as schedule_sql
from tests.faults.checker import Schedule, ScheduledTask, ScheduleVerdict, Tick, check_schedules
from tests.faults.load import ScheduleSpec

KEYLESS_GATEWAY = "tests.faults.ticks"
# After the cut-off (the database's clock at the first read), how long the ticks due by
# then may take to be decided: ten tick passes (0.5 s apart) on a live leader. A tick
# still undecided after it is a silent gap.
SETTLE_SECONDS = 5.0
SETTLE_POLL_SECONDS = 0.25


def _every_second(runtime: str, name: str, backfilled: bool = False, **policy: Any) -> ScheduleSpec:
    body = {"every_seconds": 1, "jitter_seconds": 0, "payload": {"schedule": name}, **policy}
    return ScheduleSpec(runtime, name, body, backfilled)


def row_schedules(prefix: str) -> tuple[ScheduleSpec, ...]:
    """A row's schedules, all every second, on runtimes of their own: 20 that run every
    tick (`allow`) over two runtimes, which the load backfills; 3 that skip a tick while
    their last task is live (`skip`: a task dropped by a worker, or several ticks
    decided at once after the leader died, records `skipped_overlap`); 2 whose ticks
    decided more than 0.5 s late are skipped (`catch_up_seconds`; the ticks of a
    leaderless spell, and some a pass decides just before its next, record
    `skipped_late`). Backfilling the last two would turn their skips into tasks."""
    return (
        *(_every_second(f"{prefix}-ticks-{n % 2}", f"allow-{n}", True, overlap="allow")
          for n in range(20)),
        *(_every_second(f"{prefix}-ticks-skip", f"skip-{n}", overlap="skip") for n in range(3)),
        *(_every_second(f"{prefix}-ticks-late", f"late-{n}", overlap="allow",
                        catch_up_seconds=0.5) for n in range(2)),
    )  # fmt: skip


SCHEDULES = "SELECT id, runtime_id, name, every_seconds, cron, timezone FROM schedules"
TICKS = "SELECT schedule_id, tick_at, outcome, task_id::text AS task_id FROM schedule_ticks"
TASKS = (
    "SELECT id::text AS id, runtime_id, schedule, scheduled_for FROM tasks "
    "WHERE schedule IS NOT NULL"
)


async def read_snapshot(
    database_url: str, first_ticks: dict[tuple[str, str], datetime]
) -> tuple[list[Schedule], list[Tick], list[ScheduledTask], datetime]:
    """The schedules the load created (`first_ticks`), every tick recorded and every
    task a schedule made, in one snapshot (a tick's row and its task commit together,
    so two snapshots could split them), and the database's clock at its start."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            now: datetime = await conn.fetchval("SELECT now()")
            schedules = [
                Schedule(
                    r["id"],
                    r["runtime_id"],
                    r["name"],
                    first_ticks[(r["runtime_id"], r["name"])],
                    r["every_seconds"],
                    r["cron"],
                    r["timezone"],
                )
                for r in await conn.fetch(SCHEDULES)
                if (r["runtime_id"], r["name"]) in first_ticks
            ]
            ticks = [
                Tick(r["schedule_id"], r["tick_at"], r["outcome"], r["task_id"])
                for r in await conn.fetch(TICKS)
            ]
            tasks = [
                ScheduledTask(r["id"], r["runtime_id"], r["schedule"], r["scheduled_for"])
                for r in await conn.fetch(TASKS)
            ]
    finally:
        await conn.close()
    return schedules, ticks, tasks, now


async def settled_verdict(
    database_url: str,
    first_ticks: dict[tuple[str, str], datetime],
    settle_seconds: float = SETTLE_SECONDS,
) -> ScheduleVerdict:
    """The schedules class over the ticks due by the cut-off, the database's clock at
    the first read: read again while some due tick is undecided, for `settle_seconds`
    at most, so that a pass decides what was due just before the cut-off."""
    deadline = time.monotonic() + settle_seconds
    until: datetime | None = None
    while True:
        schedules, ticks, tasks, now = await read_snapshot(database_url, first_ticks)
        until = until or now
        verdict = check_schedules(schedules, ticks, tasks, until=until)
        if not verdict.gaps or time.monotonic() > deadline:
            return verdict
        await asyncio.sleep(SETTLE_POLL_SECONDS)


def keyless_record_ticks() -> str:
    """RECORD_TICKS without its conflict clause: each decision of a tick inserts a row
    and, enqueued, a task, whether the tick was decided before or not. The statement
    then no longer reads the backfill's flag ($8), which it is still sent: it is read,
    to no effect, where the schedule is joined."""
    return schedule_sql.record_ticks("").replace(
        "AND s.version = i.version", "AND s.version = i.version AND $8::boolean IS NOT NULL"
    )


async def drop_tick_key(database_url: str) -> None:
    """Drop the tick record's primary key, which is what the conflict clause names."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute("ALTER TABLE schedule_ticks DROP CONSTRAINT schedule_ticks_pkey")
    finally:
        await conn.close()


if __name__ == "__main__":
    schedule_sql.RECORD_TICKS = keyless_record_ticks()
    main()
