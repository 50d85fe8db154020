"""Documentation of the per-runtime history (handlers/history.py), beside docs.py's: the
operations `GET /v1/runtimes/{rt}/history` and `GET /v1/history`, and their answers'
schemas (with the listing's `DepthSparkline`), which the OpenAPI document adds to
answers.SCHEMAS. What each count means is docs/guides/history.md's.
"""

from __future__ import annotations

from typing import Any

from ..api.answers import TIME_SCHEMA
from ..api.decode import RUNTIME_ID_RE
from ..api.history import HISTORY_QUERY, SPARKLINE_SECONDS
from .docs import Doc, Reply

_COUNT = {"type": "integer", "minimum": 0}
_RUNTIME_ID = {"type": "string", "pattern": RUNTIME_ID_RE.pattern}
_WINDOW = {"$ref": "#/components/schemas/HistoryWindow"}
_INTERVAL = {
    "type": "integer",
    "minimum": 1,
    "description": "The width of a point's bucket in seconds (GATEWAY_HISTORY_INTERVAL_SECONDS).",
}
_SPARSE = (
    "Only buckets with activity have a point: a bucket without one had no task enqueued, "
    "claimed or finished, and its depth is the one of the point before it (apart from "
    "delayed tasks coming due)."
)
_WAIT = (
    "of the waits of the bucket's first claims (from enqueue, or from run_at for a delayed "
    "task, to the first claim), read from fixed wait buckets: the upper bound of the bucket "
    "it falls in (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800 or 3600 s; 3600 also "
    "stands for longer). Null when the bucket had no first claim."
)


def _counted(text: str) -> dict[str, Any]:
    return {**_COUNT, "description": text}


SCHEMAS: dict[str, dict[str, Any]] = {
    "HistoryWindow": {
        "type": "string",
        "enum": list(HISTORY_QUERY["window"].enum),
        "description": "How far back a history goes, from now: an hour, a day or a week.",
    },
    "RuntimeListInclude": {
        "type": "string",
        "enum": ["sparkline"],
        "description": "What the runtimes listing adds to each runtime: `sparkline`, its "
        "queue depth over the last hour.",
    },
    "HistoryPoint": {
        "type": "object",
        "description": "One bucket of time.",
        "required": [
            "at",
            "enqueued",
            "claimed",
            "completed",
            "failed",
            "dead",
            "expired",
            "cancelled",
            "depth",
            "oldest_queued_age_seconds",
            "claim_wait_p50_seconds",
            "claim_wait_p95_seconds",
        ],
        "properties": {
            "at": {**TIME_SCHEMA, "description": "The bucket's start."},
            "enqueued": _counted(
                "Tasks enqueued (one, a batch's, a webhook's, a schedule's tick), and finished "
                "tasks queued again by a retry."
            ),
            "claimed": _counted("Claims: tasks handed to a worker under a lease."),
            "completed": _counted("Tasks completed."),
            "failed": _counted(
                "Claimed tasks that went back to the queue for another attempt: a failure "
                "reported with a retry, a lease that lapsed, or a release."
            ),
            "dead": _counted(
                "Tasks that ended dead: a failure without a retry or on the last attempt, a "
                "lease that lapsed on the last attempt."
            ),
            "expired": _counted("Queued tasks that expired (ttl_seconds)."),
            "cancelled": _counted(
                "Tasks cancelled: queued ones at once, claimed ones when their holder reported."
            ),
            "depth": {
                "type": ["integer", "null"],
                "minimum": 0,
                "description": "Queued tasks (due or not yet due, not expired) just after "
                "the bucket ended; null for the bucket in progress, or when it was not read.",
            },
            "oldest_queued_age_seconds": {
                "type": ["number", "null"],
                "description": "The age of the oldest due queued task just after the bucket "
                "ended; null when none was due, or when it was not read.",
            },
            "claim_wait_p50_seconds": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "The median " + _WAIT,
            },
            "claim_wait_p95_seconds": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "The 95th percentile " + _WAIT,
            },
        },
        "additionalProperties": False,
    },
    "RuntimeHistory": {
        "type": "object",
        "required": ["runtime_id", "window", "interval_seconds", "points"],
        "properties": {
            "runtime_id": _RUNTIME_ID,
            "window": _WINDOW,
            "interval_seconds": _INTERVAL,
            "points": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/HistoryPoint"},
                "description": "Oldest first. " + _SPARSE,
            },
        },
        "additionalProperties": False,
    },
    "FleetHistory": {
        "type": "object",
        "required": ["window", "interval_seconds", "points", "top_by_depth", "top_by_failures"],
        "properties": {
            "window": _WINDOW,
            "interval_seconds": _INTERVAL,
            "points": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/HistoryPoint"},
                "description": "Oldest first, each summed over the runtimes the token covers "
                "that had activity in its bucket: their counts and their depths added, the "
                "greatest of their oldest ages, the wait percentiles of all their first "
                "claims. " + _SPARSE,
            },
            "top_by_depth": {
                "type": "array",
                "maxItems": 10,
                "description": "The 10 covered runtimes with the deepest queues, deepest "
                "first: each one's last depth read in the window.",
                "items": {
                    "type": "object",
                    "required": ["runtime_id", "depth"],
                    "properties": {"runtime_id": _RUNTIME_ID, "depth": _COUNT},
                    "additionalProperties": False,
                },
            },
            "top_by_failures": {
                "type": "array",
                "maxItems": 10,
                "description": "The 10 covered runtimes with the most failed and dead tasks "
                "together over the window, most first. Over 24h and 7d they are counted in "
                "whole hours (UTC), from the start of the hour in which the window begins.",
                "items": {
                    "type": "object",
                    "required": ["runtime_id", "failed", "dead"],
                    "properties": {"runtime_id": _RUNTIME_ID, "failed": _COUNT, "dead": _COUNT},
                    "additionalProperties": False,
                },
            },
        },
        "additionalProperties": False,
    },
    "DepthSparkline": {
        "type": "array",
        "description": f"With include=sparkline: the runtime's queue depth over the last "
        f"{SPARKLINE_SECONDS // 60} minutes, one point per bucket with activity, oldest "
        "first (its history's `depth`).",
        "items": {
            "type": "object",
            "required": ["at", "depth"],
            "properties": {
                "at": {**TIME_SCHEMA, "description": "The bucket's start."},
                "depth": _COUNT,
            },
            "additionalProperties": False,
        },
    },
}

_ABOUT = (
    "Counted in Postgres by the statements that change tasks, in their own transactions, "
    "per bucket of GATEWAY_HISTORY_INTERVAL_SECONDS, and kept GATEWAY_HISTORY_DAYS. "
    + _SPARSE
    + " The bucket in progress is counted so far; its depth is read once it has ended."
)

RUNTIME_HISTORY = Doc(
    "runtimeHistory",
    "What happened to a runtime's tasks, bucket by bucket",
    (Reply(200, "The runtime's points over the window.", "RuntimeHistory"),),
    _ABOUT + " Needs the `read` scope on the runtime. Another `window` is `422` naming it.",
    tag="producers",
    query=HISTORY_QUERY,
)
FLEET_HISTORY = Doc(
    "fleetHistory",
    "What happened to the tasks of every runtime the token covers, bucket by bucket",
    (Reply(200, "The covered runtimes' points and top lists over the window.", "FleetHistory"),),
    _ABOUT + " Needs the `read` scope. A token limited to runtime patterns is answered from "
    "the runtimes they cover alone: nothing in the answer comes from another runtime. "
    "Another `window` is `422` naming it.",
    tag="producers",
    query=HISTORY_QUERY,
)
