"""The JSON Schemas of every answer body, written once and named in SCHEMAS: the
OpenAPI document's components (openapi.py) and the names each operation's `Reply`
refers to (docs.py). Request bodies are not here: they come from the field specs in
bodies.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import bodies, trace
from .bodies import CONTROLS_BODY, MAX_PAUSE_REASON
from .credential_bodies import SCOPE_SCHEMA
from .decode import RUNTIME_ID_RE
from .render import LEASE_FIELDS, TASK_FIELDS

# -- answer bodies ------------------------------------------------------------------------

# A UUID and a time as every answer writes them (render.format_time); admin answers too.
UUID_SCHEMA = {"type": "string", "format": "uuid"}
TIME_SCHEMA = {
    "type": "string",
    "format": "date-time",
    "pattern": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$",
    "description": "RFC 3339 UTC with microseconds and a Z: times compare as strings.",
}
_COUNT = {"type": "integer", "minimum": 0}
_NAMES = {"type": "array", "items": {"type": "string"}, "minItems": 1}  # what /readyz names
_PAUSED = {"type": "boolean", "description": "Paused: claims hand out nothing (runtime controls)."}
# The pause's details beside `paused` (controls and stats): all null unless paused.
_PAUSE_DETAILS: dict[str, Any] = {
    "paused_reason": {
        "type": ["string", "null"],
        "maxLength": MAX_PAUSE_REASON,
        "description": "Why the runtime is paused, as given to the pause; null if none.",
    },
    "paused_since": {
        **TIME_SCHEMA,
        "type": ["string", "null"],
        "description": "When the pause began (the server's time); null unless paused.",
    },
    "paused_until": {
        **TIME_SCHEMA,
        "type": ["string", "null"],
        "description": "When the pause ends by itself; null unless paused with an end. "
        "Once past, the runtime reads as not paused.",
    },
}


def _ref(name: str, **siblings: Any) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}", **siblings}


def _tasks(
    description: str, item: str, extra: Mapping[str, Any] | None = None, min_items: int = 0
) -> dict[str, Any]:
    tasks: dict[str, Any] = {"type": "array", "items": _ref(item)}
    if min_items:
        tasks["minItems"] = min_items
    properties = {"tasks": tasks, **(extra or {})}
    return {
        "type": "object",
        "description": description,
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }


def _bare(field: str) -> dict[str, Any]:
    """An enqueue field's bounds as a task shows them: no default, no request wording."""
    schema = bodies.ENQUEUE_BODY[field].json_schema({}, nullable=False)
    del schema["description"]
    return schema


_TRACE = "The trace context its producer sent with it; only then."
_TASK_PROPERTIES: dict[str, Any] = {
    "id": UUID_SCHEMA,
    "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
    "status": _ref("TaskStatus"),
    "priority": {**_bare("priority"), "description": "Higher is claimed first."},
    "payload": {"description": "As enqueued, exactly; null in a stub."},
    "attempts": {**_COUNT, "description": "Claims so far."},
    "max_attempts": {**_bare("max_attempts"), "description": "Claims allowed."},
    "run_at": TIME_SCHEMA,
    "expires_at": {**TIME_SCHEMA, "type": ["string", "null"]},
    "created_at": TIME_SCHEMA,
    "updated_at": TIME_SCHEMA,
    "lease_id": {**UUID_SCHEMA, "description": "Present while claimed."},
    "lease_expires_at": {**TIME_SCHEMA, "description": "Present while claimed."},
    "worker_id": {"type": "string", "description": "Who holds the lease; present while claimed."},
    "cancel_requested": {
        "type": "boolean",
        "description": "Cancelled while claimed: it ends cancelled when reported. Present "
        "while claimed.",
    },
    "result": {"description": "Present once completed: what complete sent, or null."},
    "last_error": {"type": "string", "description": "The last failure's error."},
    "schedule": {"type": "string", "description": "The schedule that made it; only then."},
    "scheduled_for": {**TIME_SCHEMA, "description": "Its schedule's tick; with schedule."},
    "trace": {"$ref": f"#/components/schemas/{trace.SCHEMA_NAME}", "description": _TRACE},
    "render_error": {
        "type": "string",
        "description": "Present only on a stub: a stored task that cannot be shown "
        "whole, given without its payload and result, says why here.",
    },
}
_TASK_EXAMPLE = {
    "id": "0196f2b0-43c1-7b5e-9d4a-1f3c2b8e6a01",
    "runtime_id": "billing",
    "status": "claimed",
    "priority": 50,
    "payload": {"invoice": 1042},
    "attempts": 1,
    "max_attempts": 5,
    "run_at": "2026-11-25T21:02:03.000000Z",
    "expires_at": None,
    "created_at": "2026-11-25T21:02:03.000000Z",
    "updated_at": "2026-11-25T21:02:04.512000Z",
    "lease_id": "6a1d3c52-8f0e-4b7a-9c21-3e5f7d9b1a40",
    "lease_expires_at": "2026-11-25T21:03:04.512000Z",
    "worker_id": "billing-worker-1",
    "cancel_requested": False,
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "TaskStatus": {
        "type": "string",
        "enum": list(bodies.STATUSES),
        "description": "`queued` (waiting, or not yet due), `claimed` (under a lease), and "
        "the ends: `completed`, `dead` (failed for good), `expired` (not claimed in time), "
        "`cancelled`.",
    },
    "Scope": SCOPE_SCHEMA,
    "Task": {
        "type": "object",
        "description": "A task. While claimed it also shows its lease; once completed its "
        "result; after a failure the last error.",
        "required": list(TASK_FIELDS),
        "properties": _TASK_PROPERTIES,
        "additionalProperties": False,
        # For validators: generators read ClaimedTask, where the lease is required.
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
        "examples": [_TASK_EXAMPLE],
    },
    "ClaimedTask": {
        "type": "object",
        "description": "A task a claim handed out: claimed, with its lease.",
        "required": [*TASK_FIELDS, *LEASE_FIELDS],
        # Never a result: the task is not completed.
        "properties": {
            **{name: value for name, value in _TASK_PROPERTIES.items() if name != "result"},
            "status": {"type": "string", "const": "claimed"},
        },
        "additionalProperties": False,
        "examples": [_TASK_EXAMPLE],
    },
    # A batch is never empty: with one task or more, exactly one of the two forms matches.
    "TaskList": _tasks("The tasks enqueued, in request order.", "Task", min_items=1),
    "TaskRef": {
        "type": "object",
        "description": "A task's id alone: an enqueue's answer under `Prefer: return=minimal`.",
        "required": ["id"],
        "properties": {"id": UUID_SCHEMA},
        "additionalProperties": False,
    },
    "TaskRefList": _tasks(
        "The ids of the tasks enqueued, in request order (`Prefer: return=minimal`).",
        "TaskRef",
        min_items=1,
    ),
    # An enqueue's answer: whole tasks, or with `Prefer: return=minimal` their ids only.
    # No property tells them apart (a TaskRef is the id alone), so this is no
    # discriminated union: a whole task has a `status`, an id alone has not.
    "EnqueuedTask": {
        "description": "The task, or with `Prefer: return=minimal` its id alone: a whole "
        "task has a `status`, an id alone has not.",
        "oneOf": [_ref("Task"), _ref("TaskRef")],
    },
    "EnqueuedTasks": {
        "description": "The tasks, or with `Prefer: return=minimal` their ids alone, in "
        "request order.",
        "oneOf": [_ref("TaskList"), _ref("TaskRefList")],
    },
    "TaskPage": _tasks(
        "A page of tasks, oldest first.",
        "Task",
        {
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Where the next page starts; null on the last one.",
            }
        },
    ),
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
            "counts": _ref("StatusCounts"),
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
    "StatusCounts": {
        "type": "object",
        "description": "Tasks stored now, by status; exact. Tasks deleted by "
        "retention are no longer counted.",
        "required": list(bodies.STATUSES),
        "properties": {status: _COUNT for status in bodies.STATUSES},
        "additionalProperties": False,
    },
    # GET /v1/runtimes (gateway/http/handlers/runtimes.py)
    "RuntimePage": {
        "type": "object",
        "required": ["runtimes", "next_cursor"],
        "properties": {
            "runtimes": {"type": "array", "items": _ref("RuntimeSummary")},
            "next_cursor": {
                "type": ["string", "null"],
                "description": "Where the next page starts; null on the last one.",
            },
        },
        "additionalProperties": False,
    },
    "RuntimeSummary": {
        "type": "object",
        "description": "A runtime's counts.",
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
                "description": "Age of the oldest queued task that is due; null if none.",
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
                "description": "Tasks handed out in the last minute (in 5 s steps), over every "
                "instance: this instance's now, the others' as reported within the last 5 s "
                "(this instance's alone while Redis is unavailable).",
            },
            "sparkline": _ref("DepthSparkline"),  # with include=sparkline (http/history_docs)
        },
        "additionalProperties": False,
    },
    "Health": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "ok"}},
        "additionalProperties": False,
    },
    "Ready": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "ready"}, "degraded": _NAMES},
        "additionalProperties": False,
    },
    "NotReady": {
        "type": "object",
        "required": ["status", "problems"],
        "properties": {"status": {"type": "string", "const": "not ready"}, "problems": _NAMES},
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
            "task_id": UUID_SCHEMA,
            "task_status": _ref("TaskStatus"),
            "retry_after_seconds": _COUNT,
        },
        "additionalProperties": False,
    },
}

