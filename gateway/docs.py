"""What the API answers, and each operation's documentation.

The JSON Schemas of every answer body are written here, once. Request bodies are not:
they come from the field specs in bodies.py. Each Endpoint in routes.py carries one of
the `Doc`s below; openapi.py turns them into the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import bodies
from .controls import (
    CONTROLS_BODY,
    MAX_CLAIMS_PER_SECOND,
    MAX_IN_FLIGHT,
    MAX_PAUSE_REASON,
    PAUSE_BODY,
    REFRESH_SECONDS,
)
from .errors import Conflict, Draining, GatewayError, IdempotencyKeyReused, LeaseLost, Overloaded
from .models import LEASE_FIELDS, RUNTIME_ID_RE, TASK_FIELDS
from .results import WAIT_QUERY
from .runtimes import MAX_LIMIT as MAX_RUNTIMES_LIMIT
from .runtimes import PATTERN_WALK, RUNTIMES_QUERY
from .schema import Body, Field, RawBody


@dataclass(frozen=True)
class Param:
    """A path parameter or a response header."""

    name: str
    description: str
    schema: Mapping[str, Any]
    required: bool = False


@dataclass(frozen=True)
class Reply:
    """A success answer (or any answer that is not problem+json)."""

    status: int
    description: str
    schema: str | Mapping[str, Any] | None  # a name in SCHEMAS, a JSON Schema, or no body
    media_type: str = "application/json"
    headers: tuple[Param, ...] = ()


@dataclass(frozen=True)
class Doc:
    """An operation's documentation. The error answers are derived from the endpoint
    (authentication, path, body) plus `errors`, the ones its handler raises itself."""

    operation_id: str
    summary: str
    replies: tuple[Reply, ...]
    description: str = ""
    tag: str = "operations"
    body: Body | RawBody | None = None
    query: Body | None = None
    headers: tuple[Field, ...] = ()  # request headers
    path_params: tuple[Param, ...] = ()  # beyond the shared ones, see openapi.PATH_PARAMS
    errors: tuple[type[GatewayError], ...] = ()


# -- answer bodies ------------------------------------------------------------------------

_UUID = {"type": "string", "format": "uuid"}
_TIME = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$",
    "description": "RFC 3339 UTC with microseconds and a Z: times compare as strings.",
}
_COUNT = {"type": "integer", "minimum": 0}
_PAUSED = {"type": "boolean", "description": "Paused: claims hand out nothing (runtime controls)."}
# The pause's details beside `paused` (controls and stats): all null unless paused.
_PAUSE_DETAILS: dict[str, Any] = {
    "paused_reason": {
        "type": ["string", "null"],
        "maxLength": MAX_PAUSE_REASON,
        "description": "Why the runtime is paused, as given to the pause; null if none.",
    },
    "paused_since": {
        **_TIME,
        "type": ["string", "null"],
        "description": "When the pause began (the server's time); null unless paused.",
    },
    "paused_until": {
        **_TIME,
        "type": ["string", "null"],
        "description": "When the pause ends by itself; null unless paused with an end. "
        "Once past, the runtime reads as not paused.",
    },
}


def _tasks(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    properties = {"tasks": {"type": "array", "items": {"$ref": "#/components/schemas/Task"}}}
    properties.update(extra or {})
    return {
        "type": "object",
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


SCHEMAS: dict[str, dict[str, Any]] = {
    "Task": {
        "type": "object",
        "description": "A task. While claimed it also shows its lease; once completed its "
        "result; after a failure the last error.",
        "required": list(TASK_FIELDS),
        "properties": {
            "id": _UUID,
            "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
            "status": {"enum": list(bodies.STATUSES)},
            "priority": bodies.ENQUEUE_BODY["priority"].json_schema({}, nullable=False),
            "payload": {"description": "As enqueued, exactly; null in a stub."},
            "attempts": {**_COUNT, "description": "Claims so far."},
            "max_attempts": bodies.ENQUEUE_BODY["max_attempts"].json_schema({}, nullable=False),
            "run_at": _TIME,
            "expires_at": {**_TIME, "type": ["string", "null"]},
            "created_at": _TIME,
            "updated_at": _TIME,
            "lease_id": {**_UUID, "description": "Present while claimed."},
            "lease_expires_at": _TIME,
            "worker_id": {"type": "string", "description": "Who holds the lease."},
            "cancel_requested": {
                "type": "boolean",
                "description": "Cancelled while claimed: it ends cancelled when reported.",
            },
            "result": {"description": "Present once completed: what complete sent, or null."},
            "last_error": {"type": "string", "description": "The last failure's error."},
            "render_error": {
                "type": "string",
                "description": "Present only on a stub: a stored task that cannot be shown "
                "whole, given without its payload and result, says why here.",
            },
        },
        "additionalProperties": False,
        "allOf": [
            {
                "if": {"properties": {"status": {"const": "claimed"}}},
                "then": {"required": list(LEASE_FIELDS)},
                "else": {"not": {"anyOf": [{"required": [name]} for name in LEASE_FIELDS]}},
            },
            {
                "if": {"properties": {"status": {"const": "completed"}}},
                "then": {"required": ["result"]},
                "else": {"not": {"required": ["result"]}},
            },
        ],
    },
    "TaskList": _tasks(),
    "TaskPage": _tasks({"next_cursor": {"type": ["string", "null"]}}),
    "Stats": {
        "type": "object",
        "required": [
            "runtime_id",
            "counts",
            "oldest_queued_age_seconds",
            "parked_pollers",
            "paused",
            *_PAUSE_DETAILS,
        ],
        "properties": {
            "runtime_id": {"type": "string"},
            "counts": {
                "type": "object",
                "description": "Tasks stored now, by status; exact. Tasks deleted by "
                "retention are no longer counted.",
                "required": list(bodies.STATUSES),
                "properties": {status: _COUNT for status in bodies.STATUSES},
                "additionalProperties": False,
            },
            "oldest_queued_age_seconds": {
                "type": ["number", "null"],
                "description": "Age of the oldest queued task that is due; null if none.",
            },
            "parked_pollers": {**_COUNT, "description": "Claims waiting on this instance."},
            "paused": _PAUSED,
            **_PAUSE_DETAILS,
        },
        "additionalProperties": False,
    },
    # GET /v1/runtimes (gateway/runtimes.py)
    "RuntimePage": {
        "type": "object",
        "required": ["runtimes", "next_cursor"],
        "properties": {
            "runtimes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": [
                        "runtime_id",
                        "queued",
                        "claimed",
                        "oldest_queued_age_seconds",
                        "parked_pollers",
                        "paused",
                        "dead",
                        "claims_per_minute",
                    ],
                    "properties": {
                        "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
                        "queued": {
                            **_COUNT,
                            "description": "Queued tasks, due or not yet due; expired ones not.",
                        },
                        "claimed": {**_COUNT, "description": "Tasks under a lease."},
                        "oldest_queued_age_seconds": {
                            "type": ["number", "null"],
                            "description": "Age of the oldest queued task that is due; "
                            "null if none.",
                        },
                        "parked_pollers": {
                            **_COUNT,
                            "description": "Claims waiting, over every instance: this "
                            "instance's now, the others' as reported within the last "
                            "5 s (this instance's alone while Redis is unavailable).",
                        },
                        "paused": _PAUSED,
                        "dead": {
                            **_COUNT,
                            "description": "Tasks that ended dead and are still stored "
                            "(retention deletes them); exact.",
                        },
                        "claims_per_minute": {
                            **_COUNT,
                            "description": "Tasks handed out in the last minute (in 5 s "
                            "steps), over every instance: this instance's now, the others' "
                            "as reported within the last 5 s (this instance's alone while "
                            "Redis is unavailable).",
                        },
                    },
                    "additionalProperties": False,
                },
            },
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Where the next page starts; null on the last one.",
            },
        },
        "additionalProperties": False,
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ok"}},
        "additionalProperties": False,
    },
    "Ready": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"const": "ready"}},
        "additionalProperties": False,
    },
    "NotReady": {
        "type": "object",
        "required": ["status", "problems"],
        "properties": {
            "status": {"const": "not ready"},
            "problems": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
        "additionalProperties": False,
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details; `code` is the machine-readable reason.",
        "required": ["type", "title", "status", "detail", "code"],
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer", "minimum": 400, "maximum": 599},
            "detail": {"type": "string"},
            "code": {"type": "string"},  # openapi.py fills in the enum from errors.py
            "field": {
                "type": "string",
                "description": "The field at fault: `priority`, `tasks[2].payload`.",
            },
            "index": {**_COUNT, "description": "The batch item at fault."},
            "task_id": _UUID,
            "task_status": {"enum": list(bodies.STATUSES)},
            "retry_after_seconds": _COUNT,
        },
        "additionalProperties": False,
    },
}

# Batch lease operations (gateway/batch.py): one result per item, in request order.
_ITEM_PROBLEMS = ["lease_lost", "not_found"]


def _batch_results(description: str, outcomes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`{"results": [...]}` whose items carry an outcome from `outcomes` (outcome ->
    the properties it adds, all required) or, for a refused item, its problem."""
    extra: dict[str, Any] = {}
    rules: list[dict[str, Any]] = [
        {
            "if": {"properties": {"outcome": {"enum": _ITEM_PROBLEMS}}},
            "then": {"required": ["problem"]},
            "else": {"not": {"required": ["problem"]}},
        }
    ]
    for outcome, properties in outcomes.items():
        extra.update(properties)
        if properties:
            rules.append(
                {
                    "if": {"properties": {"outcome": {"const": outcome}}},
                    "then": {"required": list(properties)},
                    "else": {"not": {"anyOf": [{"required": [name]} for name in properties]}},
                }
            )
    item = {
        "type": "object",
        "required": ["id", "outcome"],
        "properties": {
            "id": _UUID,
            "outcome": {"enum": [*outcomes, *_ITEM_PROBLEMS]},
            "problem": {
                "$ref": "#/components/schemas/Problem",
                "description": "What the single operation would have answered for this task.",
            },
            **extra,
        },
        "additionalProperties": False,
        "allOf": rules,
    }
    return {
        "type": "object",
        "description": description,
        "required": ["results"],
        "properties": {"results": {"type": "array", "items": item}},
        "additionalProperties": False,
    }


