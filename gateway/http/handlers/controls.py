"""HTTP handlers of the runtime controls (gateway/claim/controls.py): read, change, pause and
resume. Changing needs the `control` scope (admin implies it); a token limited to
runtime patterns controls only the runtimes they cover (routes.authorize checks)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...api import decode, render
from ...api.requests import parse_controls, parse_pause
from ...instance import Gateway
from ...rows import ControlsChange
from ..io import json_response, read_json


async def get_controls(request: Request, gw: Gateway) -> Response:
    """The stored controls (a read of Postgres, not of this process's copy)."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    stored = await gw.store.get_controls(runtime_id)
    return json_response(render.controls_json(stored or gw.controls.get(runtime_id)))


async def set_controls(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    change = parse_controls(await read_json(request, gw.settings))
    return json_response(render.controls_json(await gw.controls.change(runtime_id, change)))


async def pause(request: Request, gw: Gateway) -> Response:
    """Pause, with an optional body {"reason", "until"}; an empty body pauses until
    resumed. A second pause replaces the reason and end, keeping paused_since."""
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    change = parse_pause(await read_json(request, gw.settings))
    controls = await gw.controls.change(runtime_id, change)
    return json_response(render.controls_json(controls))


async def resume(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    controls = await gw.controls.change(runtime_id, ControlsChange(paused=False))
    return json_response(render.controls_json(controls))
