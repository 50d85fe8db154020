"""Typed rows: what the store hands upward. Routes, the claim path and the janitor
never see a driver's record, so the in-memory store of the simulation can stand in.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task as stored (queries.TASK_COLUMNS). `status` is the effective status: a
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
