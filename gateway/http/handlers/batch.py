"""Batch lease operations: complete, fail and heartbeat many tasks in one request.

Each item is what the single operation (`/v1/tasks/{id}/complete`, `/fail`,
`/heartbeat`) would do with it, and each answers its own outcome, in the request's
order: the single operation's status as `outcome`, or the problem it would have
answered (`lease_lost`, `not_found`). One item's problem never undoes another's
success. A problem with the request as a whole (not JSON, no items or more than
bodies.MAX_LEASE_BATCH, a malformed item, a task named twice) is a 4xx naming the item,
and nothing is stored.

A token limited to some runtimes sees another runtime's task as `not_found`, as on a
single operation. The handlers call the store; they import no driver.

A claim may carry completes and fails too (`complete`, `fail`: daemon.claim): they are
read by the same parsers (parse_acks), applied by the same statements and answered by
the same entries (acknowledge).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...api import bodies, decode, render, requests
from ...api.bodies import (
    CLAIM_BODY,
    COMPLETE_MANY_BODY,
    FAIL_MANY_BODY,
    HEARTBEAT_MANY_BODY,
    TASK_ID,
)
from ...api.fields import Field
from ...api.values import in_item
from ...claim.waiters import Carried
from ...errors import BadRequest, PayloadTooLarge, ValidationFailed, problem_for
from ...instance import Gateway
from ...rows import ItemResult, ended
from ...settings import Settings
from ..io import json_response, read_json

# What a failed task's outcome says when it is to run again, whenever that is.
RETRYING = "queued"
# Outcomes that end the task: anything else a fail answers will run again.
FAIL_ENDS = ("dead", "cancelled")
EXTENDED = "extended"


@dataclass(frozen=True)
class CompleteItem:
    task_id: uuid.UUID
    lease_id: uuid.UUID
    result_json: str | None  # serialized and checked, as for a single complete


@dataclass(frozen=True)
class FailItem:
    task_id: uuid.UUID
    request: requests.FailRequest


@dataclass(frozen=True)
class HeartbeatItem:
    task_id: uuid.UUID
    lease_id: uuid.UUID
    lease_seconds: int


# -- parsing ------------------------------------------------------------------


@contextlib.contextmanager
def _naming(index: int, array: str = "tasks") -> Iterator[None]:
    """Errors raised inside name the item: `tasks[3]: ...`, field `tasks[3].lease_id`."""
    try:
        yield
    except (ValidationFailed, PayloadTooLarge, BadRequest) as exc:
        raise in_item(exc, index, array) from None


# The list of items of each batch body; a claim's acknowledgements are read by the same
# parsers from its `complete` and `fail` (bodies.CLAIM_BODY).
COMPLETE_TASKS = COMPLETE_MANY_BODY["tasks"]
FAIL_TASKS = FAIL_MANY_BODY["tasks"]
HEARTBEAT_TASKS = HEARTBEAT_MANY_BODY["tasks"]
CLAIM_COMPLETE = CLAIM_BODY["complete"]
CLAIM_FAIL = CLAIM_BODY["fail"]


def _items(
    body: Mapping[str, Any], field: Field, seen: dict[uuid.UUID, str] | None = None
) -> list[tuple[uuid.UUID, Mapping[str, Any]]]:
    """(task id, item) per item of the list `field` of a body; refuses a task named
    twice, in this list or in another one `seen` holds (task id -> where it was named)."""
    raw = body.get(field.name)
    if isinstance(raw, list) and field.max_items is not None and len(raw) > field.max_items:
        raise ValidationFailed(
            f"{field.name} holds {len(raw)} items; a request may hold at most {field.max_items}",
            field=field.name,
        )
    out: list[tuple[uuid.UUID, Mapping[str, Any]]] = []
    seen = {} if seen is None else seen
    for index, item in enumerate(field.read(body, {})):
        with _naming(index, field.name):
            if not isinstance(item, dict):
                raise ValidationFailed("each task must be a JSON object", field="")
            task_id: uuid.UUID = TASK_ID.read(item, {})
            if task_id in seen:
                raise ValidationFailed(
                    f"task {task_id} is also {seen[task_id]}; a batch may name a task once",
                    field="id",
                )
            seen[task_id] = f"{field.name}[{index}]"
            out.append((task_id, item))
    return out


def parse_complete_many(
    body: Mapping[str, Any],
    max_payload_bytes: int,
    max_depth: int = decode.DEFAULT_MAX_DEPTH,
    max_body_bytes: int | None = None,
    field: Field = COMPLETE_TASKS,
    seen: dict[uuid.UUID, str] | None = None,
) -> list[CompleteItem]:
    """A complete-many body (bodies.COMPLETE_MANY_BODY), or the list `field` of another
    body; each result within the payload limits, as for a single complete, and all of
    them written out within `max_body_bytes` together."""
    out = []
    budget = requests.written_budget(max_body_bytes)
    for index, (task_id, item) in enumerate(_items(body, field, seen)):
        with _naming(index, field.name):
            lease_id = requests.parse_lease_id(item)
            result = requests.result_json(item, max_payload_bytes, max_depth, budget)
            out.append(CompleteItem(task_id, lease_id, result))
    return out


def parse_fail_many(
    body: Mapping[str, Any], field: Field = FAIL_TASKS, seen: dict[uuid.UUID, str] | None = None
) -> list[FailItem]:
    """A fail-many body (bodies.FAIL_MANY_BODY), or the list `field` of another body:
    each item as a single fail's body."""
    out = []
    for index, (task_id, item) in enumerate(_items(body, field, seen)):
        with _naming(index, field.name):
            out.append(FailItem(task_id, requests.parse_fail(item)))
    return out


