"""Typed rows: what the store hands upward. Routes, the claim path and the janitor
never see a driver's record, so the in-memory store of the simulation can stand in.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from .errors import GatewayError

# What Results.finished is told of a task deleted before it finished (a schedule's task
# decided ahead and withdrawn): the requests waiting for its result are woken too, and
# find it gone.
DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task as stored (store/sql/fragments.TASK_COLUMNS). `status` is the effective status: a
    queued task past `expires_at` reads as expired. `payload` and `result` are stored
    JSON, kept verbatim (an orjson.Fragment from the jsonb codec)."""

    id: uuid.UUID
    runtime_id: str
    status: str
    priority: int
    payload: Any
    attempts: int
    max_attempts: int
    run_at: datetime
    expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    lease_id: uuid.UUID | None
    lease_expires_at: datetime | None
    worker_id: str | None
    cancel_requested: bool
    result: Any
    last_error: str | None
    schedule: str | None = None  # the schedule that made it, and its tick's time
    scheduled_for: datetime | None = None
    trace_parent: str | None = None  # its trace context (api/trace.py), as sent
    trace_state: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> TaskRow:
        """From a record holding at least TASK_COLUMNS (extra columns are ignored)."""
        return cls(*[record[name] for name in _TASK_ROW_FIELDS])


_TASK_ROW_FIELDS = tuple(f.name for f in fields(TaskRow))


def as_enqueued(row: TaskRow) -> TaskRow:
    """A task written already leased (sync match), as it was before its lease: queued,
    no attempt, no lease."""
    return replace(
        row, status="queued", attempts=0, lease_id=None, lease_expires_at=None, worker_id=None
    )


@dataclass(frozen=True, slots=True)
class Leased:
    """A task a claim leased, and the slot (1-based) of the poll it is for."""

    slot: int
    task: TaskRow


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """A lapsed lease the janitor took back: the task's runtime and its new status
    (queued again, or dead when its attempts ran out)."""

    runtime_id: str
    status: str
    task_id: uuid.UUID | None = None  # for the wake-up of a wait for its result
    lease_id: uuid.UUID | None = None  # the lease that lapsed, and the task's trace
    trace: tuple[str | None, str | None] = (None, None)  # context, for the lease's span


@dataclass(frozen=True, slots=True)
class Controls:
    """One runtime's controls. A runtime without a stored row has NO_CONTROLS."""

    runtime_id: str
    paused: bool = False
    max_in_flight: int | None = None
    claims_per_second: float | None = None
    updated_at: datetime | None = None
    paused_reason: str | None = None
    paused_at: datetime | None = None  # the server's time of the pause
    paused_until: datetime | None = None  # the pause ends by itself then

    def paused_now(self, now: datetime | None = None) -> bool:
        """Paused and, if the pause has an end, not past it (`now`: wall clock, UTC)."""
        if not self.paused:
            return False
        return self.paused_until is None or self.paused_until > (now or datetime.now(UTC))

    @property
    def limited(self) -> bool:
        """True when its claims go through the limited claim (a transaction)."""
        return self.max_in_flight is not None or self.claims_per_second is not None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Controls:
        return cls(
            record["runtime_id"],
            record["paused"],
            record["max_in_flight"],
            record["claims_per_second"],
            record["updated_at"],
            record["paused_reason"],
            record["paused_at"],
            record["paused_until"],
        )


@dataclass(frozen=True, slots=True)
class ControlsChange:
    """What a request sets; None in `*_set` fields means "left as it is"."""

    paused: bool | None = None
    max_in_flight: int | None = None
    claims_per_second: float | None = None
    sets_max_in_flight: bool = False
    sets_claims_per_second: bool = False
    paused_reason: str | None = None  # with paused=True only
    paused_until: datetime | None = None  # with paused=True only


@dataclass(frozen=True, slots=True)
class LimitedClaim:
    """What a limited runtime's claim leased. `held`: a limit (or a pause) cut it
    short, and for how long the pump should park, in seconds, before claiming again
    without a wake-up; None when it looked for every slot (an empty verdict may then be
    written as usual)."""

    rows: list[Leased]
    due_in: float | None
    held: float | None


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item of a batch lease operation, in the request's order. `error` is what the
    single operation would have raised for it (LeaseLost, NotFound); else it is None
    and `status` is the task's status after the operation (effective, as answers show
    it). A fail sets `run_at`; a heartbeat `lease_expires_at` and `cancel_requested`.
    `runtime_id` is None for a task the caller cannot see: it counts as not found.
    `lease_id` is the item's lease when the operation was applied under it now (not a
    replay, not an error): the lease's span ends there (gateway/tracing/spans.py)."""

    task_id: uuid.UUID
    runtime_id: str | None
    status: str | None
    error: GatewayError | None = None
    run_at: datetime | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    lease_id: uuid.UUID | None = None  # the lease it applied under; None when not applied


def ended(results: Sequence[ItemResult]) -> list[tuple[uuid.UUID, str]]:
    """(id, status) of the items of a batch lease operation that succeeded, for the
    result wake-ups: the ones that finished a task wake the requests waiting for it."""
    return [(r.task_id, r.status) for r in results if r.error is None and r.status is not None]


