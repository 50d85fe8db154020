"""Request parsers: each takes a decoded body (decode.py) and returns a frozen request
object, or raises ValidationFailed naming the field. They store nothing and touch no
I/O; the fields they read are declared in bodies.py.
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

from ..errors import BadRequest, PayloadTooLarge, ValidationFailed
from ..rows import ControlsChange
from . import exactjson
from .bodies import (
    BATCH_BODY,
    CLAIM_BODY,
    COMPLETE_BODY,
    CONTROLS_BODY,
    ENQUEUE_BODY,
    FAIL_BODY,
    IDEMPOTENCY_KEY_HEADER,
    JSON_DEPTH,
    LEASE_ID,
    LEASE_SECONDS,
    LIST_QUERY,
    MAX_ERROR_CHARS,
    PAUSE_BODY,
    PAYLOAD_BYTES,
    WAIT_QUERY,
    WEBHOOK_KEY_PREFIX,
)
from .cursors import decode_cursor
from .decode import DEFAULT_MAX_DEPTH
from .fields import Field, read_query, resolve
from .trace import TraceContext
from .values import WRITTEN_BUDGET, WrittenBudget, in_item, json_text


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
    # Its trace context (api/trace.py): stored with the task, not part of request_hash.
    trace_parent: str | None = None
    trace_state: str | None = None


# The enqueue body's fields, looked up once; the optional ones take null as absent.
_PAYLOAD = ENQUEUE_BODY["payload"]
_KEY = ENQUEUE_BODY["idempotency_key"]
_DELAY = ENQUEUE_BODY["delay_seconds"]
_RUN_AT = ENQUEUE_BODY["run_at"]
_TTL = ENQUEUE_BODY["ttl_seconds"]
_PRIORITY = ENQUEUE_BODY["priority"]
_MAX_ATTEMPTS = ENQUEUE_BODY["max_attempts"]
_TRACE = ENQUEUE_BODY["trace"]
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
    context = _TRACE.read(body, limits) if "trace" in body else None
    return EnqueueRequest(
        payload_json=payload_json,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        delay_seconds=delay or None,
        ttl_seconds=ttl,
        idempotency_key=key,
        request_hash=request_hash,
        trace_parent=None if context is None else context.traceparent,
        trace_state=None if context is None else context.tracestate,
    )


def traced(req: EnqueueRequest, context: TraceContext | None) -> EnqueueRequest:
    """The request with the trace context of its HTTP request's headers, unless it has
    one of its own (a body's or a batch item's `trace`, which wins)."""
    if context is None or req.trace_parent is not None:
        return req
    return req._replace(trace_parent=context.traceparent, trace_state=context.tracestate)


@dataclass(frozen=True)
class ClaimRequest:
    worker_id: str
    max_tasks: int
    wait_seconds: float
    lease_seconds: int


def parse_claim(
    body: Mapping[str, Any], max_wait_seconds: float, default_lease_seconds: int
) -> ClaimRequest:
    plain = _plain_claim(body, max_wait_seconds, default_lease_seconds)
    if plain is not None:
        return plain
    return claim_by_fields(body, max_wait_seconds, default_lease_seconds)


def claim_by_fields(
    body: Mapping[str, Any], max_wait_seconds: float, default_lease_seconds: int
) -> ClaimRequest:
    """parse_claim through CLAIM_BODY's fields alone: every body, each error naming its
    field. parse_claim answers the same, faster for the usual body."""
    limits = {"max_wait_seconds": max_wait_seconds, "default_lease_seconds": default_lease_seconds}
    worker_id = _CLAIM_WORKER_ID.read(body, limits)
    wait = _CLAIM_WAIT_SECONDS.read(body, limits)
    return ClaimRequest(
        worker_id=worker_id,
        max_tasks=_CLAIM_MAX_TASKS.read(body, limits),
        wait_seconds=wait or 0.0,
        lease_seconds=_CLAIM_LEASE_SECONDS.read(body, limits),
    )


def _plain_claim(
    body: Mapping[str, Any], max_wait_seconds: float, default_lease_seconds: int
) -> ClaimRequest | None:
    """The claim most daemons send, read as CLAIM_BODY's fields read it but without
    their machinery (every poll comes here): a worker_id that is a plain string within
    its rules, and wait_seconds, max_tasks and lease_seconds left out or plain numbers
    within their bounds. None for anything else (a float max_tasks, an error): the
    fields then read the body, and refuse it naming the field."""
    worker_id = body.get("worker_id")
    if (
        type(worker_id) is not str
        or not worker_id
        or len(worker_id) > _MAX_WORKER_ID
        or "\x00" in worker_id
    ):
        return None
    wait = body.get("wait_seconds")
    if wait is None:
        wait = 0.0
    elif type(wait) not in (int, float) or not 0 <= wait <= max_wait_seconds:
        return None
    max_tasks = body.get("max_tasks")
    if max_tasks is None:
        max_tasks = _DEFAULT_MAX_TASKS
    elif type(max_tasks) is not int or not _MIN_MAX_TASKS <= max_tasks <= _MAX_MAX_TASKS:
        return None
    lease = body.get("lease_seconds")
    if lease is None:
        lease = default_lease_seconds
    if type(lease) is not int or not _MIN_LEASE <= lease <= _MAX_LEASE:
        return None
    return ClaimRequest(worker_id, max_tasks, float(wait) or 0.0, lease)


# Looked up once: a Body finds a field by name in a list, and every poll reads these.
_CLAIM_WORKER_ID = CLAIM_BODY["worker_id"]
_CLAIM_WAIT_SECONDS = CLAIM_BODY["wait_seconds"]
_CLAIM_MAX_TASKS = CLAIM_BODY["max_tasks"]
_CLAIM_LEASE_SECONDS = CLAIM_BODY["lease_seconds"]
# Their rules, for _plain_claim; fixed numbers, as the fields declare them.
_MAX_WORKER_ID = int(_CLAIM_WORKER_ID.max_length or 0)
_DEFAULT_MAX_TASKS = int(_CLAIM_MAX_TASKS.default)
_MIN_MAX_TASKS = int(cast(int, _CLAIM_MAX_TASKS.minimum))
_MAX_MAX_TASKS = int(cast(int, _CLAIM_MAX_TASKS.maximum))
_MIN_LEASE = int(cast(int, _CLAIM_LEASE_SECONDS.minimum))
_MAX_LEASE = int(cast(int, _CLAIM_LEASE_SECONDS.maximum))


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


@dataclass(frozen=True)
class ListQuery:
    status: str | None
    limit: int
    after: tuple[datetime, uuid.UUID] | None
    schedule: str | None = None


def parse_list_query(params: Mapping[str, str]) -> ListQuery:
    """The listing's query, read by LIST_QUERY's fields (fields.read_query)."""
    status = read_query(LIST_QUERY["status"], params, {})
    limit = read_query(LIST_QUERY["limit"], params, {})
    cursor = read_query(LIST_QUERY["cursor"], params, {})
    schedule = read_query(LIST_QUERY["schedule"], params, {})
    return ListQuery(status, limit, None if cursor is None else decode_cursor(cursor), schedule)


def parse_controls(body: Any) -> ControlsChange:
    """A PATCH/PUT body, or 422 naming the field. At least one field must be given."""
    CONTROLS_BODY.check_fields(body)
    paused = None
    if "paused" in body:
        paused = CONTROLS_BODY["paused"].read(body, {})
    max_in_flight = CONTROLS_BODY["max_in_flight"].read(body, {})
    rate = CONTROLS_BODY["claims_per_second"].read(body, {})
    return ControlsChange(
        paused=paused,
        max_in_flight=max_in_flight,
        claims_per_second=rate,
        sets_max_in_flight="max_in_flight" in body,
        sets_claims_per_second="claims_per_second" in body,
    )


def parse_pause(body: Any, now: datetime | None = None) -> ControlsChange:
    """A pause's body ({} when empty), or 422 naming the field: `until` must be an
    RFC 3339 time after `now` (the wall clock)."""
    PAUSE_BODY.check_fields(body)
    reason = PAUSE_BODY["reason"].read(body, {})
    until = PAUSE_BODY["until"].read(body, {})
    if until is not None and until <= (now or datetime.now(UTC)):
        raise ValidationFailed(
            "until must be in the future (leave it out to pause until resumed)", field="until"
        )
    return ControlsChange(paused=True, paused_reason=reason, paused_until=until)


def parse_wait(params: Mapping[str, str], max_wait_seconds: float) -> float:
    """`wait_seconds` from the query string (WAIT_QUERY): 0 when absent; a 422 naming
    the field when it is empty, no number, negative, or above the server's cap."""
    limits = {"max_wait_seconds": max_wait_seconds}
    return float(read_query(WAIT_QUERY["wait_seconds"], params, limits) or 0.0)


# The enqueue options a delivery may set in the query string; validated by models.
# The enqueue options a signed delivery may set in its query string.
QUERY_FIELDS = ("priority", "delay_seconds", "ttl_seconds", "max_attempts")


NUMBER_RE = re.compile(r"^-?[0-9]{1,15}(\.[0-9]{1,15})?$")


def query_fields(params: Iterable[tuple[str, str]]) -> dict[str, int | float]:
    """A signed delivery's enqueue options, from its query string's (name, value) pairs,
    as numbers for parse_enqueue to range-check; an unknown, repeated or non-numeric
    parameter is ValidationFailed."""
    out: dict[str, int | float] = {}
    for name, value in params:
        if name not in QUERY_FIELDS:
            raise ValidationFailed(
                f"unknown query parameter {name!r}; a delivery may set {', '.join(QUERY_FIELDS)}",
                field=name,
            )
        if name in out:
            raise ValidationFailed(f"query parameter {name} is given twice", field=name)
        if not NUMBER_RE.fullmatch(value):
            raise ValidationFailed(f"{name} must be a number, got {value!r}", field=name)
        out[name] = float(value) if "." in value else int(value)
    return out
