"""Request validation and the task's JSON form.

Parsers take the decoded JSON body and return frozen request objects, or raise
ValidationFailed naming the field. They store nothing and touch no I/O.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from ..errors import BadRequest, NotFound, PayloadTooLarge, ValidationFailed
from ..rows import TaskRow
from . import exactjson
from .bodies import (
    BATCH_BODY,
    CLAIM_BODY,
    COMPLETE_BODY,
    ENQUEUE_BODY,
    FAIL_BODY,
    IDEMPOTENCY_KEY_HEADER,
    JSON_DEPTH,
    LEASE_ID,
    LEASE_SECONDS,
    LIST_QUERY,
    MAX_ERROR_CHARS,
    PAYLOAD_BYTES,
    WEBHOOK_KEY_PREFIX,
)
from .bodies import MAX_BATCH as MAX_BATCH
from .bodies import MAX_IDEMPOTENCY_KEY as MAX_IDEMPOTENCY_KEY
from .bodies import MAX_WORKER_ID as MAX_WORKER_ID
from .bodies import STATUSES as STATUSES
from .fields import (
    EARLIEST,
    LATEST,
    WRITTEN_BUDGET,
    Field,
    WrittenBudget,
    in_item,
    json_text,
    read_query,
    resolve,
    too_deep,
)

RUNTIME_ID_MAX_CHARS = 128
RUNTIME_ID_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._:-]{{0,{RUNTIME_ID_MAX_CHARS - 1}}}$")
DEFAULT_MAX_DEPTH = 64  # GATEWAY_MAX_JSON_DEPTH
# Levels a body may add around a payload: {"tasks": [{"payload": ...}]}.
BODY_DEPTH_MARGIN = 3
# The list of items in every batch body (bodies.BATCH_BODY, COMPLETE_MANY_BODY ...).
_BATCH_ITEMS = BATCH_BODY["tasks"].name

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


def format_time(value: datetime | None) -> str | None:
    """RFC 3339 UTC with microseconds and Z, so that times compare as strings."""
    if value is None:
        return None
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def task_json(row: TaskRow) -> dict[str, Any]:
    """The API's task object from a tasks row."""
    out: dict[str, Any] = {}
    for key in TASK_FIELDS:
        value = getattr(row, key)
        out[key] = format_time(value) if isinstance(value, datetime) else value
    out["id"] = str(row.id)
    if row.status == "claimed":
        out["lease_id"] = str(row.lease_id)
        out["lease_expires_at"] = format_time(row.lease_expires_at)
        out["worker_id"] = row.worker_id
        out["cancel_requested"] = row.cancel_requested
    if row.status == "completed":
        out["result"] = row.result
    if row.last_error is not None:
        out["last_error"] = row.last_error
    return out


def task_bytes(row: TaskRow) -> bytes:
    """The task object as JSON bytes. Raises whatever prevents it: a caller decides
    what becomes of a task that cannot be shown."""
    return orjson.dumps(task_json(row))


def render_task(row: TaskRow) -> orjson.Fragment:
    """task_bytes, ready to embed in an answer."""
    return orjson.Fragment(task_bytes(row))


def task_bytes_or_stub(row: TaskRow) -> bytes:
    """task_bytes, or, for a row that cannot be shown whole, the task without its
    payload and result and with `render_error` saying why: one bad row never fails
    a read or a listing."""
    try:
        return task_bytes(row)
    except Exception as exc:
        out = task_json(replace(row, payload=None, result=None))
        out["render_error"] = f"this task cannot be shown: {exc}"
        return orjson.dumps(out)


def render_task_or_stub(row: TaskRow) -> orjson.Fragment:
    """task_bytes_or_stub, ready to embed in an answer."""
    return orjson.Fragment(task_bytes_or_stub(row))


