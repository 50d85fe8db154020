"""Documentation of `GET /v1/instance/load` (handlers/load.py), beside docs.py's: the
operation and its answer's schemas (`InstanceLoad`, `DatabaseLine`, `ShedMinute`), which
the OpenAPI document adds to answers.SCHEMAS."""

from __future__ import annotations

from typing import Any

from ..api.answers import TIME_SCHEMA
from .docs import Doc, Reply

_COUNT = {"type": "integer", "minimum": 0}
_BY_REASON = {
    "type": "object",
    "additionalProperties": _COUNT,
    "description": "Requests refused before any work, by reason (`gateway_shed_total`'s): "
    "`database_queue`, the line for a database connection held more than "
    "GATEWAY_DB_QUEUE_BUDGET_MS of work; `busy`, a claim carrying nothing that would not "
    "wait, while the instance worked on more than GATEWAY_MAX_ACTIVE_REQUESTS requests; "
    "`client_gone`, the client closed its connection "
    "while its request waited. A reason without refusals is absent.",
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "InstanceLoad": {
        "type": "object",
        "required": [
            "instance_id",
            "host",
            "shedding",
            "database_line",
            "shed_last_minute",
            "shed_per_minute",
        ],
        "properties": {
            "instance_id": {
                "type": "string",
                "description": "The answering instance's id, as it reports itself to the others.",
            },
            "host": {"type": "string", "description": "Its host name (the pod's, on Kubernetes)."},
            "shedding": {
                "type": "boolean",
                "description": "It refused at least one request in the last minute.",
            },
            "database_line": {"$ref": "#/components/schemas/DatabaseLine"},
            "shed_last_minute": {**_BY_REASON, "description": "Over the last 60 s."},
            "shed_per_minute": {
                "type": "array",
                "description": "The last 10 minutes of the clock, oldest first; the last is "
                "the current minute so far.",
                "items": {"$ref": "#/components/schemas/ShedMinute"},
            },
        },
        "additionalProperties": False,
    },
    "DatabaseLine": {
        "type": "object",
        "description": "The line for a database connection, now.",
        "required": [
            "connections",
            "connections_in_use",
            "waiting_work",
            "waiting_releases",
            "work_limit",
            "mean_hold_ms",
            "budget_ms",
            "standing",
        ],
        "properties": {
            "connections": {**_COUNT, "description": "GATEWAY_DB_POOL_MAX."},
            "connections_in_use": {**_COUNT, "description": "Held by a statement now."},
            "waiting_work": {
                **_COUNT,
                "description": "Enqueues, claims and reads waiting for a connection.",
            },
            "waiting_releases": {
                **_COUNT,
                "description": "Completes, fails, heartbeats and the gateway's own work "
                "waiting for a connection (they go first, and are never refused for the "
                "line's length).",
            },
            "work_limit": {
                "type": ["number", "null"],
                "minimum": 0,
                "description": "How much work may wait before more is refused at once "
                "(`gateway_db_queue_limit`); null until a connection was given back.",
            },
            "mean_hold_ms": {
                "type": "number",
                "minimum": 0,
                "description": "How long a statement holds a connection, on average.",
            },
            "budget_ms": {
                "type": "number",
                "minimum": 0,
                "description": "GATEWAY_DB_QUEUE_BUDGET_MS.",
            },
            "standing": {
                "type": "boolean",
                "description": "The line has stood: every request of work given a "
                "connection for 100 ms waited longer than a tenth of the budget. Until no "
                "work is left waiting and a second has passed since it was last found "
                "standing, work is let in for a tenth of the budget only.",
            },
        },
        "additionalProperties": False,
    },
    "ShedMinute": {
        "type": "object",
        "description": "One minute of the clock.",
        "required": ["minute", "shed"],
        "properties": {
            "minute": {**TIME_SCHEMA, "description": "The minute's start."},
            "shed": _BY_REASON,
        },
        "additionalProperties": False,
    },
}

INSTANCE_LOAD = Doc(
    "getInstanceLoad",
    "How loaded the answering instance's database path is",
    (Reply(200, "Its database line now and what it refused lately.", "InstanceLoad"),),
    "For the console, and for an operator after a GatewayShedding alert: the answering "
    "instance's line for a database connection (its connections, what waits, the limit on "
    "waiting work) and the requests it refused before any work, by reason, over the last "
    "10 minutes. Answered from the instance's memory, never refused for the line's length. "
    "Behind a load balancer each request may reach another instance: `instance_id` and "
    "`host` say which answered. Needs the `read` scope; the figures are the instance's, not "
    "a runtime's.",
)
