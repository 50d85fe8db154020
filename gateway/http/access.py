"""Request ids, the access log and the request counter.

`RequestLog` wraps the whole app, Starlette's error middleware included
(app.GatewayApp). For each HTTP request it sets the request id (logs.REQUEST_ID),
returns it as `X-Request-ID` on the answer, and when the answer is done counts the
request by route template and status class and writes its access line (logger
`gateway.access`, INFO): every error's and slow request's, and a share of the others
(`Sampler`: GATEWAY_ACCESS_LOG_SAMPLE, GATEWAY_ACCESS_LOG_SLOW_SECONDS). The route is the
template (`/v1/runtimes/{rt}/claim`), never the raw path: runtime and task ids would
make the log's and the metric's values unbounded.

While tracing is on (gateway/tracing), it also makes each request's server span, the
active span while the request is served, and ends it with the same route and status.

Answers the server writes itself, outside the app (408, 431: gateway/http/server.py), log
their line there with `access_line`. Requests shed under overload (their scope holds
HOLD_READING) get no line and are not counted here: gateway_shed_total counts them.

While the app runs (its lifespan starts and stops `LINES`), a line is handed with its
raw values to a thread that formats and writes it (logs.LineQueue): the event loop
does not wait for stderr. A line that finds the queue full is dropped and counted
(`gateway_log_lines_dropped_total`).
"""

from __future__ import annotations

import contextlib
import http
import logging
import time
from collections.abc import Awaitable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import logs, tracing
from ..errors import GatewayError
from ..metrics import Metrics
from .io import HOLD_READING, DirectRoute, encoded_problem, internal_error_response
from .whole import write_whole_to

log = logging.getLogger("gateway.access")

REQUEST_ID_HEADER = b"x-request-id"
UNMATCHED = "unmatched"  # the route of a request no endpoint's path matched
ACCESS_FORMAT = "%s %s %d %.1fms"  # method, route, status, duration in ms

# Lines waiting for the writer thread, at most: about 4 MB of them (measured with
# tracemalloc), a second or more of answers at the rates one process reaches; the
# thread takes them every WRITE_INTERVAL_SECONDS. Past it (stderr read too slowly for
# seconds), lines are dropped and counted, and the event loop never waits.
MAX_QUEUED_LINES = 10_000
# How often the writer takes the waiting lines. Each time it needs the interpreter lock
# from the event loop's thread two or three times (to wake, and back from each write),
# and on 2 busy cores each such hand-over stalls the loop for as long as the writer
# waits for a core: at 50 ms, a gateway answering only empty polls answered about a
# sixth fewer with the access log on. 200 ms is about 2,000 lines at the most one
# process answers, well within MAX_QUEUED_LINES.
WRITE_INTERVAL_SECONDS = 0.2
LINES = logs.LineQueue(log, MAX_QUEUED_LINES, WRITE_INTERVAL_SECONDS)


def start_writer() -> None:
    """Start LINES' writer thread (the app's lifespan does, before the first request)
    when the access log is on; with it off (`--no-access-log`, or a level above INFO)
    no line is ever queued, and a thread waking to find none would only take the
    interpreter lock from the event loop. Each call is matched by one `stop_writer`."""
    LINES.start(thread=log.isEnabledFor(logging.INFO))


def stop_writer() -> None:
    """Stop what start_writer started; every waiting line is written first."""
    LINES.stop()


def status_class(status: int) -> str:
    """`2xx`, `4xx`, ...: the request counter's label (499, client left, is 4xx)."""
    known = _STATUS_CLASSES.get(status)
    return known if known is not None else f"{min(max(status // 100, 1), 5)}xx"


# Made once: every request's answer is counted by it.
_STATUS_CLASSES = {status: f"{status // 100}xx" for status in range(100, 600)}


# A request that takes this long always gets its access line (a long poll that waited
# does too): in seconds.
SLOW_SECONDS = 1.0


class Sampler:
    """Which requests get an access line (GATEWAY_ACCESS_LOG_SAMPLE): every error
    (status 400 and above, 499 and the server's own 408 and 431 included), every request
    that took `slow_seconds` or longer, and `fraction` of the others, spread evenly (a
    running sum, not chance: 0.1 is every tenth). Owned by one RequestLog; used on the
    event loop's thread only."""

    __slots__ = ("_sum", "fraction", "slow_seconds")

    def __init__(self, fraction: float = 1.0, slow_seconds: float = SLOW_SECONDS) -> None:
        self.fraction = fraction
        self.slow_seconds = slow_seconds
        self._sum = 0.0

    def keeps(self, status: int, seconds: float) -> bool:
        if status >= 400 or seconds >= self.slow_seconds or self.fraction >= 1.0:
            return True
        self._sum += self.fraction
        if self._sum > _ALMOST_ONE:  # ten times 0.1 adds up to 0.9999999999999999
            self._sum -= 1.0
            return True
        return False


_ALMOST_ONE = 1.0 - 1e-9


