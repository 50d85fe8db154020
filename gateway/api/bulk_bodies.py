"""The bodies and query of a runtime's bulk operations, declared once (see fields.py),
and their parsers: a bulk retry (`tasks:retry`), a bulk cancel (`tasks:cancel`) and the
error groups' query (`errors`). Each parser stores nothing and raises ValidationFailed
naming the field; the OpenAPI document describes them from the same specs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .fields import Body, Field, Kind, read_query

# What a bulk retry takes: the statuses one task's retry takes.
RETRY_STATUSES = ("dead", "expired", "cancelled")
# What a bulk cancel takes: a claimed task is its holder's to end, one at a time.
CANCEL_STATUSES = ("queued",)
MAX_BULK = 1000
MAX_ERROR_PREFIX = 1000  # characters
# An error group's line: the first line of a task's error, at most this many characters
# (store/sql/bulk.ERROR_LINE cuts it), so that it can be sent back as an error_prefix.
ERROR_LINE_CHARS = 200
MAX_ERROR_GROUPS = 100
# The most tasks of a runtime in one status (dead, expired, cancelled), newest first,
# that a bulk retry and the error groups read (store/sql/bulk.py), so that a call's
# cost does not grow with the runtime's history. A retried task leaves the status, so a
# retry sent again reaches older ones.
HISTORY_ROWS = 50_000

_LIMIT = Field(
    "limit",
    Kind.INTEGER,
    "At most this many tasks are changed by this call; `more` in the answer says whether "
    "matching tasks were left.",
    default=MAX_BULK,
    minimum=1,
    maximum=MAX_BULK,
)

BULK_RETRY_BODY = Body(
    "BulkRetryRequest",
    "Which of the runtime's finished tasks to queue again, each as one task's retry does.",
    (
        Field(
            "status",
            Kind.STRING,
            "The tasks in this status: `dead`, `expired` or `cancelled`.",
            required=True,
            enum=RETRY_STATUSES,
            enum_name="RetryableStatus",
        ),
        Field(
            "error_prefix",
            Kind.STRING,
            "Only the tasks whose last error starts with this text: compared character "
            "for character, case-sensitive, with no wildcards (`%` and `_` are plain "
            "characters). An error group's `error` (GET …/errors) is such a prefix. Left "
            "out: every task in the status, with an error or without.",
            max_length=MAX_ERROR_PREFIX,
        ),
        _LIMIT,
    ),
    closed=True,
    example={"status": "dead", "error_prefix": "TimeoutError: ", "limit": 500},
)

BULK_CANCEL_BODY = Body(
    "BulkCancelRequest",
    "Which of the runtime's tasks to cancel, each as one queued task's cancel does.",
    (
        Field(
            "status",
            Kind.STRING,
            "The tasks in this status: `queued` (due now or later). Claimed tasks are not "
            "taken: cancel each with POST /v1/tasks/{task_id}/cancel.",
            required=True,
            enum=CANCEL_STATUSES,
            enum_name="CancellableStatus",
        ),
        _LIMIT,
    ),
    closed=True,
    example={"status": "queued", "limit": 1000},
)

ERRORS_QUERY = Body(
    "ErrorGroupsQuery",
    "Which of the runtime's tasks to group by error.",
    (
        Field(
            "status",
            Kind.STRING,
            "The tasks in this status.",
            default="dead",
            enum=RETRY_STATUSES,
            enum_name="RetryableStatus",
        ),
        Field(
            "limit",
            Kind.INTEGER,
            "The most common groups answered, at most.",
            default=20,
            minimum=1,
            maximum=MAX_ERROR_GROUPS,
        ),
    ),
)


@dataclass(frozen=True)
class BulkRetry:
    """A bulk retry as understood."""

    status: str
    error_prefix: str | None
    limit: int


def _status(body: Body, given: Any) -> str:
    """The body's required `status`, one of its enum, or 422 naming it."""
    field = body["status"]
    status: str = field.read(given, {})
    if status not in field.enum:
        raise field.fail(f"status must be {' or '.join(field.enum)}")
    return status


def parse_bulk_retry(body: Any) -> BulkRetry:
    """A bulk retry's body, or 422 naming the field."""
    BULK_RETRY_BODY.check_fields(body)
    status = _status(BULK_RETRY_BODY, body)
    prefix: str | None = BULK_RETRY_BODY["error_prefix"].read(body, {})
    return BulkRetry(status, prefix, BULK_RETRY_BODY["limit"].read(body, {}))


def parse_bulk_cancel(body: Any) -> int:
    """A bulk cancel's body, or 422 naming the field; its limit."""
    BULK_CANCEL_BODY.check_fields(body)
    _status(BULK_CANCEL_BODY, body)
    limit: int = BULK_CANCEL_BODY["limit"].read(body, {})
    return limit


def parse_errors_query(params: Mapping[str, str]) -> tuple[str, int]:
    """The error groups' (status, limit)."""
    status: str = read_query(ERRORS_QUERY["status"], params, {})
    if status is None:  # a string field's reader leaves its default to us
        status = ERRORS_QUERY["status"].default
    limit: int = read_query(ERRORS_QUERY["limit"], params, {})
    return status, limit
