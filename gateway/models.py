"""Request validation and the task's JSON form.

Parsers take the decoded JSON body and return frozen request objects, or raise
ValidationFailed naming the field. They store nothing and touch no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from . import exactjson
from .errors import BadRequest, NotFound, PayloadTooLarge, ValidationFailed

# orjson writes NUL as \u0000; an escaped backslash before "u0000" is not a NUL.
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
RUNTIME_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_WORKER_ID = 200
MAX_IDEMPOTENCY_KEY = 200
MAX_ERROR_CHARS = 10_000
DEFAULT_MAX_DEPTH = 64  # GATEWAY_MAX_JSON_DEPTH
# Levels a body may add around a payload: {"tasks": [{"payload": ...}]}.
BODY_DEPTH_MARGIN = 3

TASK_FIELDS = (
    "id",
    "runtime_id",
    "status",
    "priority",
    "payload",
    "attempts",
    "max_attempts",
    "run_at",
    "expires_at",
    "created_at",
    "updated_at",
)
LEASE_FIELDS = ("lease_id", "lease_expires_at", "worker_id", "cancel_requested")


# Times a request may carry: well inside what both Python and Postgres can store.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def format_time(value: datetime | None) -> str | None:
    """RFC 3339 UTC with microseconds and Z, so that times compare as strings."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(field: str, raw: Any) -> datetime:
    if not isinstance(raw, str):
        raise ValidationFailed(f"{field} must be an RFC 3339 time string", field=field)
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValidationFailed(
            f"{field} must be an RFC 3339 time such as 2026-11-25T21:02:03Z", field=field
        ) from None
    if value.tzinfo is None:
        raise ValidationFailed(f"{field} must carry a time zone (Z or +hh:mm)", field=field)
    if not EARLIEST <= value <= LATEST:
        raise ValidationFailed(
            f"{field} must lie between {EARLIEST.year} and {LATEST.year}", field=field
        )
    return value


def task_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """The API's task object from a tasks row."""
    out: dict[str, Any] = {}
    for key in TASK_FIELDS:
        value = row[key]
        out[key] = format_time(value) if isinstance(value, datetime) else value
    out["id"] = str(row["id"])
    status = row["status"]
    if status == "claimed":
        out["lease_id"] = str(row["lease_id"])
        out["lease_expires_at"] = format_time(row["lease_expires_at"])
        out["worker_id"] = row["worker_id"]
        out["cancel_requested"] = row["cancel_requested"]
    if status == "completed":
        out["result"] = row["result"]
    if row["last_error"] is not None:
        out["last_error"] = row["last_error"]
    return out


def render_task(row: Mapping[str, Any]) -> orjson.Fragment:
    """The task object as JSON, ready to embed in an answer. Raises whatever prevents
    it: a caller decides what becomes of a task that cannot be shown."""
    return orjson.Fragment(orjson.dumps(task_json(row)))


def render_task_or_stub(row: Mapping[str, Any]) -> orjson.Fragment:
    """render_task, or, for a row that cannot be shown whole, the task without its
    payload and result and with `render_error` saying why: one bad row never fails
    a read or a listing."""
    try:
        return render_task(row)
    except Exception as exc:
        stub = dict(row)
        stub["payload"] = stub["result"] = None
        out = task_json(stub)
        out["render_error"] = f"this task cannot be shown: {exc}"
        return orjson.Fragment(orjson.dumps(out))


def check_runtime_id(runtime_id: str) -> str:
    if not RUNTIME_ID_RE.fullmatch(runtime_id):
        raise ValidationFailed(
            "runtime id must be 1-128 characters of letters, digits and . _ : -, "
            "starting with a letter or digit",
            field="runtime_id",
        )
    return runtime_id


def check_task_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"no task with id {raw!r}") from None


