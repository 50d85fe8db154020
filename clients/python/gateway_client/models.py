"""Typed views of the gateway's JSON: a task (with its trace context), a listing page, a
runtime's counts, and a task to enqueue. Times are timezone-aware `datetime`s (in UTC),
parsed from the RFC 3339 strings the gateway sends; statuses and outcomes are `Literal`
strings."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args

# A task's status. A status this client does not know yet (from a newer gateway) is
# kept as sent.
TaskStatus = Literal["queued", "claimed", "completed", "dead", "expired", "cancelled"]
STATUSES: tuple[TaskStatus, ...] = get_args(TaskStatus)
# What a batch call (complete_many, fail_many, heartbeat_many) did with one item; the
# last two are refusals.
ItemOutcomeKind = Literal[
    "completed", "cancelled", "queued", "dead", "extended", "lease_lost", "not_found"
]


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 time from the gateway as an aware datetime (None stays None)."""
    if value is None:
        return None
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time {value!r} has no UTC offset; RFC 3339 times always have one")
    return parsed


def format_time(value: datetime | str) -> str:
    """A time for the gateway: an aware datetime as RFC 3339 in UTC; a string as given
    (the gateway checks it). A naive datetime is refused: its zone would be a guess."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"the time {value.isoformat()} has no time zone: give an aware datetime, "
            "e.g. datetime.now(UTC)"
        )
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class TraceContext:
    """A task's W3C trace context, as the producer's request carried it: `traceparent`
    (`00-<trace id>-<parent span id>-<flags>`, in hex) and `tracestate` (the tracing
    vendors' own entries, or None). The gateway stores it with the task and answers it
    back unchanged; this client sends and reads it as given, and leaves checking it to
    the gateway, which ignores a malformed value rather than refuse the request."""

    traceparent: str
    tracestate: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> TraceContext | None:
        """The task's `trace` object; None when it has none (or one without a
        traceparent, which no tracer could continue)."""
        if not isinstance(data, dict) or not isinstance(data.get("traceparent"), str):
            return None
        tracestate = data.get("tracestate")
        return cls(data["traceparent"], tracestate if isinstance(tracestate, str) else None)

    def to_json(self) -> dict[str, str]:
        """As the gateway reads it: as a batch item's `trace`, and (the same names) as
        an enqueue's headers."""
        out = {"traceparent": self.traceparent}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


@dataclass(frozen=True)
class Task:
    """One task. `lease_id`, `lease_expires_at`, `worker_id` and `cancel_requested`
    are set while it is claimed; `result` once completed; `last_error` after a failure;
    `trace` when its producer's request carried a trace context."""

    id: str
    runtime_id: str
    status: TaskStatus
    priority: int
    payload: Any
    attempts: int
    max_attempts: int
    run_at: datetime | None = None
    expires_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    lease_id: str | None = None
    lease_expires_at: datetime | None = None
    worker_id: str | None = None
    cancel_requested: bool = False
    result: Any = None
    last_error: str | None = None
    # Set instead of the payload when the gateway could not show this task whole.
    render_error: str | None = None
    # The schedule that made it (its name) and its tick's time; None for other tasks.
    schedule: str | None = None
    scheduled_for: datetime | None = None
    trace: TraceContext | None = None
    # The task object exactly as received, for fields this client does not know yet.
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        return cls(
            id=data["id"],
            runtime_id=data["runtime_id"],
            status=data["status"],
            priority=data["priority"],
            payload=data.get("payload"),
            attempts=data["attempts"],
            max_attempts=data["max_attempts"],
            run_at=parse_time(data.get("run_at")),
            expires_at=parse_time(data.get("expires_at")),
            created_at=parse_time(data.get("created_at")),
            updated_at=parse_time(data.get("updated_at")),
            lease_id=data.get("lease_id"),
            lease_expires_at=parse_time(data.get("lease_expires_at")),
            worker_id=data.get("worker_id"),
            cancel_requested=bool(data.get("cancel_requested", False)),
            result=data.get("result"),
            last_error=data.get("last_error"),
            schedule=data.get("schedule"),
            scheduled_for=parse_time(data.get("scheduled_for")),
            render_error=data.get("render_error"),
            trace=TraceContext.from_json(data.get("trace")),
            raw=data,
        )


