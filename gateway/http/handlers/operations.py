"""The operational endpoints a deployment's probes and scrapers call, with no token:
liveness (`/healthz`), readiness (`/readyz`, which names what fails) and the metrics
(`/metrics`, Prometheus text, or OpenMetrics when the scrape asks for it). The OpenAPI
document is routes.py's own: it is built from the endpoint table.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...instance import Gateway
from ..io import json_response


async def healthz(request: Request, gw: Gateway) -> Response:
    return json_response({"status": "ok"})


async def readyz(request: Request, gw: Gateway) -> Response:
    readiness = await gw.readiness()
    if readiness.problems:
        return json_response({"status": "not ready", "problems": readiness.problems}, 503)
    if readiness.degraded:
        return json_response({"status": "ready", "degraded": readiness.degraded})
    return json_response({"status": "ready"})


async def metrics(request: Request, gw: Gateway) -> Response:
    body, content_type = gw.metrics.render(request.headers.get("accept", ""))
    return Response(body, media_type=content_type)
