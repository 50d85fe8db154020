"""Typed views of the gateway's JSON: a task, a listing page, a runtime's counts, and
a task to enqueue. Times stay RFC 3339 strings (UTC, microseconds, `Z`), as the
gateway sends them, so that they compare as strings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUSES = ("queued", "claimed", "completed", "dead", "expired", "cancelled")


@dataclass(frozen=True)
class Task:
    """One task. `lease_id`, `lease_expires_at`, `worker_id` and `cancel_requested`
    are set while it is claimed; `result` once completed; `last_error` after a failure."""

    id: str
    runtime_id: str
    status: str
    priority: int
    payload: Any
    attempts: int
    max_attempts: int
    run_at: str | None = None
    expires_at: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    lease_id: str | None = None
    lease_expires_at: str | None = None
    worker_id: str | None = None
    cancel_requested: bool = False
    result: Any = None
    last_error: str | None = None
    # Set instead of the payload when the gateway could not show this task whole.
    render_error: str | None = None
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
            run_at=data.get("run_at"),
            expires_at=data.get("expires_at"),
            created_at=data.get("created_at"),
            updated_at=data.get("updated_at"),
            lease_id=data.get("lease_id"),
            lease_expires_at=data.get("lease_expires_at"),
            worker_id=data.get("worker_id"),
            cancel_requested=bool(data.get("cancel_requested", False)),
            result=data.get("result"),
            last_error=data.get("last_error"),
            render_error=data.get("render_error"),
            raw=data,
        )


@dataclass(frozen=True)
class Page:
    """One page of a listing, oldest first; `next_cursor` is None at the end."""

    tasks: list[Task]
    next_cursor: str | None


@dataclass(frozen=True)
class Stats:
    runtime_id: str
    counts: dict[str, int]
    oldest_queued_age_seconds: float | None
    parked_pollers: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            runtime_id=data["runtime_id"],
            counts=dict(data["counts"]),
            oldest_queued_age_seconds=data.get("oldest_queued_age_seconds"),
            parked_pollers=data.get("parked_pollers", 0),
        )


@dataclass(frozen=True)
class NewTask:
    """A task to enqueue. Give at most one of `delay_seconds` and `run_at`."""

    payload: Any
    priority: int | None = None
    idempotency_key: str | None = None
    delay_seconds: float | None = None
    run_at: str | None = None
    ttl_seconds: float | None = None
    max_attempts: int | None = None

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
                body[name] = value
        return body


# -- the runtimes listing (GET /v1/runtimes) ----------------------------------------------


@dataclass(frozen=True)
class RuntimeSummary:
    """A runtime with live tasks: `queued` counts due and not-yet-due tasks; the age is
    in seconds (None when no queued task is due); parked pollers are the answering
    instance's."""

    runtime_id: str
    queued: int
    claimed: int
    oldest_queued_age_seconds: float | None
    parked_pollers: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuntimeSummary:
        return cls(
            runtime_id=data["runtime_id"],
            queued=data["queued"],
            claimed=data["claimed"],
            oldest_queued_age_seconds=data.get("oldest_queued_age_seconds"),
            parked_pollers=data.get("parked_pollers", 0),
        )


@dataclass(frozen=True)
class RuntimePage:
    """One page of runtimes in id order; `next_cursor` is None at the end. A token limited
    to runtime patterns may get a short or empty page that still has a next_cursor."""

    runtimes: list[RuntimeSummary]
    next_cursor: str | None