def parse_heartbeat_many(
    body: Mapping[str, Any], default_lease_seconds: int
) -> list[HeartbeatItem]:
    """A heartbeat-many body (bodies.HEARTBEAT_MANY_BODY); lease_seconds per item."""
    out = []
    for index, (task_id, item) in enumerate(_items(body, HEARTBEAT_TASKS)):
        with _naming(index, HEARTBEAT_TASKS.name):
            lease_id = requests.parse_lease_id(item)
            seconds = requests.parse_lease_seconds(item, default_lease_seconds)
            out.append(HeartbeatItem(task_id, lease_id, seconds))
    return out


# -- answers ------------------------------------------------------------------


def _entry(result: ItemResult, outcome: str | None = None, **extra: Any) -> dict[str, Any]:
    """One item's answer: its outcome, or the problem the single operation answers."""
    entry: dict[str, Any] = {"id": str(result.task_id)}
    if result.error is not None:
        _, problem = problem_for(result.error)
        entry["outcome"] = result.error.code
        entry["problem"] = problem
        return entry
    entry["outcome"] = outcome or result.status
    entry.update(extra)
    return entry


def complete_entry(result: ItemResult) -> dict[str, Any]:
    """`completed`, or `cancelled` when a cancel was requested while it was held."""
    return _entry(result)


def fail_entry(result: ItemResult) -> dict[str, Any]:
    """`queued` with the retry's run_at, or `dead`, or `cancelled`."""
    if result.error is None and result.status not in FAIL_ENDS:
        return _entry(result, RETRYING, run_at=render.format_time(result.run_at))
    return _entry(result)


def heartbeat_entry(result: ItemResult) -> dict[str, Any]:
    """`extended`, with the new lease expiry and whether a cancel was requested."""
    return _entry(
        result,
        EXTENDED,
        lease_expires_at=render.format_time(result.lease_expires_at),
        cancel_requested=result.cancel_requested,
    )


def _runtimes(request: Request) -> Sequence[str] | None:
    """The runtime patterns of the caller's token; None: every runtime."""
    principal = getattr(request.state, "principal", None)
    return None if principal is None else principal.runtimes


# -- handlers -----------------------------------------------------------------


async def complete_many(request: Request, gw: Gateway) -> Response:
    settings = gw.settings
    items = parse_complete_many(
        await read_json(request, gw.settings),
        settings.max_payload_bytes,
        settings.max_json_depth,
        settings.max_body_bytes,
    )
    results = await gw.completions.complete_many(
        [i.task_id for i in items],
        [i.lease_id for i in items],
        [i.result_json for i in items],
        _runtimes(request),
    )
    return json_response({"results": await completed(gw, results)})


async def fail_many(request: Request, gw: Gateway) -> Response:
    items = parse_fail_many(await read_json(request, gw.settings))
    results = await gw.store.fail_many(*_fail_columns(items), _runtimes(request))
    return json_response({"results": await failed(gw, results)})


def _complete_columns(
    items: Sequence[CompleteItem],
) -> tuple[list[uuid.UUID], list[uuid.UUID], list[str | None]]:
    return [i.task_id for i in items], [i.lease_id for i in items], [i.result_json for i in items]


def _fail_columns(
    items: Sequence[FailItem],
) -> tuple[list[uuid.UUID], list[uuid.UUID], list[str], list[bool], list[float | None]]:
    return (
        [i.task_id for i in items],
        [i.request.lease_id for i in items],
        [i.request.error for i in items],
        [i.request.retry for i in items],
        [i.request.retry_after_seconds for i in items],
    )


async def completed(gw: Gateway, results: Sequence[ItemResult]) -> list[dict[str, Any]]:
    """After the commit of completes: the requests waiting for their results woken, and
    the answer's entries."""
    await gw.completes_settled(results)
    return [complete_entry(r) for r in results]