SCHEMAS.update(
    {
        "CompleteManyResults": _batch_results(
            "One result per item, in request order. `completed`; `cancelled` when a cancel "
            "was requested while the task was held.",
            {"completed": {}, "cancelled": {}},
        ),
        "FailManyResults": _batch_results(
            "One result per item, in request order. `queued`: it runs again at `run_at`; "
            "`dead`: no retry (attempts used up, or retry false); `cancelled`: a cancel "
            "was requested while it was held.",
            {
                "queued": {"run_at": {**_TIME, "description": "When it is claimable again."}},
                "dead": {},
                "cancelled": {},
            },
        ),
        "HeartbeatManyResults": _batch_results(
            "One result per item, in request order. `extended`: the lease now runs out at "
            "`lease_expires_at`; `cancel_requested` says whether to stop.",
            {
                "extended": {
                    "lease_expires_at": _TIME,
                    "cancel_requested": {"type": "boolean"},
                }
            },
        ),
    }
)

# -- operations ---------------------------------------------------------------------------

TASK = "Task"
REPLAYED = Param(
    "Idempotent-Replayed",
    "`true`: the idempotency key was seen with this same request; nothing new was stored.",
    {"const": "true"},
    required=True,
)

ENQUEUE = Doc(
    "enqueueTask",
    "Enqueue a task",
    (
        Reply(201, "Stored; a waiting daemon is woken.", TASK),
        Reply(200, "A repeated idempotency key with the same request.", TASK, headers=(REPLAYED,)),
    ),
    "The key may come in the body or the Idempotency-Key header; reusing it with "
    "another request is `422 idempotency_key_reused`.",
    tag="producers",
    body=bodies.ENQUEUE_BODY,
    headers=(bodies.IDEMPOTENCY_KEY_HEADER,),
    errors=(IdempotencyKeyReused,),
)
ENQUEUE_BATCH = Doc(
    "enqueueTasks",
    "Enqueue a batch of tasks, all or nothing",
    (
        Reply(201, "Stored, in request order.", "TaskList"),
        Reply(200, "Every item was an idempotent replay.", "TaskList", headers=(REPLAYED,)),
    ),
    "One bad item is `422` naming `tasks[i]` (`field` and `index`), and nothing is stored.",
    tag="producers",
    body=bodies.BATCH_BODY,
    errors=(IdempotencyKeyReused,),
)
LIST_TASKS = Doc(
    "listTasks",
    "List a runtime's tasks, oldest first",
    (Reply(200, "A page; next_cursor is null on the last one.", "TaskPage"),),
    tag="producers",
    query=bodies.LIST_QUERY,
)
STATS = Doc(
    "runtimeStats",
    "Count a runtime's tasks by status",
    (Reply(200, "Counts for every status.", "Stats"),),
    tag="producers",
)
CANCEL = Doc(
    "cancelTask",
    "Cancel a task",
    (Reply(200, "Queued: now cancelled. Claimed: cancel_requested until reported.", TASK),),
    "Cancelling a cancelled task answers it again; a finished one is `409 invalid_state`.",
    tag="producers",
    errors=(Conflict,),
)
RETRY = Doc(
    "retryTask",
    "Queue a dead, expired or cancelled task again",
    (Reply(200, "Queued at once, attempts reset.", TASK),),
    tag="producers",
    errors=(Conflict,),
)
GET_TASK = Doc(
    "getTask",
    "Get a task, or wait for it to finish",
    (
        Reply(
            200, "The task; with wait_seconds, finished or as it was when the wait ran out.", TASK
        ),
    ),
    "With `wait_seconds`, an unfinished task is answered once it finishes (completed, dead, "
    "expired or cancelled) or when the wait runs out, whichever comes first: `200` either "
    "way, and the task's `status` tells which. A shutting-down instance answers at once. "
    "Waits count against the instance's bound on waiting requests (GATEWAY_MAX_PARKED_POLLS): "
    "beyond it, `429` with Retry-After.",
    tag="producers",
    query=WAIT_QUERY,
    errors=(Overloaded,),
)
CLAIM = Doc(
    "claimTasks",
    "Claim tasks, waiting for work if there is none",
    (Reply(200, "Leased tasks; empty when the wait ran out.", "TaskList"),),
    "Overloaded is `429` with Retry-After; a shutting-down instance is `503 draining`.",
    tag="daemons",
    body=bodies.CLAIM_BODY,
    errors=(Overloaded, Draining),
)
_LEASE_LOST = "A lease that is no longer the task's current one is `409 lease_lost`."
HEARTBEAT = Doc(
    "heartbeatTask",
    "Extend a lease",
    (Reply(200, "The task; cancel_requested says whether to stop.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.HEARTBEAT_BODY,
    errors=(LeaseLost,),
)
COMPLETE = Doc(
    "completeTask",
    "Report a task done",
    (Reply(200, "The finished task; repeating it with the same lease answers it again.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.COMPLETE_BODY,
    errors=(LeaseLost,),
)
FAIL = Doc(
    "failTask",
    "Report a task failed",
    (Reply(200, "Queued again after a backoff, or dead at max_attempts.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.FAIL_BODY,
    errors=(LeaseLost,),
)
RELEASE = Doc(
    "releaseTask",
    "Give a task back",
    (Reply(200, "Queued again at once.", TASK),),
    _LEASE_LOST,
    tag="daemons",
    body=bodies.RELEASE_BODY,
    errors=(LeaseLost,),
)
HEALTHZ = Doc("healthz", "Liveness", (Reply(200, "The process answers.", "Health"),))
READYZ = Doc(
    "readyz",
    "Readiness",
    (
        Reply(200, "Database reachable, schema current, not shutting down.", "Ready"),
        Reply(503, "Not ready; the problems name the components.", "NotReady"),
    ),
)
METRICS = Doc(
    "metrics",
    "Prometheus metrics",
    (Reply(200, "The Prometheus text format.", {"type": "string"}, "text/plain"),),
)
OPENAPI = Doc(
    "openapi",
    "This document",
    (Reply(200, "OpenAPI 3.1.", {"type": "object"}),),
)

# -- batch lease operations (gateway/batch.py) --
_BATCH = (
    "Each item is what the single operation does with its task; one item's problem "
    "(`lease_lost`, `not_found`: the problem the single operation answers, in the item) "
    "never undoes another's success. A task of a runtime the token does not cover is "
    "`not_found`. A request with no items, more than 1000, a malformed item or a task "
    "named twice is `422` naming `tasks[i]` (`field` and `index`), and nothing is stored."
)
COMPLETE_MANY = Doc(
    "completeTasks",
    "Report several tasks done",
    (Reply(200, "One result per item, in request order.", "CompleteManyResults"),),
    _BATCH + " Repeating an item with the same lease answers `completed` again.",
    tag="daemons",
    body=bodies.COMPLETE_MANY_BODY,
)
FAIL_MANY = Doc(
    "failTasks",
    "Report several tasks failed",
    (Reply(200, "One result per item, in request order.", "FailManyResults"),),
    _BATCH + " Tasks queued again wake waiting daemons of their runtimes.",
    tag="daemons",
    body=bodies.FAIL_MANY_BODY,
)
HEARTBEAT_MANY = Doc(
    "heartbeatTasks",
    "Extend several leases",
    (Reply(200, "One result per item, in request order.", "HeartbeatManyResults"),),
    _BATCH,
    tag="daemons",
    body=bodies.HEARTBEAT_MANY_BODY,
)

# -- the runtimes listing (gateway/runtimes.py) -------------------------------------------

LIST_RUNTIMES = Doc(
    "listRuntimes",
    "List the runtimes that have live tasks, with their counts",
    (
        Reply(
            200, "A page in runtime id order; next_cursor is null on the last one.", "RuntimePage"
        ),
    ),
    "Lists every runtime holding tasks (queued, due or not yet due; claimed; or finished and "
    "not yet removed by retention) or with controls set, in runtime id order, at most "
    f"`limit` ({MAX_RUNTIMES_LIMIT} at most) per page. A token limited to runtime patterns "
    f"sees only the runtimes they cover: each page looks at {PATTERN_WALK} runtimes at "
    "most, so its page may hold fewer than `limit`, even none, with a next_cursor to go on "
    "from.",
    tag="producers",
    query=RUNTIMES_QUERY,
)


# -- runtime controls (gateway/controls.py) ------------------------------------------------

SCHEMAS["Controls"] = {
    "type": "object",
    "required": [
        "runtime_id",
        "paused",
        "max_in_flight",
        "claims_per_second",
        "updated_at",
        *_PAUSE_DETAILS,
    ],
    "properties": {
        "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
        "paused": {"type": "boolean", "description": "While true, claims hand out nothing."},
        **_PAUSE_DETAILS,
        "max_in_flight": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_IN_FLIGHT,
            "description": "Most tasks leased at once over every instance; null: no limit.",
        },
        "claims_per_second": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_CLAIMS_PER_SECOND,
            "description": "Most tasks leased per second (burst: one second's worth, at "
            "least 1); null: no limit.",
        },
        "updated_at": {**_TIME, "type": ["string", "null"]},
    },
    "additionalProperties": False,
}
_CONTROLS_ABOUT = (
    "A runtime never changed has no controls: not paused, no limits, updated_at null. "
    "Every instance learns of a change within its pub/sub latency (at most "
    f"{REFRESH_SECONDS:g} s when a message is lost). Needs the `control` scope (or admin); a "
    "token limited to runtime patterns controls only the runtimes they cover."
)
GET_CONTROLS = Doc(
    "getRuntimeControls",
    "Get a runtime's controls (pause, max_in_flight, claims_per_second)",
    (Reply(200, "The runtime's controls.", "Controls"),),
    _CONTROLS_ABOUT,
    tag="controls",
)
SET_CONTROLS = Doc(
    "setRuntimeControls",
    "Change a runtime's controls",
    (Reply(200, "The runtime's controls after the change.", "Controls"),),
    "Fields left out keep their value; null removes a limit. " + _CONTROLS_ABOUT,
    tag="controls",
    body=CONTROLS_BODY,
)
PAUSE = Doc(
    "pauseRuntime",
    "Pause a runtime: claims hand out nothing, enqueues still work",
    (Reply(200, "The runtime's controls, paused.", "Controls"),),
    "Parked claims stay parked and are answered once the runtime is resumed and has work; "
    "a claim without wait_seconds answers an empty list at once. The body is optional: "
    "`reason` is shown with the controls, stats and in the console; with `until` the pause "
    "ends by itself at that time on every instance, and parked claims are woken then. "
    "Pausing a paused runtime replaces its reason and end and keeps paused_since. "
    + _CONTROLS_ABOUT,
    tag="controls",
    body=PAUSE_BODY,
)
RESUME = Doc(
    "resumeRuntime",
    "Resume a paused runtime",
    (Reply(200, "The runtime's controls, not paused.", "Controls"),),
    "Parked claims are woken and served. Idempotent. " + _CONTROLS_ABOUT,
    tag="controls",
)
