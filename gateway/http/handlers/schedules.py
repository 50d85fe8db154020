"""HTTP handlers of a runtime's schedules (gateway/schedules/): put, get, list, delete,
trigger, pause, resume and backfill. Managing them needs the `enqueue` scope on the
runtime, reading them `read` (routes.py says which); a token limited to runtime
patterns reaches only the runtimes they cover."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...api import decode, render
from ...api.schedule_bodies import (
    check_schedule_name,
    parse_schedule,
    parse_schedule_pause,
    parse_schedules_query,
)
from ...errors import Conflict
from ...instance import Gateway
from ...rows import DecidedTick, ScheduleRow
from ...schedules import plans
from ..io import json_response, read_json


def _path(request: Request) -> tuple[str, str]:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    return runtime_id, check_schedule_name(request.path_params["name"])


def _schedule(row: ScheduleRow) -> dict[str, Any]:
    return render.schedule_json(row, plans.upcoming(row))


def _tick(tick: DecidedTick) -> dict[str, Any]:
    return {
        "tick_at": render.format_time(tick.tick_at),
        "outcome": tick.outcome,
        "task_id": None if tick.task_id is None else str(tick.task_id),
    }


async def put_schedule(request: Request, gw: Gateway) -> Response:
    """201 when created, 200 when replaced or unchanged (the same definition again)."""
    runtime_id, name = _path(request)
    settings = gw.settings
    definition = parse_schedule(
        await read_json(request, settings), settings.max_payload_bytes, settings.max_json_depth
    )
    row, created = await gw.scheduler.put(runtime_id, name, definition)
    return json_response(_schedule(row), 201 if created else 200)


async def get_schedule(request: Request, gw: Gateway) -> Response:
    runtime_id, name = _path(request)
    return json_response(_schedule(await gw.scheduler.get(runtime_id, name)))


async def list_schedules(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    limit, after = parse_schedules_query(request.query_params)
    rows = await gw.scheduler.list_schedules(runtime_id, after, limit + 1)
    page = rows[:limit]
    cursor = page[-1].name if len(rows) > limit else None
    return json_response({"schedules": [_schedule(r) for r in page], "next_cursor": cursor})


async def delete_schedule(request: Request, gw: Gateway) -> Response:
    """204; 404 for a schedule that does not exist."""
    runtime_id, name = _path(request)
    await gw.scheduler.delete(runtime_id, name)
    return Response(status_code=204)


async def pause_schedule(request: Request, gw: Gateway) -> Response:
    runtime_id, name = _path(request)
    note = parse_schedule_pause(await read_json(request, gw.settings))
    return json_response(_schedule(await gw.scheduler.pause(runtime_id, name, True, note)))


async def resume_schedule(request: Request, gw: Gateway) -> Response:
    runtime_id, name = _path(request)
    return json_response(_schedule(await gw.scheduler.pause(runtime_id, name, False, None)))


async def trigger_schedule(request: Request, gw: Gateway) -> Response:
    """The tick decided now: enqueued with its task, or skipped_overlap."""
    runtime_id, name = _path(request)
    tick = await gw.scheduler.trigger(runtime_id, name)
    if tick is None:  # a tick at this very microsecond was decided already
        raise Conflict("a tick at this instant was decided already; trigger again")
    return json_response(_tick(tick))


async def backfill_schedule(request: Request, gw: Gateway) -> Response:
    runtime_id, name = _path(request)
    body = await read_json(request, gw.settings)
    decided, in_range = await gw.scheduler.backfill(runtime_id, name, body)
    return json_response(
        {
            "ticks": in_range,
            "enqueued": [_tick(t) for t in decided],
            "already_enqueued": in_range - len(decided),
        }
    )
