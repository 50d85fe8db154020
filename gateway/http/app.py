"""The ASGI application: routes plus a lifespan that opens and closes the Gateway."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import BadRequest, MethodNotAllowed, NotFound
from ..instance import Gateway
from ..metrics import Metrics
from ..settings import Settings
from ..tracing import setup as tracing_setup
from . import access, console
from .access import RequestLog, Sampler
from .io import DOOR_PASSED, ConstantResponse, internal_error_response, problem_response
from .routes import ENDPOINTS, ROUTES
from .shedding import Shedding


class GatewayApp(Starlette):
    """Starlette with `RequestLog` outside its whole middleware stack, error middleware
    included. RequestLog answers a claim (a DirectRoute) straight from there, so a
    parked poll holds no frame of the error middleware; every other request goes on
    through it, and its 500s still pass RequestLog, which adds the request id."""

    request_log_metrics: Metrics | None = None
    request_log_sampler: Sampler | None = None
    # The app's Gateway, as app.state.gateway holds it: read on every claim, and a plain
    # attribute is read faster than Starlette's State.
    gateway: Gateway | None = None
    # Work refused at the door while the database's line is full (shedding.py).
    shedding: Shedding | None = None

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        assert self.request_log_metrics is not None  # set by create_app
        return RequestLog(stack, metrics=self.request_log_metrics, sampler=self.request_log_sampler)

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:  # type: ignore[override]
        # Starlette's, but not a coroutine of its own: its frame would be one more per
        # request to make, and one more that a parked poll holds for its whole wait.
        scope["app"] = self
        gateway, door = self.gateway, self.shedding
        stack = self.middleware_stack
        if stack is None:
            stack = self.middleware_stack = self.build_middleware_stack()
        if (
            gateway is not None
            and door is not None
            and scope["type"] == "http"
            and DOOR_PASSED not in scope  # judged whole by the server already (early_answer)
        ):
            # Each first: a few comparisons, false but in a flood.
            refusal = door.line_refusal(scope, gateway)
            if refusal is not None:
                return refusal(scope, receive, send)
            if gateway.busy() and door.is_claim(scope):
                return door.claim(scope, receive, send, stack, gateway)
        return stack(scope, receive, send)

    def early_answer(self, scope: Scope, body: bytes | bytearray) -> ConstantResponse | None:
        """The door's refusal of a request read in full (`body` is all of its body),
        which the server writes without starting this app for it (server.py); None to
        let it in. Only a request that `__call__` would refuse at the door is refused."""
        gateway, door = self.gateway, self.shedding
        if gateway is None or door is None:
            return None
        return door.early(scope, body, gateway)


# uvicorn's command line (`uvicorn --factory gateway.http.app:create_app`, as the
# capacity guide runs it) picks ASGI 3 only for an app whose __call__ is a coroutine
# function, and would serve this one as ASGI 2, failing every request. Marked as one,
# as asgiref marks its sync-to-async wrappers: it returns the awaitable of one.
if hasattr(inspect, "markcoroutinefunction"):  # Python 3.12 and later
    inspect.markcoroutinefunction(GatewayApp.__call__)
else:
    GatewayApp.__call__._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]

# The order methods are listed in an Allow header.
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods answer problem+json like every other error."""
    assert isinstance(exc, HTTPException)
    kind = {404: NotFound, 405: MethodNotAllowed}.get(exc.status_code, BadRequest)
    error = kind(f"{request.method} {request.url.path}: {exc.detail}")
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = allowed_methods(request)
    return problem_response(error, headers)


def allowed_methods(request: Request) -> str:
    """Every method the request's path serves, for a 405's Allow header. A path with
    several methods is several routes (one per endpoint), and Starlette's own header
    names the first route's methods only."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(request.scope)
            if match is not Match.NONE:
                methods |= route.methods
    return ", ".join(m for m in METHOD_ORDER if m in methods)


async def _unexpected(request: Request, exc: Exception) -> Response:
    """An error outside any endpoint: answer problem+json 500. Not logged here: the
    server logs it once when it reraises (endpoints log their own, see routes.api)."""
    return internal_error_response()


def create_app(settings: Settings | None = None) -> Starlette:
    """Build the app. Settings default to the environment's."""
    gateway = Gateway(settings or Settings.from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The access log's writer thread: started before the first request, stopped
        # (its waiting lines written) after the last.
        access.start_writer()
        # The tracer provider (when the OTEL_* variables ask for it): started before
        # the first request, and its queued spans sent after the last.
        tracing_setup.start()
        try:
            await gateway.open()
            try:
                yield
            finally:
                await gateway.close()
        finally:
            tracing_setup.stop()
            access.stop_writer()

    app = GatewayApp(
        routes=[*ROUTES, *console.ROUTES],  # the console: static files only
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    # A trailing slash is a 404 like any unknown path: Starlette's redirect would echo
    # the request's Host header back in its Location.
    app.router.redirect_slashes = False
    app.request_log_metrics = gateway.metrics
    settings = gateway.settings
    app.request_log_sampler = Sampler(settings.access_log_sample)
    app.state.gateway = gateway
    app.gateway = gateway
    app.shedding = Shedding(ENDPOINTS, gateway.store.refusal())
    return app
