"""The JSON Schemas of every answer body, written once and named in SCHEMAS: the
OpenAPI document's components (openapi.py) and the names each operation's `Reply`
refers to (docs.py). Request bodies are not here: they come from the field specs in
bodies.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import bodies
from .bodies import CONTROLS_BODY, MAX_PAUSE_REASON
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


def _tasks(extra: Mapping[str, Any] | None = None, item: str = "Task") -> dict[str, Any]:
    properties = {"tasks": {"type": "array", "items": {"$ref": f"#/components/schemas/{item}"}}}
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
            "id": UUID_SCHEMA,
            "runtime_id": {"type": "string", "pattern": RUNTIME_ID_RE.pattern},
            "status": {"enum": list(bodies.STATUSES)},
            "priority": bodies.ENQUEUE_BODY["priority"].json_schema({}, nullable=False),
            "payload": {"description": "As enqueued, exactly; null in a stub."},
            "attempts": {**_COUNT, "description": "Claims so far."},
            "max_attempts": bodies.ENQUEUE_BODY["max_attempts"].json_schema({}, nullable=False),
            "run_at": TIME_SCHEMA,
            "expires_at": {**TIME_SCHEMA, "type": ["string", "null"]},
            "created_at": TIME_SCHEMA,
            "updated_at": TIME_SCHEMA,
            "lease_id": {**UUID_SCHEMA, "description": "Present while claimed."},
            "lease_expires_at": TIME_SCHEMA,
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
    "TaskRef": {
        "type": "object",
        "description": "A task's id alone: an enqueue's answer under `Prefer: return=minimal`.",
        "required": ["id"],
        "properties": {"id": UUID_SCHEMA},
        "additionalProperties": False,
    },
    "TaskRefList": _tasks(item="TaskRef"),
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
    # GET /v1/runtimes (gateway/http/handlers/runtimes.py)
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
            "task_id": UUID_SCHEMA,
            "task_status": {"enum": list(bodies.STATUSES)},
            "retry_after_seconds": _COUNT,
        },
        "additionalProperties": False,
    },
}

# Batch lease operations (gateway/http/handlers/batch.py): one result per item, in request order.
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
            "id": UUID_SCHEMA,
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
                "queued": {"run_at": {**TIME_SCHEMA, "description": "When it is claimable again."}},
                "dead": {},
                "cancelled": {},
            },
        ),
        "HeartbeatManyResults": _batch_results(
            "One result per item, in request order. `extended`: the lease now runs out at "
            "`lease_expires_at`; `cancel_requested` says whether to stop.",
            {
                "extended": {
                    "lease_expires_at": TIME_SCHEMA,
                    "cancel_requested": {"type": "boolean"},
                }
            },
        ),
    }
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