@dataclass(frozen=True)
class CarriedCompletes:
    """Completes that claims carry, applied by the statement that claims for them
    (Store.claim_acked): task ids (distinct), lease ids, results (JSON text or None),
    and each item's caller's runtime patterns (None: every runtime; a task outside them
    is not found to that item, as in Store.complete_many)."""

    task_ids: Sequence[uuid.UUID]
    lease_ids: Sequence[uuid.UUID]
    results: Sequence[str | None]
    runtimes: Sequence[Sequence[str] | None]


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule as stored (store/sql/schedules.SCHEDULE_COLUMNS), with its last
    task's status as the API shows it (None: no task yet, or deleted by retention).
    `payload` is stored JSON, kept verbatim (an orjson.Fragment)."""

    id: int
    runtime_id: str
    name: str
    version: int
    cron: str | None
    every_seconds: int | None
    timezone: str
    payload: Any
    priority: int
    ttl_seconds: float | None
    max_attempts: int
    overlap: str
    catch_up_seconds: float
    jitter_seconds: float
    paused: bool
    note: str | None
    next_tick_at: datetime
    last_tick_at: datetime | None
    last_task_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    last_task_status: str | None
    # Its earliest tick decided ahead of its time and still to come (overlap allow), as
    # the API's reads give it; None when there is none, or not read.
    decided_ahead: datetime | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> ScheduleRow:
        values = {name: record[name] for name in _SCHEDULE_ROW_FIELDS}
        return cls(**values, decided_ahead=record.get("decided_ahead"))


_SCHEDULE_ROW_FIELDS = tuple(f.name for f in fields(ScheduleRow) if f.name != "decided_ahead")


@dataclass(frozen=True, slots=True)
class ScheduleWrite:
    """A schedule's stored definition as a PUT, a pause or a resume writes it, in the
    order of its columns (store/sql/schedules._DEFINITION). `bumps`: whether the
    definition changed, so that ticks computed from the old one make no task."""

    cron: str | None
    every_seconds: int | None
    timezone: str
    payload_json: str
    priority: int
    ttl_seconds: float | None
    max_attempts: int
    overlap: str
    catch_up_seconds: float
    jitter_seconds: float
    paused: bool
    note: str | None
    next_tick_at: datetime
    bumps: bool = True

    def columns(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self) if f.name != "bumps")


@dataclass(frozen=True, slots=True)
class PlannedTick:
    """A tick decided by the tick pass, a trigger or a backfill, before it is recorded:
    its schedule at the definition's `version` it was computed from, its time, its
    outcome (enqueued, skipped_overlap, skipped_late) and, when enqueued, the new
    task's id and when that task becomes due (the tick plus its jitter)."""

    schedule_id: int
    version: int
    tick_at: datetime
    outcome: str
    task_id: uuid.UUID | None = None
    run_at: datetime | None = None


@dataclass
class TickPlan:
    """What one transaction decides: the ticks, each schedule's next tick to come
    (`next_ticks`, by schedule id; absent: unchanged), and the live task a schedule
    with overlap cancel_previous replaces (`replaces`, by schedule id), cancelled only
    if the new task is made."""

    ticks: list[PlannedTick] = field(default_factory=list)
    next_ticks: dict[int, datetime] = field(default_factory=dict)
    replaces: dict[int, uuid.UUID] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DecidedTick:
    """A tick recorded now (one already decided before is never among them), and the
    runtime of the task it made (None unless enqueued)."""

    schedule_id: int
    tick_at: datetime
    outcome: str
    task_id: uuid.UUID | None
    runtime_id: str | None
    recorded_at: datetime | None = None  # the database's clock when it was recorded


@dataclass(frozen=True, slots=True)
class BulkChange:
    """What a bulk retry or cancel of a runtime's tasks did (store/bulk.py): how many
    tasks it changed, their ids when the caller needs them (a cancel's, for the waits on
    their results), and whether matching tasks were left (past the limit, or held by
    another statement at that instant)."""

    count: int
    more: bool
    task_ids: Sequence[uuid.UUID] = ()


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """The tasks among a runtime's recent ones that share an error line (the first line
    of `last_error`, at most 200 characters): how many, when the newest of them
    finished, and that task's id."""

    line: str
    count: int
    last_at: datetime
    example_task_id: uuid.UUID


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One bucket of the per-runtime history (store/history.py), or of the fleet's (its
    runtimes' summed): what happened to tasks in it, the queue depth and the oldest
    queued age read just after its end (None: not read), and the claim wait's
    percentiles in seconds (None: no first claim in it). `at` is the bucket's start."""

    at: datetime
    enqueued: int
    claimed: int
    completed: int
    failed: int
    dead: int
    expired: int
    cancelled: int
    depth: int | None
    oldest_queued_age_seconds: float | None
    claim_wait_p50_seconds: float | None
    claim_wait_p95_seconds: float | None


@dataclass(frozen=True, slots=True)
class RuntimeDepth:
    runtime_id: str
    depth: int


@dataclass(frozen=True, slots=True)
class RuntimeFailures:
    runtime_id: str
    failed: int
    dead: int


@dataclass(frozen=True, slots=True)
class FleetHistory:
    """GET /v1/history's reads: the summed points and the top runtimes, of the runtimes
    the caller may see alone."""

    points: list[HistoryPoint]
    top_by_depth: list[RuntimeDepth]
    top_by_failures: list[RuntimeFailures]


@dataclass(frozen=True, slots=True)
class DepthPoint:
    """A runtime's queue depth read just after the end of the bucket starting `at`."""

    at: datetime
    depth: int
