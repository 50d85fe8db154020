"""The gateway's app under uvicorn's own command line (`uvicorn --factory
gateway.http.app:create_app`, as docs/capacity.md runs it): uvicorn guesses the ASGI
version from the app, and took the gateway's for ASGI 2, answering every request 500
(its `__call__` returns the awaitable of a coroutine without being one)."""

from __future__ import annotations

import uvicorn

from gateway.http.app import GatewayApp


def test_uvicorn_serves_the_app_as_asgi_3() -> None:
    config = uvicorn.Config(GatewayApp(), log_level="warning")
    config.load()
    assert config.interface == "asgi3"
