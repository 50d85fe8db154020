"""A runtime's history and the fleet's (GET /v1/runtimes/{rt}/history, GET /v1/history):
their typed views (`HistoryPoint`, `RuntimeHistory`, `FleetHistory`) and the calls that
read them (`HistoryCalls`, which `AsyncClient` is made of). Both need the `read` scope;
the fleet's covers the runtimes the token covers, and no other."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ..models import parse_time
from ..paths import runtime_path
from .base import Calls

# How far back a history goes, from now.
Window = Literal["1h", "24h", "7d"]


@dataclass(frozen=True)
class HistoryPoint:
    """One bucket of time, from `at` on: what happened to tasks in it, the queue depth
    and the oldest queued age (seconds) read just after it ended (None for the bucket in
    progress, or when not read), and the claim wait's median and 95th percentile in
    seconds (None when nothing was claimed for the first time in it). A bucket without
    activity has no point."""

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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HistoryPoint:
        at = parse_time(data["at"])
        assert at is not None
        return cls(
            at=at,
            enqueued=data["enqueued"],
            claimed=data["claimed"],
            completed=data["completed"],
            failed=data["failed"],
            dead=data["dead"],
            expired=data["expired"],
            cancelled=data.get("cancelled", 0),
            depth=data.get("depth"),
            oldest_queued_age_seconds=data.get("oldest_queued_age_seconds"),
            claim_wait_p50_seconds=data.get("claim_wait_p50_seconds"),
            claim_wait_p95_seconds=data.get("claim_wait_p95_seconds"),
        )


@dataclass(frozen=True)
class RuntimeHistory:
    """A runtime's points over the window, oldest first; `interval_seconds` is the width
    of a point's bucket."""

    runtime_id: str
    window: str
    interval_seconds: int
    points: list[HistoryPoint]


@dataclass(frozen=True)
class FleetHistory:
    """The points of every runtime the token covers, summed, oldest first, and the 10 of
    those runtimes with the deepest queues ({runtime_id: depth}) and with the most
    failures ({runtime_id: (failed, dead)}), in that order."""

    window: str
    interval_seconds: int
    points: list[HistoryPoint]
    top_by_depth: dict[str, int]
    top_by_failures: dict[str, tuple[int, int]]


class HistoryCalls(Calls):
    """The history calls of `AsyncClient` (client.py), which supplies `request`."""

    async def runtime_history(self, runtime: str, window: Window = "1h") -> RuntimeHistory:
        """What happened to the runtime's tasks over the last hour, day or week."""
        _, data, _ = await self.request(
            "GET", runtime_path(runtime, "/history"), params={"window": window}
        )
        return RuntimeHistory(
            data["runtime_id"],
            data["window"],
            data["interval_seconds"],
            [HistoryPoint.from_json(p) for p in data["points"]],
        )

    async def fleet_history(self, window: Window = "1h") -> FleetHistory:
        """What happened to the tasks of every runtime the token covers, summed, with
        the runtimes that stand out."""
        _, data, _ = await self.request("GET", "/v1/history", params={"window": window})
        return FleetHistory(
            data["window"],
            data["interval_seconds"],
            [HistoryPoint.from_json(p) for p in data["points"]],
            {r["runtime_id"]: r["depth"] for r in data["top_by_depth"]},
            {r["runtime_id"]: (r["failed"], r["dead"]) for r in data["top_by_failures"]},
        )
