"""The schedules API's request bodies and query, declared once (see fields.py), and
their parsers: a schedule's definition (PUT), a pause's note, a backfill's range and
the listing's page. Each parser stores nothing and raises ValidationFailed naming the
field; the OpenAPI document describes the bodies from the same specs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import ValidationFailed
from ..timing import MAX_CRON_CHARS, MAX_EVERY_SECONDS, MAX_TIMEZONE_CHARS, Timing
from .bodies import ENQUEUE_BODY, JSON_DEPTH, PAYLOAD_BYTES
from .fields import Body, Field, Kind, read_query

SCHEDULE_NAME_MAX_CHARS = 64
# Letters, digits, `-`, `_` and `.`: no `:`, so that `…/{name}:trigger` is never
# ambiguous.
SCHEDULE_NAME_RE = re.compile(rf"^[A-Za-z0-9._-]{{1,{SCHEDULE_NAME_MAX_CHARS}}}$")
OVERLAPS = ("allow", "skip", "buffer_one", "cancel_previous")
MAX_NOTE_CHARS = 500
MAX_JITTER_SECONDS = 86400
# The most ticks one backfill enqueues; a longer range is refused, naming `end`.
MAX_BACKFILL_TICKS = 1000
SCHEDULES_MAX_LIMIT = 1000

_NOTE = Field(
    "note",
    Kind.STRING,
    "Why the schedule is as it is (paused, say), shown with it and in the console.",
    max_length=MAX_NOTE_CHARS,
)
SCHEDULE_BODY = Body(
    "ScheduleDefinition",
    "A schedule: when it ticks (`cron` or `every_seconds`), the task each tick enqueues, "
    "and its policies. A PUT replaces the whole definition; fields left out take their "
    "defaults.",
    (
        Field(
            "cron",
            Kind.STRING,
            "5 fields (minute hour day-of-month month day-of-week), or 6 with seconds "
            "first, read on the wall clock of `timezone`. A cron that never fires "
            "(`0 0 30 2 *`) is refused. Not with every_seconds.",
            max_length=MAX_CRON_CHARS,
        ),
        Field(
            "every_seconds",
            Kind.INTEGER,
            "Ticks on multiples of this interval since the Unix epoch (UTC): 60 ticks on "
            "the minute. Not with cron.",
            minimum=1,
            maximum=MAX_EVERY_SECONDS,
        ),
        Field(
            "timezone",
            Kind.STRING,
            "The IANA time zone the cron is read in (`Europe/Paris`). A wall-clock time "
            "skipped when clocks spring forward runs once at the end of the gap; one that "
            "happens twice when they fall back runs once, at its first occurrence.",
            default="UTC",
            max_length=MAX_TIMEZONE_CHARS,
        ),
        ENQUEUE_BODY["payload"],
        ENQUEUE_BODY["priority"],
        ENQUEUE_BODY["ttl_seconds"],
        ENQUEUE_BODY["max_attempts"],
        Field(
            "overlap",
            Kind.STRING,
            "What a tick does while the schedule's previous task is queued or running: "
            "`skip` it (recorded as skipped_overlap), `allow` another task, `buffer_one` "
            "(enqueue one while the previous one runs, skip while one waits queued), or "
            "`cancel_previous` (cancel it and enqueue).",
            default="skip",
            enum=OVERLAPS,
            enum_name="ScheduleOverlap",
        ),
        Field(
            "catch_up_seconds",
            Kind.NUMBER,
            "After downtime, ticks older than this when the gateway decides them are "
            "skipped and recorded as skipped_late.",
            default=60.0,
            minimum=0,
            maximum=366 * 86400,
        ),
        Field(
            "jitter_seconds",
            Kind.NUMBER,
            "A tick's task becomes due up to this many seconds after the tick (random); "
            "its scheduled_for keeps the tick's time.",
            default=0.0,
            minimum=0,
            maximum=MAX_JITTER_SECONDS,
        ),
        Field("paused", Kind.BOOLEAN, "While true, the schedule ticks not.", default=False),
        _NOTE,
    ),
    exclusive=(("cron", "every_seconds"),),
    one_of=("cron", "every_seconds"),
    closed=True,
    example={"cron": "0 3 * * *", "timezone": "Europe/Paris", "payload": {"job": "nightly"}},
)
SCHEDULE_PAUSE_BODY = Body(
    "SchedulePause",
    "Why the schedule is paused; optional, and so is the body.",
    (_NOTE,),
    closed=True,
    example={"note": "until the migration is done"},
)
BACKFILL_BODY = Body(
    "ScheduleBackfill",
    "A past range whose ticks to enqueue.",
    (
        Field(
            "start", Kind.TIME, "The range's first instant (RFC 3339 with a zone).", required=True
        ),
        Field(
            "end",
            Kind.TIME,
            "The range's last instant, not in the future; its ticks are at most "
            f"{MAX_BACKFILL_TICKS}.",
            required=True,
        ),
    ),
    closed=True,
    example={"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z"},
)
SCHEDULES_QUERY = Body(
    "SchedulesQuery",
    "A page of a runtime's schedules, in name order.",
    (
        Field(
            "limit",
            Kind.INTEGER,
            "Schedules per page.",
            default=100,
            minimum=1,
            maximum=SCHEDULES_MAX_LIMIT,
        ),
        Field("cursor", Kind.STRING, "The next_cursor of the previous page.", max_length=64),
    ),
)


def check_schedule_name(name: str) -> str:
    if not SCHEDULE_NAME_RE.fullmatch(name):
        raise ValidationFailed(
            f"a schedule name is 1-{SCHEDULE_NAME_MAX_CHARS} characters of letters, digits, "
            "- _ and .",
            field="name",
        )
    return name


@dataclass(frozen=True)
class ScheduleDefinition:
    """A PUT's schedule as understood: its timing checked, its payload as JSON text."""

    timing: Timing
    payload_json: str
    priority: int
    ttl_seconds: float | None
    max_attempts: int
    overlap: str
    catch_up_seconds: float
    jitter_seconds: float
    paused: bool
    note: str | None


