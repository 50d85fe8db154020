"""The per-runtime history (docs/guides/history.md): `GET /v1/runtimes/{rt}/history`,
one runtime's points, and `GET /v1/history`, the points summed over the runtimes the
caller's token covers with the top runtimes by depth and by failures. A token limited
to runtime patterns is answered from the runtimes they cover alone, in the statements
themselves: no other runtime's name or figure is read for it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...api import decode
from ...api.history import WINDOWS, fleet_json, parse_window, point_json
from ...auth.principals import Principal
from ...instance import Gateway
from ..io import json_response


async def runtime_history(request: Request, gw: Gateway) -> Response:
    runtime_id = decode.check_runtime_id(request.path_params["rt"])
    window = parse_window(request.query_params)
    points = await gw.store.runtime_history(runtime_id, WINDOWS[window])
    return json_response(
        {
            "runtime_id": runtime_id,
            "window": window,
            "interval_seconds": gw.settings.history_interval_seconds,
            "points": [point_json(p) for p in points],
        }
    )


async def fleet_history(request: Request, gw: Gateway) -> Response:
    window = parse_window(request.query_params)
    principal: Principal | None = request.state.principal
    patterns = None if principal is None else principal.runtimes
    fleet = await gw.store.fleet_history(WINDOWS[window], patterns)
    return json_response(fleet_json(window, gw.settings.history_interval_seconds, fleet))
