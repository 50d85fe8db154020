"""HTTP handlers for producers: enqueue a task or a batch, cancel and retry a task, and
read what there is: a task (waiting for its result, gateway/claim/results.py), a page of a
runtime's tasks, a runtime's counts. A change that makes a task claimable is announced
after its commit (I1). They import no driver; gateway/http/routes.py holds the endpoint table
and turns their errors into answers.
"""

from __future__ import annotations

import time

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ... import tracing
from ...api import bodies, cursors, decode, render, requests, trace
from ...claim.waiters import Departure
from ...errors import StoreUnavailable
from ...instance import Gateway
from ...rows import TaskRow, as_enqueued
from ..io import (
    CLIENT_LEFT,
    PREFERENCE_APPLIED,
    RETURN_MINIMAL,
    DisconnectWatch,
    json_response,
    prefers_minimal,
    read_json,
)
from .sending import Sending


def _applied(minimal: bool, headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """An enqueue's answer headers, with Preference-Applied when `minimal` was."""
    if minimal:
        return {**(headers or {}), PREFERENCE_APPLIED: RETURN_MINIMAL}
    return headers


def _enqueued(row: TaskRow, minimal: bool) -> orjson.Fragment:
    """One enqueue's answer body: the task, or with `minimal` its id only."""
    if minimal:
        return orjson.Fragment(render.task_ref_json(row.id))
    return render.render_task_or_stub(row)


async def enqueue(request: Request, gw: Gateway) -> Response:
    """One task. `Prefer: return=minimal` (RFC 7240) answers `{"id": ...}` only."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    minimal = prefers_minimal(request.headers.getlist("prefer"))
    body = await read_json(request, gw.settings)
    req = requests.parse_enqueue(
        body,
        decode.header_text(request.headers.get("idempotency-key"), "idempotency_key"),
        gw.settings.max_payload_bytes,
        gw.settings.max_json_depth,
        gw.settings.max_body_bytes,
    )
    sending = Sending(runtime_id, [req], trace.from_headers(request.headers))
    [req] = sending.requests
    # Sync match: a task due now may go straight to a poll parked here (claim.py).
    waiter = gw.claimer.match(runtime_id) if req.run_at is None and not req.delay_seconds else None
    leased = None
    try:
        row, created = await gw.store.enqueue(runtime_id, req, waiter.lease if waiter else None)
        if created and row.status == "claimed":
            leased = row
    except StoreUnavailable as exc:
        sending.failed(exc)
        if waiter is not None:
            # The task may have been written, and then given back to the queue
            # (Store.enqueue): claimable now, it needs its bump (I1).
            await gw.claimer.announce(runtime_id)
        raise
    except Exception as exc:
        sending.failed(exc)
        raise
    finally:
        if waiter is not None:
            await gw.claimer.matched(runtime_id, waiter, leased)
    sending.sent([row.id], created)
    if not created:
        replayed = _applied(minimal, {"Idempotent-Replayed": "true"})
        return json_response(_enqueued(row, minimal), 200, replayed)
    if leased is not None:
        # No task became claimable (it is leased already): no bump. The producer sees
        # the task as enqueued, as without the match.
        return json_response(_enqueued(as_enqueued(row), minimal), 201, _applied(minimal))
    await gw.claimer.announce(runtime_id)
    return json_response(_enqueued(row, minimal), 201, _applied(minimal))


async def enqueue_batch(request: Request, gw: Gateway) -> Response:
    """A batch, all or nothing. `Prefer: return=minimal` (RFC 7240) answers each task
    as `{"id": ...}` only, and the store sends no payload back for it."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    minimal = prefers_minimal(request.headers.getlist("prefer"))
    settings = gw.settings
    reqs = requests.parse_batch(
        await read_json(request, gw.settings),
        settings.max_payload_bytes,
        settings.max_json_depth,
        settings.max_body_bytes,
    )
    sending = Sending(runtime_id, reqs, trace.from_headers(request.headers))
    try:
        tasks, all_replayed = await gw.store.enqueue_batch(
            runtime_id, sending.requests, ids_only=minimal
        )
    except Exception as exc:
        sending.failed(exc)
        raise
    if sending.spans:  # tracing on: the spans name their tasks' ids
        sending.sent((task["id"] for task in orjson.loads(tasks)), not all_replayed)
    body = {"tasks": orjson.Fragment(tasks)}
    if all_replayed:
        return json_response(body, 200, _applied(minimal, {"Idempotent-Replayed": "true"}))
    await gw.claimer.announce(runtime_id)  # one bump for the whole batch
    return json_response(body, 201, _applied(minimal))


async def cancel(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    row = await gw.store.cancel(task_id)
    if row.status == "claimed":  # its holder learns of it at its next report
        gw.lease_spans.in_lease("cancel requested", row)
    await gw.results.finished([(row.id, row.status)])
    return json_response(render.render_task_or_stub(row))


async def retry(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    row = await gw.store.retry(task_id)
    await gw.claimer.announce(row.runtime_id)
    return json_response(render.render_task_or_stub(row))


# A listing page stops early, with a next_cursor, once its tasks pass this many bytes:
# 1000 tasks of 1 MiB payloads would otherwise make one answer of a gigabyte.
LIST_PAGE_BYTES = 8 * 1024 * 1024
LIST_FIRST_ROWS = 10  # read before the tasks' sizes are known; later reads follow them


async def list_tasks(request: Request, gw: Gateway) -> Response:
    """A page of tasks, oldest first: `limit` tasks, or fewer once LIST_PAGE_BYTES is
    passed. Rows are read a few at a time, so memory follows the page, not the limit."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    query = requests.parse_list_query(request.query_params)
    page: list[orjson.Fragment] = []
    size, after, last = 0, query.after, None
    want = min(query.limit, LIST_FIRST_ROWS)
    while True:
        rows = await gw.store.list_tasks(runtime_id, query.status, want + 1, after, query.schedule)
        taken = 0
        for row in rows[:want]:
            task = render.task_bytes_or_stub(row)
            page.append(orjson.Fragment(task))
            size, last, taken = size + len(task), row, taken + 1
            if size >= LIST_PAGE_BYTES:
                break
        more = taken < len(rows)  # the extra row was read, or the budget cut the read
        if not more or len(page) >= query.limit or size >= LIST_PAGE_BYTES:
            break
        assert last is not None
        after = (last.created_at, last.id)
        average = max(size // len(page), 1)
        want = max(1, min(query.limit - len(page), (LIST_PAGE_BYTES - size) // average))
    cursor = cursors.encode_cursor(last) if more and last is not None else None
    return json_response({"tasks": page, "next_cursor": cursor})


async def stats(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    counts, oldest = await gw.store.stats(runtime_id)
    return json_response(
        {
            "runtime_id": runtime_id,
            "counts": {status: counts.get(status, 0) for status in bodies.STATUSES},
            "oldest_queued_age_seconds": oldest,
            "parked_pollers": gw.claimer.parked(runtime_id),
            **render.pause_json(gw.controls.get(runtime_id)),
        }
    )


async def get_task(request: Request, gw: Gateway) -> Response:
    """The task; with `wait_seconds`, once it has finished or the wait ran out
    (results.py). A waiting request ends when its client leaves."""
    task_id = decode.check_task_id(request.path_params["task_id"])
    wait_seconds = requests.parse_wait(request.query_params, gw.settings.max_wait_seconds)
    if not wait_seconds:
        return json_response(render.render_task_or_stub(await gw.store.get(task_id)))
    gone = Departure()
    watch = DisconnectWatch(request.receive, gone.set)
    began = time.time_ns()
    try:
        row = await gw.results.wait(task_id, wait_seconds, gone)
    finally:
        watch.stop()
    if gone.is_set():
        return Response(status_code=CLIENT_LEFT)
    if tracing.active is not None:
        tracing.active.result_waited(row, began)
    return json_response(render.render_task_or_stub(row))
