"""Documentation of the schedules API (gateway/schedules/), beside docs.py's: each
operation's `Doc` and the JSON Schemas of its answers (`SCHEMAS`, which the OpenAPI
document adds to its components). The request bodies are api/schedule_bodies.py's."""

from __future__ import annotations

from typing import Any

from ..api.answers import TIME_SCHEMA, UUID_SCHEMA
from ..api.decode import RUNTIME_ID_RE
from ..api.schedule_bodies import (
    BACKFILL_BODY,
    MAX_BACKFILL_TICKS,
    OVERLAPS,
    SCHEDULE_BODY,
    SCHEDULE_NAME_RE,
    SCHEDULE_PAUSE_BODY,
    SCHEDULES_QUERY,
)
from ..errors import Conflict
from ..schedules.plans import UPCOMING
from .docs import Doc, Param, Reply

NAME = Param(
    "name",
    "The schedule's name: 1-64 letters, digits, - _ and . (no `:`).",
    {"type": "string", "pattern": SCHEDULE_NAME_RE.pattern},
)
_NULLABLE_TIME = {**TIME_SCHEMA, "type": ["string", "null"]}
_OUTCOME = {
    "type": "string",
    "enum": ["enqueued", "skipped_overlap", "skipped_late", "failed"],
    "description": "What became of a tick: its task enqueued, or skipped because the "
    "previous task was still queued or running (overlap), or because it was older than "
    "catch_up_seconds when decided (late).",
}
_OVERLAP = {
    "type": "string",
    "enum": list(OVERLAPS),
    "description": "What a tick does while the schedule's previous task is queued or running.",
}


def _field(name: str) -> dict[str, Any]:
    """A definition field as a schedule shows it: its bounds, its request wording."""
    return SCHEDULE_BODY[name].json_schema({}, nullable=not SCHEDULE_BODY[name].required)


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


_SCHEDULE_PROPERTIES: dict[str, Any] = {
    "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
    "name": {"type": "string", "pattern": SCHEDULE_NAME_RE.pattern},
    **{
        name: _field(name)
        for name in (
            "cron",
            "every_seconds",
            "priority",
            "ttl_seconds",
            "max_attempts",
            "catch_up_seconds",
            "jitter_seconds",
            "paused",
            "note",
        )
    },
    "timezone": {"type": "string", "description": "The IANA zone the cron is read in."},
    "payload": {"description": "The payload of each tick's task, exactly as given."},
    "overlap": {"$ref": "#/components/schemas/ScheduleOverlap"},
    "version": {
        "type": "integer",
        "minimum": 1,
        "description": "Grows with each change of the definition (not with a pause).",
    },
    "next_run_at": {**_NULLABLE_TIME, "description": "The next tick; null while paused."},
    "upcoming": {
        "type": "array",
        "items": TIME_SCHEMA,
        "maxItems": UPCOMING,
        "description": f"The next {UPCOMING} ticks; empty while paused.",
    },
    "last_tick_at": {**_NULLABLE_TIME, "description": "The last tick decided, or null."},
    "last_task_id": {**UUID_SCHEMA, "type": ["string", "null"]},
    "last_task_status": {
        "anyOf": [_ref("TaskStatus"), {"type": "null"}],
        "description": "Its last task's status; null before the first, or once retention "
        "deleted it.",
    },
    "created_at": TIME_SCHEMA,
    "updated_at": TIME_SCHEMA,
}
_TICK = {
    "type": "object",
    "required": ["tick_at", "outcome", "task_id"],
    "properties": {
        "tick_at": {**TIME_SCHEMA, "description": "The tick's time (its task's scheduled_for)."},
        "outcome": {"$ref": "#/components/schemas/TickOutcome"},
        "task_id": {**UUID_SCHEMA, "type": ["string", "null"]},
    },
    "additionalProperties": False,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    "ScheduleOverlap": _OVERLAP,
    "TickOutcome": _OUTCOME,
    "Schedule": {
        "type": "object",
        "required": list(_SCHEDULE_PROPERTIES),
        "properties": _SCHEDULE_PROPERTIES,
        "additionalProperties": False,
    },
    "SchedulePage": {
        "type": "object",
        "required": ["schedules", "next_cursor"],
        "properties": {
            "schedules": {"type": "array", "items": _ref("Schedule")},
            "next_cursor": {"type": ["string", "null"]},
        },
        "additionalProperties": False,
    },
    "ScheduleTick": _TICK,
    "BackfillResult": {
        "type": "object",
        "required": ["ticks", "enqueued", "already_enqueued"],
        "properties": {
            "ticks": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_BACKFILL_TICKS,
                "description": "The ticks in the range.",
            },
            "enqueued": {
                "type": "array",
                "items": _ref("ScheduleTick"),
                "description": "The ticks enqueued by this backfill.",
            },
            "already_enqueued": {
                "type": "integer",
                "minimum": 0,
                "description": "The ticks whose task was made before: none is made twice.",
            },
        },
        "additionalProperties": False,
    },
}