@dataclass(frozen=True)
class Page:
    """One page of a listing, oldest first; `next_cursor` is None at the end."""

    tasks: list[Task]
    next_cursor: str | None


@dataclass(frozen=True)
class Stats:
    """A runtime's tasks by status (`counts`), the age in seconds of its oldest due
    queued task, the claims parked on it, and its pause."""

    runtime_id: str
    counts: dict[TaskStatus, int]
    oldest_queued_age_seconds: float | None
    parked_pollers: int
    paused: bool = False
    paused_reason: str | None = None  # these three: None unless paused
    paused_since: datetime | None = None
    paused_until: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            runtime_id=data["runtime_id"],
            counts=dict(data["counts"]),
            oldest_queued_age_seconds=data.get("oldest_queued_age_seconds"),
            parked_pollers=data.get("parked_pollers", 0),
            paused=data.get("paused", False),
            paused_reason=data.get("paused_reason"),
            paused_since=parse_time(data.get("paused_since")),
            paused_until=parse_time(data.get("paused_until")),
        )


@dataclass(frozen=True)
class NewTask:
    """A task to enqueue. Give at most one of `delay_seconds` and `run_at` (an aware
    datetime, or an RFC 3339 string with its offset). `trace`: this task's own trace
    context, which in a batch wins over the request's (see `enqueue_batch`)."""

    payload: Any
    priority: int | None = None
    idempotency_key: str | None = None
    delay_seconds: float | None = None
    run_at: datetime | str | None = None
    ttl_seconds: float | None = None
    max_attempts: int | None = None
    trace: TraceContext | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"payload": self.payload}
        for name in (
            "priority",
            "idempotency_key",
            "delay_seconds",
            "run_at",
            "ttl_seconds",
            "max_attempts",
        ):
            value = getattr(self, name)
            if value is not None:
                body[name] = format_time(value) if name == "run_at" else value
        if self.trace is not None:
            body["trace"] = self.trace.to_json()
        return body


# -- batch lease operations --------------------------------------------------------

# Outcomes that are not the task's: the item was refused, with the problem the single
# call would have raised.
REFUSED_OUTCOMES: tuple[ItemOutcomeKind, ...] = ("lease_lost", "not_found")


@dataclass(frozen=True)
class Completion:
    """One item of `complete_many`: the task, its lease, and an optional result."""

    task_id: str
    lease_id: str
    result: Any = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.task_id, "lease_id": self.lease_id}
        if self.result is not None:
            body["result"] = self.result
        return body


@dataclass(frozen=True)
class Failure:
    """One item of `fail_many`, as the arguments of `fail`."""

    task_id: str
    lease_id: str
    error: str
    retry: bool = True
    retry_after_seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.task_id,
            "lease_id": self.lease_id,
            "error": self.error,
            "retry": self.retry,
        }
        if self.retry_after_seconds is not None:
            body["retry_after_seconds"] = self.retry_after_seconds
        return body


@dataclass(frozen=True)
class Beat:
    """One item of `heartbeat_many`; `lease_seconds` None: the gateway's default."""

    task_id: str
    lease_id: str
    lease_seconds: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.task_id, "lease_id": self.lease_id}
        if self.lease_seconds is not None:
            body["lease_seconds"] = self.lease_seconds
        return body


@dataclass(frozen=True)
class ItemOutcome:
    """What a batch call did with one item. `outcome`: `completed` or `cancelled`
    (complete); `queued` (with `run_at`), `dead` or `cancelled` (fail); `extended`
    (heartbeat, with `lease_expires_at` and `cancel_requested`); or, for a refused item,
    `lease_lost` or `not_found` with `problem`, the problem the single call answers."""

    id: str
    outcome: ItemOutcomeKind
    run_at: datetime | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False
    problem: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def refused(self) -> bool:
        return self.outcome in REFUSED_OUTCOMES

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemOutcome:
        return cls(
            id=data["id"],
            outcome=data["outcome"],
            run_at=parse_time(data.get("run_at")),
            lease_expires_at=parse_time(data.get("lease_expires_at")),
            cancel_requested=bool(data.get("cancel_requested", False)),
            problem=data.get("problem"),
            raw=data,
        )


