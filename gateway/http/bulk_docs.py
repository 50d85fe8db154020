"""Documentation of a runtime's bulk operations (handlers/bulk.py), beside docs.py's:
`tasks:retry`, `tasks:cancel` and `errors`, and their answers' schemas (`BulkRetried`,
`BulkCancelled`, `ErrorGroups`, `ErrorGroup`, and the statuses each takes), which the
OpenAPI document adds to answers.SCHEMAS."""

from __future__ import annotations

from typing import Any

from ..api.answers import TIME_SCHEMA, UUID_SCHEMA
from ..api.bulk_bodies import (
    BULK_CANCEL_BODY,
    BULK_RETRY_BODY,
    CANCEL_STATUSES,
    ERROR_LINE_CHARS,
    ERRORS_QUERY,
    HISTORY_ROWS,
    RETRY_STATUSES,
)
from .docs import Doc, Reply

_COUNT = {"type": "integer", "minimum": 0}
_MORE = {
    "type": "boolean",
    "description": "Matching tasks were left: beyond the limit, or held by another request "
    "at that instant. Call again to go on; each call acts on what matches when it runs.",
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "RetryableStatus": {
        "type": "string",
        "enum": list(RETRY_STATUSES),
        "description": "A status whose tasks a retry queues again.",
    },
    "CancellableStatus": {
        "type": "string",
        "enum": list(CANCEL_STATUSES),
        "description": "A status whose tasks a bulk cancel takes.",
    },
    "BulkRetried": {
        "type": "object",
        "required": ["retried", "more"],
        "properties": {
            "retried": {**_COUNT, "description": "Tasks queued again by this call."},
            "more": _MORE,
        },
        "additionalProperties": False,
    },
    "BulkCancelled": {
        "type": "object",
        "required": ["cancelled", "more"],
        "properties": {
            "cancelled": {**_COUNT, "description": "Tasks cancelled by this call."},
            "more": _MORE,
        },
        "additionalProperties": False,
    },
    "ErrorGroups": {
        "type": "object",
        "required": ["runtime_id", "status", "groups", "tasks_read", "truncated"],
        "properties": {
            "runtime_id": {"type": "string"},
            "status": {"$ref": "#/components/schemas/RetryableStatus"},
            "groups": {
                "type": "array",
                "description": "The most common error lines, most common first (then the "
                "most recent).",
                "items": {"$ref": "#/components/schemas/ErrorGroup"},
            },
            "tasks_read": {
                **_COUNT,
                "description": "The runtime's tasks in this status read, newest first, at "
                f"most {HISTORY_ROWS}.",
            },
            "truncated": {
                "type": "boolean",
                "description": "The runtime may hold older tasks in this status than the "
                f"{HISTORY_ROWS} read, which the groups do not count.",
            },
        },
        "additionalProperties": False,
    },
    "ErrorGroup": {
        "type": "object",
        "description": "The tasks that share an error line.",
        "required": ["error", "count", "last_at", "example_task_id"],
        "properties": {
            "error": {
                "type": "string",
                "minLength": 1,
                "maxLength": ERROR_LINE_CHARS,
                "description": f"The first line of their last error, at most "
                f"{ERROR_LINE_CHARS} characters (an error that begins with a line break: its "
                f"first {ERROR_LINE_CHARS} characters). Sent as `error_prefix` to POST "
                "…/tasks:retry, it retries this group, and any group whose line starts with "
                "it.",
            },
            "count": {**_COUNT, "description": "How many tasks."},
            "last_at": {
                **TIME_SCHEMA,
                "description": "When the newest of them finished.",
            },
            "example_task_id": {**UUID_SCHEMA, "description": "That newest task's id."},
        },
        "additionalProperties": False,
    },
}

_READ_BOUND = (
    f"Reads at most the runtime's newest {HISTORY_ROWS} tasks in the status asked for (by "
    "creation), so that its cost does not grow with the runtime's history."
)

RETRY_TASKS = Doc(
    "retryTasks",
    "Queue a runtime's dead, expired or cancelled tasks again",
    (
        Reply(
            200, "How many were queued again, and whether matching tasks were left.", "BulkRetried"
        ),
    ),
    "Each task is queued again at once with its attempts reset, exactly as POST "
    "/v1/tasks/{task_id}/retry does one, and waiting claims wake up. At most `limit` tasks "
    "per call, newest first; with `error_prefix`, only those whose last error starts with "
    "it. A call carries no idempotency key: sent again (after a lost answer, say), it "
    "retries only what matches then. " + _READ_BOUND + " Needs the `enqueue` scope on the runtime.",
    tag="producers",
    body=BULK_RETRY_BODY,
)
CANCEL_TASKS = Doc(
    "cancelTasks",
    "Cancel a runtime's queued tasks",
    (Reply(200, "How many were cancelled, and whether queued tasks were left.", "BulkCancelled"),),
    "Each queued task (due now or later) is cancelled, exactly as POST "
    "/v1/tasks/{task_id}/cancel cancels a queued one. At most `limit` tasks per call, in no "
    "particular order; a task a claim takes meanwhile is not cancelled, and claimed tasks "
    "are never taken. Sent again, a call acts on what is queued then. Needs the `enqueue` "
    "scope on the runtime.",
    tag="producers",
    body=BULK_CANCEL_BODY,
)
ERROR_GROUPS = Doc(
    "runtimeErrors",
    "Group a runtime's failed tasks by error",
    (Reply(200, "The most common error lines, with counts.", "ErrorGroups"),),
    "The runtime's tasks in `status` (dead by default) grouped by the first line of their "
    "last error, the most common first, each with its count, when its newest task finished "
    "and that task's id. Tasks without an error are not counted. A group's `error` is an "
    "`error_prefix` for POST …/tasks:retry. " + _READ_BOUND + " Needs the `read` scope.",
    tag="producers",
    query=ERRORS_QUERY,
)