def task_ref_json(task_id: uuid.UUID) -> str:
    """A task's reference, `{"id":"<uuid>"}`: all an enqueue answers of a task under
    `Prefer: return=minimal` (queries.TASK_REF_JSON writes the same in Postgres)."""
    return f'{{"id":"{task_id}"}}'


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
    kept exactly (see exactjson); the fields that store JSON (payload, result) are
    held to `max_depth`, and to the request's WrittenBudget, when they are read."""
    if not raw.strip():
        return {}
    try:
        body = exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    except exactjson.NestedTooDeep as exc:
        raise _nested_too_deep(exc.value, max_depth, "body") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def decode_json(raw: bytes, field: str, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """A whole body that is one JSON value, the `field` it becomes (a webhook's
    payload), numbers kept exactly. Only bounded here; the field holds it to
    `max_depth`, naming itself."""
    try:
        return exactjson.loads(raw, max_depth + BODY_DEPTH_MARGIN)
    except exactjson.NestedTooDeep as exc:
        raise _nested_too_deep(exc.value, max_depth, field) from None


def _nested_too_deep(cut: Any, max_depth: int, name: str) -> ValidationFailed:
    """The refusal of a body nested deeper than the parsers go, `cut` being what they
    read of it (exactjson.NestedTooDeep), whose deep part is last at every level: the
    answer a body nested just within their reach gets. It names a top-level field, or
    a field of an item of a batch's `tasks` (`tasks[3].payload`, as the batch parsers
    name it); `name` for a body that is not an object."""
    if not isinstance(cut, dict) or not cut:
        return too_deep(name, max_depth)
    key, value = next(reversed(cut.items()))
    if key == _BATCH_ITEMS and isinstance(value, list) and value and isinstance(value[-1], dict):
        item = value[-1]
        if item:
            return in_item(too_deep(next(reversed(item)), max_depth), len(value) - 1)
    return too_deep(str(key)[:100], max_depth)


def header_text(raw: str | None, field: str) -> str | None:
    """A header value as UTF-8: the server hands headers over decoded as latin-1."""
    if raw is None:
        return None
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ValidationFailed(f"the {field} header must be UTF-8 text", field=field) from None


def _payload_limits(
    max_payload_bytes: int, max_depth: int, budget: WrittenBudget | None = None
) -> dict[str, Any]:
    """The limits a request's JSON fields are read with; `budget`, when given, is what
    they may come to together (GATEWAY_MAX_BODY_BYTES, see schema.WrittenBudget)."""
    limits: dict[str, Any] = {PAYLOAD_BYTES.name: max_payload_bytes, JSON_DEPTH.name: max_depth}
    if budget is not None:
        limits[WRITTEN_BUDGET] = budget
    return limits


def written_budget(max_body_bytes: int | None) -> WrittenBudget | None:
    """A request's WrittenBudget, or None (no bound) when `max_body_bytes` is None."""
    return None if max_body_bytes is None else WrittenBudget(max_body_bytes)


class EnqueueRequest(NamedTuple):
    """One task to enqueue, as understood. A named tuple rather than a frozen dataclass,
    whose __init__ (a checked setattr per field) cost twice as much: a batch makes a
    thousand of these per request."""

    payload_json: str
    priority: int
    max_attempts: int
    run_at: datetime | None  # as given; else now (Postgres's clock) plus delay_seconds
    delay_seconds: float | None
    ttl_seconds: float | None  # expires this long after run_at
    idempotency_key: str | None
    # What a replay with the same key must match; '' for a batch item without a key,
    # which nothing is matched against (its hash was a measurable part of a batch).
    request_hash: str


# The enqueue body's fields, looked up once; the optional ones take null as absent.
_PAYLOAD = ENQUEUE_BODY["payload"]
_KEY = ENQUEUE_BODY["idempotency_key"]
_DELAY = ENQUEUE_BODY["delay_seconds"]
_RUN_AT = ENQUEUE_BODY["run_at"]
_TTL = ENQUEUE_BODY["ttl_seconds"]
_PRIORITY = ENQUEUE_BODY["priority"]
_MAX_ATTEMPTS = ENQUEUE_BODY["max_attempts"]
_OPTIONAL = (_KEY, _DELAY, _RUN_AT, _TTL, _PRIORITY, _MAX_ATTEMPTS)
assert all(f.null_means_absent for f in _OPTIONAL)


@functools.lru_cache(maxsize=16)
def _absent_values(max_payload_bytes: int, max_depth: int) -> dict[str, Any]:
    """What each optional enqueue field reads as when it is left out, from its own
    reader: a field absent from a body is then not read at all (a batch's items
    usually carry a payload and little else). The caller must not change it."""
    limits = _payload_limits(max_payload_bytes, max_depth)
    return {f.name: f.read({}, limits) for f in _OPTIONAL}


def parse_enqueue(
    body: Mapping[str, Any],
    header_key: str | None,
    max_payload_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_body_bytes: int | None = None,
) -> EnqueueRequest:
    """One task. `max_body_bytes` (GATEWAY_MAX_BODY_BYTES) bounds its payload written
    out, as for a batch's payloads together."""
    limits = _payload_limits(max_payload_bytes, max_depth, written_budget(max_body_bytes))
    return _parse_enqueue(body, header_key, limits, _absent_values(max_payload_bytes, max_depth))


def _optional(
    field: Field, body: Mapping[str, Any], limits: Mapping[str, Any], absent: Mapping[str, Any]
) -> Any:
    """An optional field's value: read when given, else its default (null reads as
    absent)."""
    return absent[field.name] if body.get(field.name) is None else field.read(body, limits)


def _parse_enqueue(
    body: Mapping[str, Any],
    header_key: str | None,
    limits: Mapping[str, Any],
    absent: Mapping[str, Any],
    hash_without_key: bool = True,
) -> EnqueueRequest:
    # Each optional field is read only when given; the order of the reads decides which
    # of several bad fields a refusal names.
    payload_json = _PAYLOAD.read(body, limits)
    key = _optional(_KEY, body, limits, absent)
    if header_key is not None:
        longest = IDEMPOTENCY_KEY_HEADER.max_length
        if not header_key or len(header_key) > (longest or 0):
            raise ValidationFailed(
                f"Idempotency-Key header must be 1-{longest} characters", field="idempotency_key"
            )
        if key is not None and key != header_key:
            raise BadRequest("idempotency_key in the body and the Idempotency-Key header differ")
        key = header_key
    if key is not None and key.startswith(WEBHOOK_KEY_PREFIX):
        raise ValidationFailed(
            f"idempotency keys starting with {WEBHOOK_KEY_PREFIX!r} are kept for signed "
            "webhook deliveries; choose another key",
            field="idempotency_key",
        )
    ENQUEUE_BODY.check_exclusive(body)
    delay = _optional(_DELAY, body, limits, absent)
    run_at = _optional(_RUN_AT, body, limits, absent)
    ttl = _optional(_TTL, body, limits, absent)
    priority = _optional(_PRIORITY, body, limits, absent)
    max_attempts = _optional(_MAX_ATTEMPTS, body, limits, absent)
    request_hash = ""
    if key is not None or hash_without_key:
        # Hash the request as understood, so a retry that spells out a default matches.
        fingerprint = [body["payload"], priority, max_attempts, delay or 0, body.get("run_at"), ttl]
        request_hash = hashlib.sha256(exactjson.dumps(fingerprint, sort_keys=True)).hexdigest()
    return EnqueueRequest(
        payload_json=payload_json,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        delay_seconds=delay or None,
        ttl_seconds=ttl,
        idempotency_key=key,
        request_hash=request_hash,
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
    spec = CLAIM_BODY
    limits = {"max_wait_seconds": max_wait_seconds, "default_lease_seconds": default_lease_seconds}
    worker_id = spec["worker_id"].read(body, limits)
    wait = spec["wait_seconds"].read(body, limits)
    return ClaimRequest(
        worker_id=worker_id,
        max_tasks=spec["max_tasks"].read(body, limits),
        wait_seconds=wait or 0.0,
        lease_seconds=spec["lease_seconds"].read(body, limits),
    )


def parse_lease_id(body: Mapping[str, Any]) -> uuid.UUID:
    lease_id: uuid.UUID = LEASE_ID.read(body, {})
    return lease_id


def parse_lease_seconds(body: Mapping[str, Any], default: int) -> int:
    seconds: int = LEASE_SECONDS.read(body, {"default_lease_seconds": default})
    return seconds


@dataclass(frozen=True)
class FailRequest:
    lease_id: uuid.UUID
    error: str
    retry: bool
    retry_after_seconds: float | None


def parse_fail(body: Mapping[str, Any]) -> FailRequest:
    spec = FAIL_BODY
    error = spec["error"].read(body, {})
    retry = spec["retry"].read(body, {})
    return FailRequest(
        lease_id=parse_lease_id(body),
        # An error message is kept, not judged: NULs (which Postgres refuses) are replaced.
        error=error[:MAX_ERROR_CHARS].replace("\x00", "\ufffd"),
        retry=retry,
        retry_after_seconds=spec["retry_after_seconds"].read(body, {}),
    )


def result_json(
    body: Mapping[str, Any],
    max_payload_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    budget: WrittenBudget | None = None,
) -> str | None:
    """A complete's result, serialized and checked; its written size is spent from the
    request's `budget` (one for a batch of completes)."""
    result: str | None = COMPLETE_BODY["result"].read(
        body, _payload_limits(max_payload_bytes, max_depth, budget)
    )
    return result


_new_tuple = tuple.__new__


def parse_batch(
    body: Mapping[str, Any],
    max_payload_bytes: int,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_body_bytes: int | None = None,
) -> list[EnqueueRequest]:
    """Every item as parse_enqueue; an invalid one fails the batch, naming its index.
    The payloads written out come to at most `max_body_bytes` together."""
    items = BATCH_BODY["tasks"].read(body, {})
    budget = written_budget(max_body_bytes)
    limits = _payload_limits(max_payload_bytes, max_depth, budget)
    bounds = (
        resolve(_PAYLOAD.max_bytes, limits),
        resolve(_PAYLOAD.max_depth, limits),
        budget,
    )
    absent = _absent_values(max_payload_bytes, max_depth)
    # What an item that gives nothing but its payload reads as, past the payload (the
    # first field), as _parse_enqueue would read it.
    plain = EnqueueRequest(
        payload_json="",
        priority=absent["priority"],
        max_attempts=absent["max_attempts"],
        run_at=absent["run_at"],
        delay_seconds=absent["delay_seconds"] or None,
        ttl_seconds=absent["ttl_seconds"],
        idempotency_key=absent["idempotency_key"],
        request_hash="",
    )[1:]
    out = []
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValidationFailed("each task must be a JSON object", field="")
            if len(item) == 1 and "payload" in item:
                # Nothing but a payload (the usual item): no other field to read, and
                # the payload read as _PAYLOAD's reader reads a present one, without
                # its lookups (a sixth of the batch's validation).
                # tuple.__new__: a named tuple's own __new__ is a Python function, a
                # third of the cost of making one; `plain` has the other fields' arity.
                payload = json_text("payload", item["payload"], *bounds)
                out.append(_new_tuple(EnqueueRequest, (payload, *plain)))
            else:
                out.append(_parse_enqueue(item, None, limits, absent, hash_without_key=False))
        except (ValidationFailed, PayloadTooLarge, BadRequest) as exc:
            raise in_item(exc, index) from None
    return out


def encode_cursor(row: TaskRow) -> str:
    return keyset_cursor(row.created_at, row.id)


def keyset_cursor(created_at: datetime, row_id: uuid.UUID) -> str:
    """The cursor after a row of a listing ordered by (created_at, id), for a caller who
    may see every row of it (a runtime's tasks, the tokens): opaque to clients, but not
    sealed, since it names a row the caller was just shown."""
    raw = f"{created_at.astimezone(UTC).isoformat()}|{row_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, id) a keyset_cursor continues after, or 422 naming `cursor`."""
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
    """The listing's query, read by LIST_QUERY's fields (schema.read_query)."""
    status = read_query(LIST_QUERY["status"], params, {})
    limit = read_query(LIST_QUERY["limit"], params, {})
    cursor = read_query(LIST_QUERY["cursor"], params, {})
    return ListQuery(status, limit, None if cursor is None else decode_cursor(cursor))