class Claimed(list[Task]):
    """A claim's answer: its tasks (a list, as a claim always answered) and, when the
    claim carried reports (`complete`, `fail`), what became of them: `acks`, one
    ItemOutcome per report, those of `complete` first, each in the order given; and
    `retry_after_seconds`, set when the claim handed out nothing because it was refused
    (overloaded, shutting down) or its runtime is held back (paused, at a limit): claim
    again after that many seconds. The reports are applied whatever became of the claim."""

    def __init__(
        self,
        tasks: Iterable[Task] = (),
        acks: list[ItemOutcome] | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(tasks)
        self.acks: list[ItemOutcome] = acks or []
        self.retry_after_seconds = retry_after_seconds

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Claimed:
        return cls(
            [Task.from_json(t) for t in data["tasks"]],
            [ItemOutcome.from_json(a) for a in data.get("acks", [])],
            data.get("retry_after_seconds"),
        )


# -- the runtimes listing (GET /v1/runtimes) ----------------------------------------------


@dataclass(frozen=True)
class RuntimeSummary:
    """A runtime with live tasks: `queued` counts due and not-yet-due tasks; the age is
    in seconds (None when no queued task is due); parked pollers and
    `claims_per_minute` (tasks handed out in the last minute) are over every instance."""

    runtime_id: str
    queued: int
    claimed: int
    oldest_queued_age_seconds: float | None
    parked_pollers: int
    paused: bool = False
    dead: int = 0  # its tasks ended dead and not yet deleted by retention
    claims_per_minute: int = 0  # tasks handed out in the last minute, every instance
    # The queue depth over the last hour (list_runtimes(include_sparkline=True)), else None.
    sparkline: list[DepthPoint] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuntimeSummary:
        line = data.get("sparkline")
        return cls(
            runtime_id=data["runtime_id"],
            queued=data["queued"],
            claimed=data["claimed"],
            oldest_queued_age_seconds=data.get("oldest_queued_age_seconds"),
            parked_pollers=data.get("parked_pollers", 0),
            paused=data.get("paused", False),
            dead=data.get("dead", 0),
            claims_per_minute=data.get("claims_per_minute", 0),
            sparkline=None if line is None else [DepthPoint.from_json(p) for p in line],
        )


@dataclass(frozen=True)
class DepthPoint:
    """A runtime's queue depth read just after the bucket starting `at` ended (its
    history's `depth`); a bucket without activity has no point."""

    at: datetime
    depth: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DepthPoint:
        at = parse_time(data["at"])
        assert at is not None
        return cls(at, data["depth"])


@dataclass(frozen=True)
class RuntimePage:
    """One page of runtimes in id order; `next_cursor` is None at the end. A token limited
    to runtime patterns may get a short or empty page that still has a next_cursor."""

    runtimes: list[RuntimeSummary]
    next_cursor: str | None


class Keep(enum.Enum):
    """The type of KEEP: a control left as it is by set_controls."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True)
class Controls:
    """A runtime's controls. While `paused`, claims hand out nothing (enqueues work);
    `max_in_flight` bounds its tasks leased at once over every gateway instance,
    `claims_per_second` the tasks leased per second (burst: one second's worth). None:
    no limit. `updated_at` is None for a runtime never changed. While paused,
    `paused_reason`, `paused_since` and `paused_until` describe the pause; a pause past
    its `paused_until` reads as not paused."""

    runtime_id: str
    paused: bool
    max_in_flight: int | None
    claims_per_second: float | None
    updated_at: datetime | None
    paused_reason: str | None = None
    paused_since: datetime | None = None
    paused_until: datetime | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Controls:
        return cls(
            runtime_id=data["runtime_id"],
            paused=data["paused"],
            max_in_flight=data.get("max_in_flight"),
            claims_per_second=data.get("claims_per_second"),
            updated_at=parse_time(data.get("updated_at")),
            paused_reason=data.get("paused_reason"),
            paused_since=parse_time(data.get("paused_since")),
            paused_until=parse_time(data.get("paused_until")),
        )

    def to_json(self) -> dict[str, Any]:
        """The controls as the gateway answers them, times as RFC 3339 strings in UTC."""
        out: dict[str, Any] = {}
        for name, value in vars(self).items():
            out[name] = format_time(value) if isinstance(value, datetime) else value
        return out
