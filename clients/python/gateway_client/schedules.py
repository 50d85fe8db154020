"""A runtime's schedules: their typed views (`Schedule`, `ScheduleTick`, `Backfill`) and
the calls that manage them (`ScheduleCalls`, which `AsyncClient` is made of). Managing
needs a token with the `enqueue` scope on the runtime, reading the `read` scope."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .calls.base import Calls
from .models import format_time, parse_time
from .paths import runtime_path, segment

# What a tick does while the schedule's previous task is queued or running.
Overlap = Literal["allow", "skip", "buffer_one", "cancel_previous"]
# What became of a tick.
TickOutcome = Literal["enqueued", "skipped_overlap", "skipped_late", "failed"]


@dataclass(frozen=True)
class Schedule:
    """A schedule as the gateway answers it. `next_run_at` is None while paused;
    `upcoming` holds its next ticks. `raw` is the answer as sent."""

    runtime_id: str
    name: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    payload: Any
    overlap: str
    paused: bool
    note: str | None
    version: int
    next_run_at: datetime | None
    upcoming: list[datetime]
    last_tick_at: datetime | None
    last_task_id: str | None
    last_task_status: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schedule:
        return cls(
            runtime_id=data["runtime_id"],
            name=data["name"],
            cron=data.get("cron"),
            every_seconds=data.get("every_seconds"),
            timezone=data.get("timezone", "UTC"),
            payload=data.get("payload"),
            overlap=data.get("overlap", "skip"),
            paused=bool(data.get("paused")),
            note=data.get("note"),
            version=int(data.get("version", 1)),
            next_run_at=parse_time(data.get("next_run_at")),
            upcoming=[t for t in map(parse_time, data.get("upcoming") or []) if t is not None],
            last_tick_at=parse_time(data.get("last_tick_at")),
            last_task_id=data.get("last_task_id"),
            last_task_status=data.get("last_task_status"),
            raw=data,
        )


@dataclass(frozen=True)
class ScheduleTick:
    """A tick decided: its time, its outcome and, when enqueued, its task's id."""

    tick_at: datetime
    outcome: str
    task_id: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScheduleTick:
        tick_at = parse_time(data["tick_at"])
        assert tick_at is not None
        return cls(tick_at, data["outcome"], data.get("task_id"))

    def to_json(self) -> dict[str, Any]:
        """As the gateway answers it."""
        return {
            "tick_at": format_time(self.tick_at),
            "outcome": self.outcome,
            "task_id": self.task_id,
        }


@dataclass(frozen=True)
class Backfill:
    """A backfill's answer: the ticks the range holds, those enqueued by this call, and
    how many had their task made before (none is made twice)."""

    ticks: int
    enqueued: list[ScheduleTick]
    already_enqueued: int


def _path(runtime: str, name: str = "", rest: str = "") -> str:
    tail = f"/{segment('name', name)}" if name else ""
    return runtime_path(runtime, "/schedules" + tail + rest)


class ScheduleCalls(Calls):
    """The schedule calls of `AsyncClient` (client.py), which supplies `request`."""

    async def put_schedule(
        self,
        runtime: str,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every_seconds: int | None = None,
        timezone: str | None = None,
        overlap: Overlap | None = None,
        **options: Any,
    ) -> Schedule:
        """Create or replace the schedule (idempotent): `cron` (5 fields, or 6 with
        seconds first) or `every_seconds`, and the task template `payload`. `options`:
        priority, ttl_seconds, max_attempts, catch_up_seconds, jitter_seconds, paused,
        note. Fields left out take their defaults."""
        body: dict[str, Any] = {"payload": payload, **options}
        given = {"cron": cron, "every_seconds": every_seconds, "timezone": timezone}
        body.update({k: v for k, v in given.items() if v is not None})
        if overlap is not None:
            body["overlap"] = overlap
        _, data, _ = await self.request("PUT", _path(runtime, name), body)
        return Schedule.from_json(data)

    async def get_schedule(self, runtime: str, name: str) -> Schedule:
        _, data, _ = await self.request("GET", _path(runtime, name))
        return Schedule.from_json(data)

    async def list_schedules(self, runtime: str) -> list[Schedule]:
        """Every schedule of the runtime, in name order (following the cursors)."""
        out: list[Schedule] = []
        cursor: str | None = None
        while True:
            params = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            _, data, _ = await self.request("GET", _path(runtime), params=params)
            out += [Schedule.from_json(s) for s in data["schedules"]]
            cursor = data["next_cursor"]
            if cursor is None:
                return out

    async def delete_schedule(self, runtime: str, name: str) -> None:
        """Delete it (its tasks stay); NotFound if there is none."""
        await self.request("DELETE", _path(runtime, name))

    async def trigger_schedule(self, runtime: str, name: str) -> ScheduleTick:
        """A tick now, under the schedule's overlap policy."""
        _, data, _ = await self.request("POST", _path(runtime, name, ":trigger"))
        return ScheduleTick.from_json(data)

    async def pause_schedule(self, runtime: str, name: str, note: str | None = None) -> Schedule:
        body = None if note is None else {"note": note}
        _, data, _ = await self.request("POST", _path(runtime, name, ":pause"), body)
        return Schedule.from_json(data)

    async def resume_schedule(self, runtime: str, name: str) -> Schedule:
        _, data, _ = await self.request("POST", _path(runtime, name, ":resume"))
        return Schedule.from_json(data)

    async def backfill_schedule(
        self, runtime: str, name: str, start: datetime | str, end: datetime | str
    ) -> Backfill:
        """Enqueue the ticks of the past range [start, end] (aware datetimes or RFC 3339
        strings), each at most once."""
        body = {"start": format_time(start), "end": format_time(end)}
        _, data, _ = await self.request("POST", _path(runtime, name, ":backfill"), body)
        return Backfill(
            data["ticks"],
            [ScheduleTick.from_json(t) for t in data["enqueued"]],
            data["already_enqueued"],
        )
