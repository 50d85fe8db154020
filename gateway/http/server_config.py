"""uvicorn's configuration for a gateway app: the connection protocol of
gateway/http/server.py, bound to one gateway's settings, metrics and count of requests
at work, and the options the gateway runs uvicorn with."""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from ..in_flight import InFlight
from ..metrics import Metrics
from ..settings import Settings
from .deadlines import KeepAlive
from .server import GatewayHttpProtocol


def protocol_class(
    settings: Settings, metrics: Metrics | None, in_flight: InFlight
) -> type[GatewayHttpProtocol]:
    """GatewayHttpProtocol bound to these settings and one gateway's metrics and count
    (uvicorn builds the protocol from the class, with no room for arguments of ours)."""
    attrs: dict[str, object] = {
        "read_timeout_seconds": settings.read_timeout_seconds,
        "metrics": metrics,
        "in_flight": in_flight,
        "keep_alive": KeepAlive(),
    }
    return type("GatewayHttpProtocol", (GatewayHttpProtocol,), attrs)


def server_config(
    app: Starlette,
    settings: Settings,
    host: str,
    port: int,
    *,
    serving: ASGIApp | None = None,
    **options: Any,
) -> uvicorn.Config:
    """uvicorn's configuration for a gateway app from `create_app`: the protocol above,
    no trust in proxy headers, no access log of uvicorn's (the app writes its own,
    gateway/http/access.py), and in-flight requests given at most
    GATEWAY_SHUTDOWN_GRACE_SECONDS at shutdown. `serving`: what uvicorn serves, when not
    `app` itself (a startup.StartupGate in front of it). `options` go to uvicorn.Config
    as they are (log_level, log_config, loop, lifespan)."""
    return uvicorn.Config(
        serving or app,
        # Said, not guessed: uvicorn takes an app whose __call__ is no coroutine function
        # (the gate's, on purpose) for the older ASGI 2 interface.
        interface="asgi3",
        host=host,
        port=port,
        http=protocol_class(settings, app.state.gateway.metrics, app.state.gateway.in_flight),
        proxy_headers=False,
        # No endpoint speaks WebSocket; an upgrade would take the connection past this
        # protocol's limits and its count of requests (those before it, counted for ever).
        ws="none",
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
        **options,
    )
