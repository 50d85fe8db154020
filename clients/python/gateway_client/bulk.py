"""A runtime's tasks retried or cancelled in bulk, and its most common errors: their
typed views (`BulkOutcome`, `ErrorGroup`, `ErrorGroups`) and the calls (`BulkCalls`,
which `AsyncClient` is made of). Retrying and cancelling need a token with the
`enqueue` scope on the runtime, reading the groups the `read` scope."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .calls.base import Calls
from .models import parse_time
from .paths import runtime_path

# The statuses a retry takes; a bulk cancel takes queued tasks only.
RetryableStatus = Literal["dead", "expired", "cancelled"]


@dataclass(frozen=True)
class BulkOutcome:
    """What one bulk call did: how many tasks it retried (or cancelled), and whether
    matching tasks were left (beyond its limit, or held by another request at that
    instant): call again to go on."""

    count: int
    more: bool


@dataclass(frozen=True)
class ErrorGroup:
    """The tasks that share an error line (the first line of their last error, at most
    200 characters): how many, when the newest of them finished, and its id. `error`
    is an `error_prefix` for `retry_tasks`."""

    error: str
    count: int
    last_at: datetime
    example_task_id: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorGroup:
        last_at = parse_time(data["last_at"])
        assert last_at is not None
        return cls(data["error"], data["count"], last_at, data["example_task_id"])


@dataclass(frozen=True)
class ErrorGroups:
    """A runtime's most common error lines among its newest `tasks_read` tasks, most
    common first; `truncated`: it may hold older tasks, which they do not count."""

    runtime_id: str
    status: str
    groups: list[ErrorGroup]
    tasks_read: int
    truncated: bool


class BulkCalls(Calls):
    """The bulk calls of `AsyncClient` (client.py), which supplies `request`."""

    async def retry_tasks(
        self,
        runtime: str,
        status: RetryableStatus,
        *,
        error_prefix: str | None = None,
        limit: int | None = None,
    ) -> BulkOutcome:
        """Queues again up to `limit` (1 to 1000; left out, 1000) of the runtime's
        tasks in `status`, each as `retry` does one; with `error_prefix`, only those
        whose last error starts with it (literally, case-sensitive). Not idempotent:
        each call acts on what matches when it runs."""
        body: dict[str, Any] = {"status": status}
        if error_prefix is not None:
            body["error_prefix"] = error_prefix
        if limit is not None:
            body["limit"] = limit
        _, data, _ = await self.request("POST", runtime_path(runtime, "/tasks:retry"), body)
        return BulkOutcome(data["retried"], data["more"])

    async def cancel_tasks(
        self, runtime: str, status: Literal["queued"] = "queued", *, limit: int | None = None
    ) -> BulkOutcome:
        """Cancels up to `limit` (1 to 1000; left out, 1000) of the runtime's queued
        tasks, each as `cancel` does a queued one. Claimed tasks are not taken."""
        body: dict[str, Any] = {"status": status}
        if limit is not None:
            body["limit"] = limit
        _, data, _ = await self.request("POST", runtime_path(runtime, "/tasks:cancel"), body)
        return BulkOutcome(data["cancelled"], data["more"])

    async def error_groups(
        self, runtime: str, status: RetryableStatus = "dead", *, limit: int | None = None
    ) -> ErrorGroups:
        """The runtime's `limit` (1 to 100; left out, 20) most common error lines among
        its tasks in `status`."""
        params = {"status": status, **({"limit": str(limit)} if limit is not None else {})}
        _, data, _ = await self.request("GET", runtime_path(runtime, "/errors"), params=params)
        return ErrorGroups(
            data["runtime_id"],
            data["status"],
            [ErrorGroup.from_json(g) for g in data["groups"]],
            data["tasks_read"],
            data["truncated"],
        )