def parse_schedule(
    body: Any, max_payload_bytes: int, max_depth: int, now: datetime | None = None
) -> ScheduleDefinition:
    """A PUT body, or 422 naming the field. `now` (the wall clock) dates the check that
    a cron fires at all."""
    SCHEDULE_BODY.check_fields(body)
    SCHEDULE_BODY.check_exclusive(body)
    limits = {PAYLOAD_BYTES.name: max_payload_bytes, JSON_DEPTH.name: max_depth}
    values = {f.name: f.read(body, limits) for f in SCHEDULE_BODY.fields}
    for f in SCHEDULE_BODY.fields:  # a string field's reader leaves its default to us
        if values[f.name] is None and f.kind is Kind.STRING:
            values[f.name] = f.default
    if values["overlap"] not in OVERLAPS:
        raise ValidationFailed(f"overlap must be one of {', '.join(OVERLAPS)}", field="overlap")
    if values["cron"] is None and values["every_seconds"] is None:
        raise ValidationFailed("give cron or every_seconds", field="cron")
    timing = Timing.checked(
        values["cron"], values["every_seconds"], values["timezone"], now or datetime.now(UTC)
    )
    return ScheduleDefinition(
        timing=timing,
        payload_json=values["payload"],
        priority=values["priority"],
        ttl_seconds=values["ttl_seconds"],
        max_attempts=values["max_attempts"],
        overlap=values["overlap"],
        catch_up_seconds=values["catch_up_seconds"],
        jitter_seconds=values["jitter_seconds"],
        paused=values["paused"],
        note=values["note"],
    )


def parse_schedule_pause(body: Any) -> str | None:
    """A pause's note ({} when the body is empty), or 422 naming the field."""
    SCHEDULE_PAUSE_BODY.check_fields(body)
    note: str | None = _NOTE.read(body, {})
    return note


def parse_backfill(body: Any, ticks_days: int, now: datetime) -> tuple[datetime, datetime]:
    """A backfill's (start, end), or 422 naming the field: start before end, end not
    after `now` (the database's clock), start within the tick record's `ticks_days`."""
    BACKFILL_BODY.check_fields(body)
    start: datetime = BACKFILL_BODY["start"].read(body, {})
    end: datetime = BACKFILL_BODY["end"].read(body, {})
    if end > now:
        raise ValidationFailed("end must not be in the future", field="end")
    if start > end:
        raise ValidationFailed("start must not be after end", field="start")
    if (now - start).total_seconds() > ticks_days * 86400:
        raise ValidationFailed(
            f"start must be within the last {ticks_days} days (GATEWAY_SCHEDULE_TICKS_DAYS): "
            "older ticks are no longer recorded, so a backfill could not run each once",
            field="start",
        )
    return start, end


def parse_schedules_query(params: Mapping[str, str]) -> tuple[int, str]:
    """The listing's (limit, the name to start after)."""
    limit: int = read_query(SCHEDULES_QUERY["limit"], params, {})
    cursor: str | None = read_query(SCHEDULES_QUERY["cursor"], params, {})
    return limit, cursor or ""
