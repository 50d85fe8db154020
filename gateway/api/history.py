"""The history API's query and JSON forms (GET /v1/runtimes/{rt}/history, GET
/v1/history, and the listing's `include=sparkline`; docs/guides/history.md): the
`window` a request reads, declared once (see fields.py), and the answers' points.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rows import DepthPoint, FleetHistory, HistoryPoint
from .fields import Body, Field, Kind, read_query
from .render import format_time

# Each window a request may name, in seconds.
WINDOWS = {"1h": 3600, "24h": 86400, "7d": 7 * 86400}
# What the listing's sparkline covers, in seconds.
SPARKLINE_SECONDS = 3600

HISTORY_QUERY = Body(
    "HistoryQuery",
    "The stretch of time the history covers.",
    (
        Field(
            "window",
            Kind.STRING,
            "How far back the points go, from now: the last hour (`1h`), day (`24h`) or "
            "week (`7d`).",
            default="1h",
            enum=tuple(WINDOWS),
            enum_name="HistoryWindow",
        ),
    ),
)


def parse_window(params: Mapping[str, str]) -> str:
    """The `window` asked for (1h when none), or ValidationFailed naming `window`."""
    field = HISTORY_QUERY["window"]
    window: str | None = read_query(field, params, {})
    # A STRING field's reader leaves its default to the caller.
    return field.default if window is None else window


def point_json(point: HistoryPoint) -> dict[str, Any]:
    return {
        "at": format_time(point.at),
        "enqueued": point.enqueued,
        "claimed": point.claimed,
        "completed": point.completed,
        "failed": point.failed,
        "dead": point.dead,
        "expired": point.expired,
        "cancelled": point.cancelled,
        "depth": point.depth,
        "oldest_queued_age_seconds": point.oldest_queued_age_seconds,
        "claim_wait_p50_seconds": point.claim_wait_p50_seconds,
        "claim_wait_p95_seconds": point.claim_wait_p95_seconds,
    }


def fleet_json(window: str, interval_seconds: int, fleet: FleetHistory) -> dict[str, Any]:
    return {
        "window": window,
        "interval_seconds": interval_seconds,
        "points": [point_json(p) for p in fleet.points],
        "top_by_depth": [
            {"runtime_id": r.runtime_id, "depth": r.depth} for r in fleet.top_by_depth
        ],
        "top_by_failures": [
            {"runtime_id": r.runtime_id, "failed": r.failed, "dead": r.dead}
            for r in fleet.top_by_failures
        ],
    }


def sparkline_json(points: list[DepthPoint]) -> list[dict[str, Any]]:
    return [{"at": format_time(p.at), "depth": p.depth} for p in points]