def decode_body(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    """The request body as a JSON object; an empty body counts as {}. Numbers are
    kept exactly (see exactjson); a field nested far deeper than any payload may be
    is refused here, naming it, and payload fields are held to `max_depth` later."""
    if not raw.strip():
        return {}
    body = exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def decode_json(raw: bytes, field: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """A whole body that is one JSON value (a webhook's payload), numbers kept exactly;
    `field` names it in errors."""
    value = exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    _check_depth(field, value, max_depth)
    return value


def header_text(raw: str | None, field: str) -> str | None:
    """A header value as UTF-8: the server hands headers over decoded as latin-1."""
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ValidationFailed(f"the {field} header must be UTF-8 text", field=field) from None


def _int(body: Mapping[str, Any], field: str, default: int | None, low: int, high: int) -> int:
    raw = body.get(field, default)
    if raw is None:
        if default is None:
            raise ValidationFailed(f"{field} is required", field=field)
        raw = default
    if isinstance(raw, exactjson.ExactNumber):  # beyond 64 bits, or not a whole number
        raise ValidationFailed(f"{field} must be an integer from {low} to {high}", field=field)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != int(raw):
        raise ValidationFailed(f"{field} must be an integer", field=field)
    if not low <= raw <= high:
        raise ValidationFailed(f"{field} must be between {low} and {high}", field=field)
    return int(raw)


def _number(
    body: Mapping[str, Any], field: str, default: float | None, low: float, high: float
) -> float | None:
    raw = body.get(field)
    if raw is None:
        return default
    if isinstance(raw, exactjson.ExactNumber):
        raw = float(raw)  # a duration need not be exact; inf is refused as out of range
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValidationFailed(f"{field} must be a number", field=field)
    if not low <= raw <= high:
        raise ValidationFailed(f"{field} must be between {low:g} and {high:g}", field=field)
    return float(raw)


def _string(body: Mapping[str, Any], field: str, max_len: int, required: bool) -> str | None:
    raw = body.get(field)
    if raw is None:
        if required:
            raise ValidationFailed(f"{field} is required", field=field)
        return None
    if not isinstance(raw, str) or not raw:
        raise ValidationFailed(f"{field} must be a non-empty string", field=field)
    if len(raw) > max_len:
        raise ValidationFailed(f"{field} must be at most {max_len} characters", field=field)
    if "\x00" in raw:
        raise ValidationFailed(f"{field} must not contain NUL characters", field=field)
    return raw


def _check_depth(field: str, value: Any, max_depth: int) -> None:
    if exactjson.depth(value, max_depth) > max_depth:
        raise ValidationFailed(
            f"{field} is nested more than {max_depth} levels deep (GATEWAY_MAX_JSON_DEPTH)",
            field=field,
        )


def _json_text(field: str, value: Any, max_bytes: int, max_depth: int) -> str:
    """A JSON value serialized for storage, depth- and size-checked, numbers exact.
    Postgres jsonb cannot hold the NUL character, so it is refused here rather than
    failing in the database."""
    _check_depth(field, value, max_depth)
    try:
        text = exactjson.dumps(value).decode()
    except ValueError as exc:
        raise ValidationFailed(f"{field}: {exc}", field=field) from None
    if len(text.encode()) > max_bytes:
        raise PayloadTooLarge(f"{field} is larger than {max_bytes} bytes serialized", field=field)
    if NUL_ESCAPE.search(text):
        raise ValidationFailed(f"{field} must not contain NUL characters (\\u0000)", field=field)
    return text


@dataclass(frozen=True)
class EnqueueRequest:
    payload_json: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    expires_at: datetime | None
    idempotency_key: str | None
    request_hash: str  # what a replay with the same key must match


def parse_enqueue(
    body: Mapping[str, Any],
    header_key: str | None,
    max_payload_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> EnqueueRequest:
    if "payload" not in body:
        raise ValidationFailed("payload is required (any JSON value)", field="payload")
    payload_json = _json_text("payload", body["payload"], max_payload_bytes, max_depth)
    key = _string(body, "idempotency_key", MAX_IDEMPOTENCY_KEY, required=False)
    if header_key is not None:
        if not header_key or len(header_key) > MAX_IDEMPOTENCY_KEY:
            raise ValidationFailed(
                f"Idempotency-Key header must be 1-{MAX_IDEMPOTENCY_KEY} characters",
                field="idempotency_key",
            )
        if key is not None and key != header_key:
            raise BadRequest("idempotency_key in the body and the Idempotency-Key header differ")
        key = header_key
    now = datetime.now(UTC)
    if body.get("delay_seconds") is not None and body.get("run_at") is not None:
        raise ValidationFailed("give delay_seconds or run_at, not both", field="run_at")
    run_at = None
    delay = _number(body, "delay_seconds", None, 0, 365 * 86400)
    if delay:
        run_at = now + timedelta(seconds=delay)
    if body.get("run_at") is not None:
        run_at = parse_time("run_at", body["run_at"])
    ttl = _number(body, "ttl_seconds", None, 1, 365 * 86400)
    expires_at = None
    if ttl is not None:
        expires_at = (run_at or now) + timedelta(seconds=ttl)
    priority = _int(body, "priority", 50, 0, 1000)
    max_attempts = _int(body, "max_attempts", 5, 1, 100)
    # Hash the request as understood, so a retry that spells out a default still matches.
    fingerprint = [
        body["payload"],
        priority,
        max_attempts,
        delay or 0,
        body.get("run_at"),
        ttl,
    ]
    return EnqueueRequest(
        payload_json=payload_json,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        expires_at=expires_at,
        idempotency_key=key,
        request_hash=hashlib.sha256(exactjson.dumps(fingerprint, sort_keys=True)).hexdigest(),
    )


@dataclass(frozen=True)
class ClaimRequest:
    worker_id: str
    max_tasks: int
    wait_seconds: float
    lease_seconds: int


def parse_claim(
    body: Mapping[str, Any], max_wait_seconds: float, default_lease_seconds: int
) -> ClaimRequest:
    worker_id = _string(body, "worker_id", MAX_WORKER_ID, required=True)
    assert worker_id is not None
    wait = _number(body, "wait_seconds", 0.0, 0, max_wait_seconds)
    return ClaimRequest(
        worker_id=worker_id,
        max_tasks=_int(body, "max_tasks", 1, 1, 100),
        wait_seconds=wait or 0.0,
        lease_seconds=_int(body, "lease_seconds", default_lease_seconds, 1, 3600),
    )


def parse_lease_id(body: Mapping[str, Any]) -> uuid.UUID:
    raw = _string(body, "lease_id", 64, required=True)
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise ValidationFailed(
            "lease_id must be the lease_id a claim returned", field="lease_id"
        ) from None


def parse_lease_seconds(body: Mapping[str, Any], default: int) -> int:
    return _int(body, "lease_seconds", default, 1, 3600)


@dataclass(frozen=True)
class FailRequest:
    lease_id: uuid.UUID
    error: str
    retry: bool
    retry_after_seconds: float | None


def parse_fail(body: Mapping[str, Any]) -> FailRequest:
    error = body.get("error")
    if not isinstance(error, str):
        raise ValidationFailed("error is required: a string describing the failure", field="error")
    retry = body.get("retry", True)
    if not isinstance(retry, bool):
        raise ValidationFailed("retry must be true or false", field="retry")
    return FailRequest(
        lease_id=parse_lease_id(body),
        # An error message is kept, not judged: NULs (which Postgres refuses) are replaced.
        error=error[:MAX_ERROR_CHARS].replace("\x00", "\ufffd"),
        retry=retry,
        retry_after_seconds=_number(body, "retry_after_seconds", None, 0, 7 * 86400),
    )


def result_json(
    body: Mapping[str, Any], max_payload_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> str | None:
    if body.get("result") is None:
        return None
    return _json_text("result", body["result"], max_payload_bytes, max_depth)


MAX_BATCH = 1000
STATUSES = ("queued", "claimed", "completed", "dead", "expired", "cancelled")


def parse_batch(
    body: Mapping[str, Any], max_payload_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH
) -> list[EnqueueRequest]:
    """Every item as parse_enqueue; an invalid one fails the batch, naming its index."""
    items = body.get("tasks")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise ValidationFailed(f"tasks must be a list of 1 to {MAX_BATCH} tasks", field="tasks")
    out = []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValidationFailed("each task must be a JSON object", field="")
            out.append(parse_enqueue(item, None, max_payload_bytes, max_depth))
        except (ValidationFailed, PayloadTooLarge, BadRequest) as exc:
            inner = exc.extra.get("field")
            field = f"tasks[{index}].{inner}" if inner else f"tasks[{index}]"
            exc.detail = f"tasks[{index}]: {exc.detail}"
            exc.extra.update(field=field, index=index)
            raise
    return out


def encode_cursor(row: Mapping[str, Any]) -> str:
    raw = f"{row['created_at'].astimezone(UTC).isoformat()}|{row['id']}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, task_id = raw.split("|")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not EARLIEST <= when <= LATEST:
            raise ValueError(created)
        return when, uuid.UUID(task_id)
    except (ValueError, UnicodeDecodeError):
        raise ValidationFailed(
            "cursor is not one this server returned as next_cursor", field="cursor"
        ) from None


@dataclass(frozen=True)
class ListQuery:
    status: str | None
    limit: int
    after: tuple[datetime, uuid.UUID] | None


def parse_list_query(params: Mapping[str, str]) -> ListQuery:
    status = params.get("status") or None
    if status is not None and status not in STATUSES:
        raise ValidationFailed(f"status must be one of {', '.join(STATUSES)}", field="status")
    raw_limit = params.get("limit", "100")
    # Leading zeros off first: int() refuses over 4300 digits with an error of its own.
    digits = raw_limit.lstrip("0") or "0"
    if (
        not (digits.isascii() and digits.isdigit())
        or len(digits) > 4
        or not 1 <= int(digits) <= 1000
    ):
        raise ValidationFailed("limit must be an integer from 1 to 1000", field="limit")
    cursor = params.get("cursor")
    return ListQuery(status, int(digits), decode_cursor(cursor) if cursor else None)