# Batch lease operations (gateway/http/handlers/batch.py): one result per item, in request order.
_ITEM_PROBLEMS = ["lease_lost", "not_found"]


def _batch_results(
    name: str, description: str, outcomes: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The schemas `{name}s` (`{"results": [...]}`), `{name}` (an item) and
    `{name}Outcome`: an item carries an outcome from `outcomes` (outcome -> the
    properties it adds, present with that outcome only) or, for a refused item, its
    problem."""
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
        "description": "One item's result.",
        "required": ["id", "outcome"],
        "properties": {
            "id": UUID_SCHEMA,
            "outcome": _ref(f"{name}Outcome"),
            "problem": _ref(
                "Problem",
                description="Present when refused: what the single operation would have "
                "answered for this task.",
            ),
            **extra,
        },
        "additionalProperties": False,
        # For validators: which properties come with which outcome.
        "allOf": rules,
    }
    return {
        f"{name}s": {
            "type": "object",
            "description": description,
            "required": ["results"],
            "properties": {"results": {"type": "array", "items": _ref(name)}},
            "additionalProperties": False,
        },
        name: item,
        f"{name}Outcome": {
            "type": "string",
            "enum": [*outcomes, *_ITEM_PROBLEMS],
            "description": "What became of the item's task; `lease_lost` and `not_found`: "
            "refused, with the problem in `problem`.",
        },
    }


SCHEMAS.update(
    _batch_results(
        "CompleteManyResult",
        "One result per item, in request order. `completed`; `cancelled` when a cancel "
        "was requested while the task was held.",
        {"completed": {}, "cancelled": {}},
    )
)
SCHEMAS.update(
    _batch_results(
        "FailManyResult",
        "One result per item, in request order. `queued`: it runs again at `run_at`; "
        "`dead`: no retry (attempts used up, or retry false); `cancelled`: a cancel "
        "was requested while it was held.",
        {
            "queued": {
                "run_at": {
                    **TIME_SCHEMA,
                    "description": "With `queued`: when it is claimable again.",
                }
            },
            "dead": {},
            "cancelled": {},
        },
    )
)
SCHEMAS.update(
    _batch_results(
        "HeartbeatManyResult",
        "One result per item, in request order. `extended`: the lease now runs out at "
        "`lease_expires_at`; `cancel_requested` says whether to stop.",
        {
            "extended": {
                "lease_expires_at": {**TIME_SCHEMA, "description": "With `extended`."},
                "cancel_requested": {"type": "boolean", "description": "With `extended`."},
            }
        },
    )
)

# Runtime controls (gateway/claim/controls.py).
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
        # The bounds of the stored limits are those of the request's fields.
        "max_in_flight": {
            **CONTROLS_BODY["max_in_flight"].json_schema({}),
            "description": "Most tasks leased at once over every instance; null: no limit.",
        },
        "claims_per_second": {
            **CONTROLS_BODY["claims_per_second"].json_schema({}),
            "description": "Most tasks leased per second (burst: one second's worth, at "
            "least 1); null: no limit.",
        },
        "updated_at": {**TIME_SCHEMA, "type": ["string", "null"]},
    },
    "additionalProperties": False,
}

# A claim's answer: its tasks and, when it carried completes or fails, their outcomes
# (the batch endpoints' items above, completes first).
_CLAIMED = _tasks(
    "The tasks claimed, up to max_tasks; empty when the wait ran out. `acks` and "
    "`retry_after_seconds` are present only when the claim carried `complete` or `fail`.",
    "ClaimedTask",
)
_CLAIMED["properties"].update(
    {
        "acks": {
            "type": "array",
            "description": "One result per item of the claim's `complete` then `fail`, in "
            "request order, as `POST /v1/tasks:complete` and `POST /v1/tasks:fail` answer "
            "them; committed before the claim was decided.",
            "items": {"anyOf": [_ref("CompleteManyResult"), _ref("FailManyResult")]},
        },
        "retry_after_seconds": {
            **_COUNT,
            "description": "With `acks`, when the claim handed out nothing because it was "
            "refused (overloaded, shutting down) or its runtime is held back (paused, at a "
            "limit): claim again after this many seconds.",
        },
    }
)
_CLAIMED["required"] = ["tasks"]
SCHEMAS["ClaimedTaskList"] = _CLAIMED
