"""The ASGI application: routes plus a lifespan that opens and closes the Gateway."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .routes import ROUTES
from .runtime import Gateway
from .settings import Settings

log = logging.getLogger("gateway.http")


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer problem+json like every other error."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    body = {
        "type": "about:blank",
        "title": exc.detail,
        "status": exc.status_code,
        "detail": f"{request.method} {request.url.path}: {exc.detail}",
        "code": codes.get(exc.status_code, "http_error"),
    }
    return Response(
        orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE),
        exc.status_code,
        exc.headers,
        media_type="application/problem+json",
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    """A bug, not bad input: log it with its traceback, answer problem+json 500."""
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    body = {
        "type": "about:blank",
        "title": "Internal error",
        "status": 500,
        "detail": "the gateway failed to handle this request; the error is in its log",
        "code": "internal_error",
    }
    return Response(
        orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE),
        500,
        media_type="application/problem+json",
    )


def create_app(settings: Settings | None = None) -> Starlette:
    """Build the app. Settings default to the environment's."""
    gateway = Gateway(settings or Settings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.open()
        try:
            yield
        finally:
            await gateway.close()

    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    app.state.gateway = gateway
    return app
