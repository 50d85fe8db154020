"""HTTP handlers. They parse, call the store and the claimer, and shape answers;
they import no driver. Errors become problem+json in `api()` via errors.PROBLEMS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from . import models
from .errors import GatewayError, PayloadTooLarge, problem_for
from .metrics import CONTENT_TYPE
from .runtime import Gateway

log = logging.getLogger("gateway.http")

Handler = Callable[[Request, Gateway], Awaitable[Response]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE),
        status,
        headers,
        media_type="application/json",
    )


def problem_response(error: GatewayError, headers: Mapping[str, str] | None = None) -> Response:
    """RFC 9457 problem+json for any gateway error, status from errors.PROBLEMS."""
    status, body = problem_for(error)
    out = dict(headers or {})
    if status == 429:
        out["Retry-After"] = str(body.get("retry_after_seconds", 1))
    return Response(
        orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE),
        status,
        out,
        media_type="application/problem+json",
    )


def api(handler: Handler, *, authenticate: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """Wraps a handler: authentication, then the error table."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        gw: Gateway = request.app.state.gateway
        try:
            if authenticate:
                gw.auth.check(request.headers.get("authorization"))
            return await handler(request, gw)
        except GatewayError as exc:
            return problem_response(exc)

    return endpoint


async def read_json(request: Request, gw: Gateway) -> dict[str, Any]:
    """The body as a JSON object, refusing more than GATEWAY_MAX_BODY_BYTES (413)."""
    limit = gw.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    return models.decode_body(b"".join(chunks))


# -- producers --------------------------------------------------------------


async def enqueue(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    body = await read_json(request, gw)
    req = models.parse_enqueue(
        body, request.headers.get("idempotency-key"), gw.settings.max_payload_bytes
    )
    row, created = await gw.store.enqueue(runtime_id, req)
    if not created:
        return json_response(models.task_json(row), 200, {"Idempotent-Replayed": "true"})
    await gw.claimer.announce(runtime_id)
    return json_response(models.task_json(row), 201)


async def enqueue_batch(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    reqs = models.parse_batch(await read_json(request, gw), gw.settings.max_payload_bytes)
    rows, all_replayed = await gw.store.enqueue_batch(runtime_id, reqs)
    body = {"tasks": [models.task_json(r) for r in rows]}
    if all_replayed:
        return json_response(body, 200, {"Idempotent-Replayed": "true"})
    await gw.claimer.announce(runtime_id)  # one bump for the whole batch
    return json_response(body, 201)


async def cancel(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    return json_response(models.task_json(await gw.store.cancel(task_id)))


async def retry(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    row = await gw.store.retry(task_id)
    await gw.claimer.announce(row["runtime_id"])
    return json_response(models.task_json(row))


async def list_tasks(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    query = models.parse_list_query(request.query_params)
    rows = await gw.store.list_tasks(runtime_id, query.status, query.limit + 1, query.after)
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    return json_response(
        {
            "tasks": [models.task_json(r) for r in rows],
            "next_cursor": models.encode_cursor(rows[-1]) if more else None,
        }
    )


async def stats(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    counts, oldest = await gw.store.stats(runtime_id)
    return json_response(
        {
            "runtime_id": runtime_id,
            "counts": {status: counts.get(status, 0) for status in models.STATUSES},
            "oldest_queued_age_seconds": oldest,
            "parked_pollers": gw.claimer.parked(runtime_id),
        }
    )


# -- daemons ----------------------------------------------------------------


async def _watch_disconnect(request: Request, gone: asyncio.Event) -> None:
    """Starlette does not cancel a handler whose client left; watch for it ourselves."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


async def claim(request: Request, gw: Gateway) -> Response:
    runtime_id = models.check_runtime_id(request.path_params["rt"])
    body = await read_json(request, gw)
    req = models.parse_claim(body, gw.settings.max_wait_seconds, gw.settings.default_lease_seconds)
    gone = asyncio.Event()
    watcher = asyncio.create_task(_watch_disconnect(request, gone)) if req.wait_seconds else None
    try:
        rows = await gw.claimer.claim(runtime_id, req, gone if watcher else None)
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
    return json_response({"tasks": [models.task_json(r) for r in rows]})


async def heartbeat(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw)
    lease_id = models.parse_lease_id(body)
    seconds = models.parse_lease_seconds(body, gw.settings.default_lease_seconds)
    row = await gw.store.heartbeat(task_id, lease_id, seconds)
    return json_response(models.task_json(row))


async def complete(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw)
    lease_id = models.parse_lease_id(body)
    result = models.result_json(body, gw.settings.max_payload_bytes)
    row = await gw.store.complete(task_id, lease_id, result)
    return json_response(models.task_json(row))


async def fail(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    req = models.parse_fail(await read_json(request, gw))
    row = await gw.store.fail(task_id, req.lease_id, req.error, req.retry, req.retry_after_seconds)
    if row["status"] == "queued":
        await gw.claimer.announce(row["runtime_id"])
    return json_response(models.task_json(row))


async def release(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    lease_id = models.parse_lease_id(await read_json(request, gw))
    row = await gw.store.release(task_id, lease_id)
    if row["status"] == "queued":
        await gw.claimer.announce(row["runtime_id"])
    return json_response(models.task_json(row))


async def get_task(request: Request, gw: Gateway) -> Response:
    task_id = models.check_task_id(request.path_params["task_id"])
    return json_response(models.task_json(await gw.store.get(task_id)))


# -- operations -------------------------------------------------------------


async def healthz(request: Request, gw: Gateway) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, gw: Gateway) -> Response:
    problems = await gw.readiness_problems()
    if problems:
        return json_response({"status": "not ready", "problems": problems}, 503)
    return json_response({"status": "ready"})


async def metrics(request: Request, gw: Gateway) -> Response:
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE)


ROUTES = [
    Route("/v1/runtimes/{rt}/tasks", api(enqueue), methods=["POST"]),
    Route("/v1/runtimes/{rt}/tasks", api(list_tasks), methods=["GET"]),
    Route("/v1/runtimes/{rt}/tasks:batch", api(enqueue_batch), methods=["POST"]),
    Route("/v1/runtimes/{rt}/stats", api(stats), methods=["GET"]),
    Route("/v1/runtimes/{rt}/claim", api(claim), methods=["POST"]),
    Route("/v1/tasks/{task_id}", api(get_task), methods=["GET"]),
    Route("/v1/tasks/{task_id}/heartbeat", api(heartbeat), methods=["POST"]),
    Route("/v1/tasks/{task_id}/complete", api(complete), methods=["POST"]),
    Route("/v1/tasks/{task_id}/fail", api(fail), methods=["POST"]),
    Route("/v1/tasks/{task_id}/release", api(release), methods=["POST"]),
    Route("/v1/tasks/{task_id}/cancel", api(cancel), methods=["POST"]),
    Route("/v1/tasks/{task_id}/retry", api(retry), methods=["POST"]),
    Route("/healthz", api(healthz, authenticate=False), methods=["GET"]),
    Route("/readyz", api(readyz, authenticate=False), methods=["GET"]),
    Route("/metrics", api(metrics, authenticate=False), methods=["GET"]),
]