async def failed(gw: Gateway, results: Sequence[ItemResult]) -> list[dict[str, Any]]:
    """After the commit of fails: tasks queued again announced, the requests waiting for
    the results of those that ended woken, and the answer's entries."""
    entries = [fail_entry(r) for r in results]
    # Tasks queued again are claimable (now or at their run_at): one bump per runtime,
    # after the commit (I1), as a single fail makes for its task.
    again = {
        r.runtime_id for r, e in zip(results, entries, strict=True) if e["outcome"] == RETRYING
    }
    for runtime_id in sorted(rt for rt in again if rt is not None):
        await gw.claimer.announce(runtime_id)
    runtimes = [r.runtime_id for r in results if r.runtime_id is not None]
    await gw.tasks_ended(ended(results), [rt for rt in runtimes if rt not in again])
    gw.lease_spans.ended_many(results, "fail")
    return entries


# -- a claim's acknowledgements (daemon.claim) -----------------------------------


@dataclass(frozen=True)
class Acks:
    """The completes and fails a claim carries, parsed as the batch endpoints parse them."""

    completes: list[CompleteItem]
    fails: list[FailItem]

    @property
    def empty(self) -> bool:
        """Both lists were sent empty: the claim carries nothing to apply."""
        return not self.completes and not self.fails


def parse_acks(body: Mapping[str, Any], settings: Settings) -> Acks | None:
    """A claim body's `complete` and `fail` (bodies.CLAIM_BODY); None when it has
    neither. Together they hold at most bodies.MAX_LEASE_BATCH items, each task once."""
    complete_field, fail_field = CLAIM_COMPLETE, CLAIM_FAIL
    if complete_field.name not in body and fail_field.name not in body:
        return None
    sizes = [
        len(v) if isinstance(v := body.get(f.name), list) else 0
        for f in (complete_field, fail_field)
    ]
    most = bodies.MAX_LEASE_BATCH
    if sum(sizes) > most and max(sizes) <= most:
        raise ValidationFailed(
            f"complete and fail hold {sum(sizes)} items together; a claim may carry at most {most}",
            field=fail_field.name,
        )
    seen: dict[uuid.UUID, str] = {}
    completes = []
    if complete_field.name in body:
        completes = parse_complete_many(
            body,
            settings.max_payload_bytes,
            settings.max_json_depth,
            settings.max_body_bytes,
            complete_field,
            seen,
        )
    fails = parse_fail_many(body, fail_field, seen) if fail_field.name in body else []
    return Acks(completes, fails)


def carry(acks: Acks, runtimes: Sequence[str] | None) -> Carried | None:
    """A claim's completes as its pump applies them, in the claim's own statement
    (Carried); None when it carries fails too, which `acknowledge` applies first. Their
    outcomes become the answer's entries as `POST /v1/tasks:complete` writes them, as
    one JSON text (a parked poll holds about 0.2 KiB an outcome, not a dict each)."""
    if acks.fails or not acks.completes:
        return None

    def settle(outcomes: list[ItemResult]) -> orjson.Fragment:
        return orjson.Fragment(orjson.dumps([complete_entry(r) for r in outcomes]))

    task_ids, lease_ids, results = _complete_columns(acks.completes)
    patterns = None if runtimes is None else tuple(runtimes)
    return Carried(task_ids, lease_ids, results, patterns, settle)


async def acknowledge(
    gw: Gateway, acks: Acks, runtimes: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Apply a claim's acknowledgements, both kinds in one transaction, and answer one
    entry per item, completes first: as `POST /v1/tasks:complete` and `POST
    /v1/tasks:fail` would, and waking what they wake, after the commit. A database
    failure (StoreUnavailable) applies none of them."""
    if acks.completes and acks.fails:
        done, fails = await gw.store.complete_and_fail_many(
            _complete_columns(acks.completes), _fail_columns(acks.fails), runtimes
        )
    elif acks.completes:
        done, fails = (
            await gw.completions.complete_many(*_complete_columns(acks.completes), runtimes),
            [],
        )
    elif acks.fails:
        done, fails = [], await gw.store.fail_many(*_fail_columns(acks.fails), runtimes)
    else:
        return []
    return [*await completed(gw, done), *await failed(gw, fails)]


async def heartbeat_many(request: Request, gw: Gateway) -> Response:
    items = parse_heartbeat_many(
        await read_json(request, gw.settings), gw.settings.default_lease_seconds
    )
    results = await gw.store.heartbeat_many(
        [i.task_id for i in items],
        [i.lease_id for i in items],
        [i.lease_seconds for i in items],
        _runtimes(request),
    )
    gw.lease_spans.heartbeats(results)
    return json_response({"results": [heartbeat_entry(r) for r in results]})
