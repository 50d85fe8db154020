"""The ASGI application: routes plus a lifespan that opens and closes the Gateway."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from . import console
from .access import RequestLog
from .errors import BadRequest, MethodNotAllowed, NotFound
from .httpio import internal_error_response, problem_response
from .routes import ROUTES
from .runtime import Gateway
from .settings import Settings


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer problem+json like every other error."""
    assert isinstance(exc, HTTPException)
    kind = {404: NotFound, 405: MethodNotAllowed}.get(exc.status_code, BadRequest)
    error = kind(f"{request.method} {request.url.path}: {exc.detail}")
    return problem_response(error, exc.headers)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """An error outside any endpoint: answer problem+json 500. Not logged here: the
    server logs it once when it reraises (endpoints log their own, see routes.api)."""
    return internal_error_response()


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
        routes=[*ROUTES, *console.ROUTES],  # the console: static files only
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    # A trailing slash is a 404 like any unknown path: Starlette's redirect would echo
    # the request's Host header back in its Location.
    app.router.redirect_slashes = False
    # Inside Starlette's error middleware, so that its 500s carry a request id too.
    app.add_middleware(RequestLog, metrics=gateway.metrics)
    app.state.gateway = gateway
    return app
