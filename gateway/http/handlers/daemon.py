"""HTTP handlers for daemons: the claim (a long poll, gateway/claim/claimer.py) and the
operations on one task's lease: heartbeat, complete, fail, release (those on many at
once are in gateway/http/handlers/batch.py). They import no driver; gateway/http/routes.py holds the
endpoint table and turns their errors into answers.
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...api import decode, render, requests
from ...claim.waiters import Departure
from ...errors import GatewayError
from ...instance import Gateway
from ...rows import Leased
from ..io import CLIENT_LEFT, DisconnectWatch, empty_tasks_response, json_response, read_json

log = logging.getLogger("gateway.http")


async def claim(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    # The decoded body is not kept in this frame: a parked poll would hold it for its
    # whole wait (about 0.2 KiB of its 15).
    req = requests.parse_claim(
        await read_json(request, gw.settings),
        gw.settings.max_wait_seconds,
        gw.settings.default_lease_seconds,
    )
    gone = Departure()
    watch = DisconnectWatch(request.receive, gone.set) if req.wait_seconds else None
    try:
        rows = await gw.claimer.claim(runtime_id, req, gone if watch else None)
    finally:
        if watch is not None:
            watch.stop()
    if rows and (gone.is_set() or await request.is_disconnected()):
        # The client left while its tasks were being leased: nobody would receive them.
        await gw.claimer.give_back(runtime_id, [row.task for row in rows])
        return Response(status_code=CLIENT_LEFT)
    if not rows:
        return empty_tasks_response()
    return json_response({"tasks": await _deliverable(gw, rows)})


async def _deliverable(gw: Gateway, rows: list[Leased]) -> list[orjson.Fragment]:
    """The claimed tasks as JSON. A task that cannot be shown is not left leased to
    nobody: it is ended `dead` with the reason, and the others are still delivered."""
    out = []
    for row in rows:
        task = row.task
        try:
            out.append(render.render_task(task))
        except Exception as exc:
            reason = f"the gateway could not turn this task into a response: {exc}"
            log.error("task %s of runtime %s ended dead: %s", task.id, task.runtime_id, reason)
            gw.metrics.tasks_unrenderable.inc()
            assert task.lease_id is not None  # a claimed row carries its lease
            try:
                await gw.store.bury(task.id, task.lease_id, reason)
                await gw.results.finished([(task.id, "dead")])
            except GatewayError as bury_error:
                # Its lease lapses and the janitor takes it back; at max_attempts it dies.
                log.warning("could not end task %s: %s", task.id, bury_error.detail)
    return out


async def heartbeat(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw.settings)
    lease_id = requests.parse_lease_id(body)
    seconds = requests.parse_lease_seconds(body, gw.settings.default_lease_seconds)
    row = await gw.store.heartbeat(task_id, lease_id, seconds)
    return json_response(render.render_task_or_stub(row))


async def complete(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    body = await read_json(request, gw.settings)
    lease_id = requests.parse_lease_id(body)
    settings = gw.settings
    result = requests.result_json(
        body,
        settings.max_payload_bytes,
        settings.max_json_depth,
        requests.written_budget(settings.max_body_bytes),
    )
    row = await gw.completions.complete(task_id, lease_id, result)
    await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(render.render_task_or_stub(row))


async def fail(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    req = requests.parse_fail(await read_json(request, gw.settings))
    row = await gw.store.fail(task_id, req.lease_id, req.error, req.retry, req.retry_after_seconds)
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:
        await gw.tasks_ended([(row.id, row.status)], [row.runtime_id])
    return json_response(render.render_task_or_stub(row))


async def release(request: Request, gw: Gateway) -> Response:
    task_id = decode.check_task_id(request.path_params["task_id"])
    lease_id = requests.parse_lease_id(await read_json(request, gw.settings))
    row = await gw.store.release(task_id, lease_id)
    if row.status == "queued":
        await gw.claimer.announce(row.runtime_id)
    else:  # a cancel was requested while it was held: now cancelled
        await gw.results.finished([(row.id, row.status)])
    return json_response(render.render_task_or_stub(row))