_ABOUT = (
    "Managing a runtime's schedules needs the `enqueue` scope on it, reading them `read`. "
    "Each tick makes exactly one task, however many gateway instances run: ticks are "
    "recorded (GATEWAY_SCHEDULE_TICKS_DAYS) with their task in one transaction."
)
_TAG = "schedules"
PUT_SCHEDULE = Doc(
    "putSchedule",
    "Create or replace a schedule",
    (
        Reply(201, "Created.", "Schedule"),
        Reply(200, "Replaced, or unchanged (the same definition again).", "Schedule"),
    ),
    "Idempotent. Once answered, no tick is decided from the definition it replaced: a "
    "tick pass running meanwhile finished first. The next tick stays where it was "
    "unless the timing changed. " + _ABOUT,
    tag=_TAG,
    body=SCHEDULE_BODY,
    path_params=(NAME,),
)
GET_SCHEDULE = Doc(
    "getSchedule",
    "Get a schedule, with its next ticks and its last task",
    (Reply(200, "The schedule.", "Schedule"),),
    _ABOUT,
    tag=_TAG,
    path_params=(NAME,),
)
LIST_SCHEDULES = Doc(
    "listSchedules",
    "List a runtime's schedules, in name order",
    (Reply(200, "A page; next_cursor is null on the last one.", "SchedulePage"),),
    _ABOUT,
    tag=_TAG,
    query=SCHEDULES_QUERY,
)
DELETE_SCHEDULE = Doc(
    "deleteSchedule",
    "Delete a schedule and its tick record",
    (Reply(204, "Deleted.", None),),
    "Its tasks stay. Once answered, it makes no task. " + _ABOUT,
    tag=_TAG,
    path_params=(NAME,),
)
TRIGGER_SCHEDULE = Doc(
    "triggerSchedule",
    "Run a schedule now",
    (Reply(200, "The tick decided now.", "ScheduleTick"),),
    "A tick at the server's time, under the schedule's overlap policy (`skip` records "
    "it as skipped_overlap while the previous task is queued or running), paused or not. "
    "Its next tick stays. " + _ABOUT,
    tag=_TAG,
    path_params=(NAME,),
    errors=(Conflict,),
)
PAUSE_SCHEDULE = Doc(
    "pauseSchedule",
    "Pause a schedule",
    (Reply(200, "The schedule, paused.", "Schedule"),),
    "Ticks that fall while it is paused are neither run nor recorded. The body is "
    "optional; its note is shown with the schedule. " + _ABOUT,
    tag=_TAG,
    body=SCHEDULE_PAUSE_BODY,
    path_params=(NAME,),
)
RESUME_SCHEDULE = Doc(
    "resumeSchedule",
    "Resume a paused schedule",
    (Reply(200, "The schedule, ticking from its next tick after now.", "Schedule"),),
    "Idempotent. " + _ABOUT,
    tag=_TAG,
    path_params=(NAME,),
)
BACKFILL_SCHEDULE = Doc(
    "backfillSchedule",
    "Enqueue the ticks of a past range",
    (Reply(200, "What the range held, and the ticks enqueued now.", "BackfillResult"),),
    f"Each tick in [start, end] (at most {MAX_BACKFILL_TICKS}) enqueues its task at most "
    "once: a tick whose task was made before (by a tick pass, or an earlier backfill) "
    "makes none; one recorded as skipped is enqueued now. No overlap policy applies. "
    "`start` may reach back GATEWAY_SCHEDULE_TICKS_DAYS, how long ticks are recorded. " + _ABOUT,
    tag=_TAG,
    body=BACKFILL_BODY,
    path_params=(NAME,),
)