def access_line(
    metrics: Metrics | None,
    method: str,
    route: str,
    status: int,
    seconds: float,
    request_id: str,
    sampler: Sampler | None = None,
) -> None:
    """Count one request, and log its access line (through LINES) unless `sampler`
    leaves it out (None: every line)."""
    if metrics is not None:
        metrics.http_requests.inc(route, method, status_class(status))
    if log.isEnabledFor(logging.INFO) and (sampler is None or sampler.keeps(status, seconds)):
        duration_ms = round(seconds * 1000, 3)
        extra: dict[str, Any] = {
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": duration_ms,
            "request_id": request_id,
        }
        spans = tracing.active
        if spans is not None:
            # Taken here: the line is formatted on the writer's thread, in no context.
            ids = spans.current_ids()
            if ids is not None:
                extra["trace_id"], extra["span_id"] = ids
        args = (method, route, status, duration_ms)
        if not LINES.submit(logging.INFO, ACCESS_FORMAT, args, extra) and metrics is not None:
            metrics.log_lines_dropped.inc()


def server_answer(
    metrics: Metrics | None,
    head: object,
    error: GatewayError,
    seconds: float,
    default_headers: list[tuple[bytes, bytes]],
) -> bytes:
    """An answer the server writes itself before it closes the connection (408, 431),
    the app never having seen its request: logged and counted here, and returned whole,
    request id and `Connection: close` included. `head` is the request's scope when its
    head was parsed; `default_headers`, the server's own (date, server)."""
    status, content = encoded_problem(error)
    scope: Scope = head if isinstance(head, dict) else {}
    request_id = logs.request_id_from(_header(scope, REQUEST_ID_HEADER))
    access_line(metrics, str(scope.get("method", "-")), UNMATCHED, status, seconds, request_id)
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: application/problem+json",
        b"content-length: %d" % len(content),
        REQUEST_ID_HEADER + b": " + request_id.encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + content


def _header(scope: Scope, name: bytes) -> bytes | None:
    # Names arrive in lower case (ASGI; uvicorn lowers them), as Starlette's Headers
    # assumes too.
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


class RequestLog:
    """ASGI middleware: request id, access line and request counter (module doc)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, sampler: Sampler | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.sampler = sampler  # None: every request gets its line
        self._direct: list[DirectRoute] | None = None  # found on the first request

    def _direct_routes(self, scope: Scope) -> list[DirectRoute]:
        if self._direct is None:
            router = getattr(scope.get("app"), "router", None)
            routes = getattr(router, "routes", ())
            self._direct = [r for r in routes if isinstance(r, DirectRoute)]
        return self._direct

    def _target(self, scope: Scope) -> ASGIApp:
        """A DirectRoute's request goes straight to its handler; the rest through the
        app (error and exception middleware, router). Not a coroutine of its own: a
        parked poll holds every frame between uvicorn and its wait."""
        for route in self._direct_routes(scope):
            if route.take(scope):  # the route is the access line's, as the router's is
                return route.app
        return self.app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = logs.request_id_from(_header(scope, REQUEST_ID_HEADER))
        # Not reset afterwards: uvicorn serves each request in a task of its own, and
        # its own line about an exception, written after this returns, should carry it.
        logs.REQUEST_ID.set(request_id)
        send_with_id = _SendWithId(send, request_id)
        # One read of a module attribute while tracing is off (gateway/tracing).
        spans = tracing.active
        server = spans.server_start(scope) if spans is not None else None
        try:
            await self._target(scope)(scope, receive, send_with_id)
        except Exception:
            # Starlette's error middleware, inside this one, answers 500 through
            # send_with_id (with the request id) and reraises. A DirectRoute's handler
            # runs without it: answer here when nothing was answered yet.
            if not send_with_id.status:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await internal_error_response()(scope, receive, send_with_id)
            raise
        finally:
            route = _route_of(scope)
            # No answer at all: the client left, or the server's own error answer.
            status = send_with_id.status or 500
            # Shed under overload (a claim refused while busy): counted in
            # gateway_shed_total and its warning, as the door's refusals are, and not
            # here, where thousands a second would cost what shedding saves.
            if HOLD_READING not in scope:
                seconds = time.perf_counter() - started
                access_line(
                    self.metrics, scope["method"], route, status, seconds, request_id, self.sampler
                )
            if server is not None:
                assert spans is not None
                spans.server_end(server, scope["method"], route, status)


class _SendWithId:
    """The app's send(): adds the request id to the answer's headers and notes its
    status. An object with slots rather than a closure: a parked poll holds it."""

    __slots__ = ("request_id", "send", "status")

    def __init__(self, send: Send, request_id: str) -> None:
        self.send = send
        self.request_id = request_id
        self.status = 0

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = [*message.get("headers", ()), (REQUEST_ID_HEADER, self.request_id.encode())]
            message = {**message, "headers": headers}
        return self.send(message)

    def whole(self, status: int, head: bytes, body: bytes) -> bool:
        """Write an answer whole (whole.write_whole), with the request id, when the
        send this wraps is the server's own; False, with nothing written, otherwise.
        `head`: its header lines, encoded and checked by their maker. (The request id
        is the client's only when it matched logs._SANE_REQUEST_ID.)"""
        line = b"%s: %s\r\n" % (REQUEST_ID_HEADER, self.request_id.encode())
        if not write_whole_to(self.send, status, head + line, body):
            return False
        self.status = status
        return True


def _route_of(scope: Scope) -> str:
    route: Any = scope.get("route")  # set by Starlette's router on a (partial) match
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED
