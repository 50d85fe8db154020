"""The JSON forms answers carry: a task, a runtime's controls, and times as the API writes
them (RFC 3339, UTC, microseconds, Z)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson

from ..rows import Controls, ScheduleRow, TaskRow
from . import trace

TASK_FIELDS = (
    "id",
    "runtime_id",
    "status",
    "priority",
    "payload",
    "attempts",
    "max_attempts",
    "run_at",
    "expires_at",
    "created_at",
    "updated_at",
)
LEASE_FIELDS = ("lease_id", "lease_expires_at", "worker_id", "cancel_requested")


# The text of each second format_time wrote lately, by (day, hour, minute, second); at
# most SECONDS_KEPT, then forgotten all at once. A claimed task carries five or six
# times, many of them in the same few seconds as its neighbours' (enqueued together,
# leased together): formatting the second once made a time a third of its cost, and
# times were 5.7% of the gateway's CPU in a batch-acknowledged drain.
_SECONDS: dict[tuple[int, int, int, int], str] = {}
SECONDS_KEPT = 4096


def format_time(value: datetime | None) -> str | None:
    """RFC 3339 UTC with microseconds and Z, so that times compare as strings."""
    if value is None:
        return None
    if value.tzinfo is not UTC:  # asyncpg's times are in UTC already
        value = value.astimezone(UTC)
    key = value.toordinal(), value.hour, value.minute, value.second
    text = _SECONDS.get(key)
    if text is None:
        if len(_SECONDS) >= SECONDS_KEPT:
            _SECONDS.clear()
        text = _SECONDS[key] = value.replace(microsecond=0, tzinfo=None).isoformat()
    return f"{text}.{value.microsecond:06d}Z"


def task_json(row: TaskRow) -> dict[str, Any]:
    """The API's task object from a tasks row."""
    out: dict[str, Any] = {}
    for key in TASK_FIELDS:
        value = getattr(row, key)
        out[key] = format_time(value) if isinstance(value, datetime) else value
    out["id"] = str(row.id)
    if row.status == "claimed":
        out["lease_id"] = str(row.lease_id)
        out["lease_expires_at"] = format_time(row.lease_expires_at)
        out["worker_id"] = row.worker_id
        out["cancel_requested"] = row.cancel_requested
    if row.status == "completed":
        out["result"] = row.result
    if row.last_error is not None:
        out["last_error"] = row.last_error
    if row.schedule is not None:
        out["schedule"] = row.schedule
        out["scheduled_for"] = format_time(row.scheduled_for)
    if row.trace_parent is not None:
        out["trace"] = trace.as_json(row.trace_parent, row.trace_state)
    return out


def task_bytes(row: TaskRow) -> bytes:
    """The task object as JSON bytes. Raises whatever prevents it: a caller decides
    what becomes of a task that cannot be shown."""
    return orjson.dumps(task_json(row))


def render_task(row: TaskRow) -> orjson.Fragment:
    """task_bytes, ready to embed in an answer."""
    return orjson.Fragment(task_bytes(row))


def task_bytes_or_stub(row: TaskRow) -> bytes:
    """task_bytes, or, for a row that cannot be shown whole, the task without its
    payload and result and with `render_error` saying why: one bad row never fails
    a read or a listing."""
    try:
        return task_bytes(row)
    except Exception as exc:
        out = task_json(replace(row, payload=None, result=None))
        out["render_error"] = f"this task cannot be shown: {exc}"
        return orjson.dumps(out)


def render_task_or_stub(row: TaskRow) -> orjson.Fragment:
    """task_bytes_or_stub, ready to embed in an answer."""
    return orjson.Fragment(task_bytes_or_stub(row))


def task_ref_json(task_id: uuid.UUID) -> str:
    """A task's reference, `{"id":"<uuid>"}`: all an enqueue answers of a task under
    `Prefer: return=minimal` (store/sql/tasks.TASK_REF_JSON writes the same in Postgres)."""
    return f'{{"id":"{task_id}"}}'


def controls_json(controls: Controls) -> dict[str, Any]:
    """A runtime's controls as `GET /v1/runtimes/{rt}/controls` answers them."""
    return {
        "runtime_id": controls.runtime_id,
        "max_in_flight": controls.max_in_flight,
        "claims_per_second": controls.claims_per_second,
        "updated_at": format_time(controls.updated_at),
        **pause_json(controls),
    }


def pause_json(controls: Controls) -> dict[str, Any]:
    """`paused` as in force now, and the pause's reason, start and end (null unless
    paused): the fields that controls and stats share."""
    on = controls.paused_now()
    return {
        "paused": on,
        "paused_reason": controls.paused_reason if on else None,
        "paused_since": format_time(controls.paused_at) if on else None,
        "paused_until": format_time(controls.paused_until) if on else None,
    }


def schedule_json(row: ScheduleRow, upcoming: list[datetime]) -> dict[str, Any]:
    """A schedule as `GET /v1/runtimes/{rt}/schedules/{name}` answers it; `upcoming`:
    its next ticks (none while paused), the first of them its next_run_at."""
    return {
        "runtime_id": row.runtime_id,
        "name": row.name,
        "cron": row.cron,
        "every_seconds": row.every_seconds,
        "timezone": row.timezone,
        "payload": row.payload,
        "priority": row.priority,
        "ttl_seconds": row.ttl_seconds,
        "max_attempts": row.max_attempts,
        "overlap": row.overlap,
        "catch_up_seconds": row.catch_up_seconds,
        "jitter_seconds": row.jitter_seconds,
        "paused": row.paused,
        "note": row.note,
        "version": row.version,
        "next_run_at": format_time(upcoming[0]) if upcoming else None,
        "upcoming": [format_time(t) for t in upcoming],
        "last_tick_at": format_time(row.last_tick_at),
        "last_task_id": None if row.last_task_id is None else str(row.last_task_id),
        "last_task_status": row.last_task_status,
        "created_at": format_time(row.created_at),
        "updated_at": format_time(row.updated_at),
    }
