"""HTTP plumbing shared by every handler module: JSON and problem+json answers, and
reading a request body within GATEWAY_MAX_BODY_BYTES. No handler logic lives here."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

import orjson
from starlette.convertors import StringConvertor
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api import decode
from ..errors import GatewayError, PayloadTooLarge, problem_for
from ..settings import Settings
from .whole import write_whole_to


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE),
        status,
        headers,
        media_type="application/json",
    )


class ConstantResponse(Response):
    """An answer whose body and headers were encoded once, when it was made; one
    instance serves every request it answers. Written whole when the send offers that
    (`access._SendWithId.whole`) or is the server's own (`whole.exchange_of`), else as
    any Response is."""

    def __init__(self, status: int, body: bytes, raw_headers: list[tuple[bytes, bytes]]) -> None:
        self.status_code = status
        self.background = None
        self.body = self.content = body  # Starlette's attribute, and this one as bytes
        self.raw_headers = raw_headers
        # The same headers as lines, as whole.write_whole takes them. They are the
        # gateway's own, and no header of a client's.
        self.head = b"".join(name + b": " + value + b"\r\n" for name, value in raw_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The request log's send adds the request id; the door's refusals are sent
        # before it, through the server's own.
        whole = getattr(send, "whole", None)
        status, head, body = self.status_code, self.head, self.content
        done = whole(status, head, body) if whole else write_whole_to(send, status, head, body)
        if not done:
            await super().__call__(scope, receive, send)


def constant_response(
    status: int, body: bytes, media_type: str, headers: Mapping[str, str] | None = None
) -> ConstantResponse:
    """A ConstantResponse with the headers Starlette's Response would give the same
    answer, in its order: `headers` (lower-cased), then content-length and -type."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    raw += [
        (b"content-length", str(len(body)).encode()),
        (b"content-type", media_type.encode()),
    ]
    return ConstantResponse(status, body, raw)


_EMPTY_TASKS = constant_response(
    200, orjson.dumps({"tasks": []}, option=orjson.OPT_APPEND_NEWLINE), "application/json"
)


def empty_tasks_response() -> Response:
    """`{"tasks":[]}`: most claims' answer, encoded once rather than per request."""
    return _EMPTY_TASKS


class DirectRoute(Route):
    """A route whose ASGI app runs as it is, for the claim: `access.RequestLog` matches
    it before Starlette's error and exception middleware and router, and Starlette's
    request wrapper is skipped too. A parked poll holds its coroutine frames for its
    whole wait, so fewer layers is less memory per parked poll, and less time per empty
    poll. The app must answer every exception itself (routes.direct_api does)."""

    def __init__(self, path: str, app: ASGIApp, method: str, name: str) -> None:
        super().__init__(path, app, methods=[method], name=name)
        self.app = app  # not wrapped by Starlette's request_response
        self._method = method
        # Plain segments only: their values are the matched text, with no conversion.
        if not all(isinstance(c, StringConvertor) for c in self.param_convertors.values()):
            raise ValueError(f"{path}: a DirectRoute's parameters must be plain strings")

    def take(self, scope: Scope) -> bool:
        """Whether the request is this route's, path and method (Starlette's
        Match.FULL); if so, its scope gets the route, the endpoint and the path
        parameters, as Starlette's router gives them. What `Route.matches` does, in half
        its time: this is asked of every request before routing."""
        if scope["method"] != self._method:
            return False
        path = scope["path"]
        root = scope.get("root_path")
        if root and path.startswith(root):  # as Starlette reads a path under a root path
            path = "" if path == root else path[len(root) :] if path[len(root)] == "/" else path
        match = self.path_regex.match(path)
        if match is None:
            return False
        params = match.groupdict()
        outer = scope.get("path_params")
        scope["route"] = self
        scope["endpoint"] = self.endpoint
        scope["path_params"] = {**outer, **params} if outer else params
        return True


class DisconnectWatch:
    """Calls `on_disconnect` once, when the request's client leaves (its receive()
    returns `http.disconnect`), until `stop()`. Starlette does not cancel a handler whose
    client left, so a long wait watches for it itself.

    A parked poll holds its watch for its whole wait, so the watch is lean: it steps
    the pending receive() coroutine by hand from the done callback of the future that
    coroutine waits on, as an asyncio Task would, but without a Task (its object, its
    entry in the loop's task registry, a coroutine frame of its own). An error from
    receive() ends the watch, as it would end a watching task."""

    __slots__ = ("_coro", "_on_disconnect", "_receive", "_waiting")

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self._receive = receive
        self._on_disconnect = on_disconnect
        self._coro: Coroutine[Any, Any, Message] | None = None
        self._waiting: asyncio.Future[Any] | None = None
        self._ask()

    def _ask(self) -> None:
        self._coro = self._receive()  # type: ignore[assignment]
        self._step()

    def _step(self, _done: object = None) -> None:
        self._waiting = None
        coro = self._coro
        if coro is None:  # stopped
            return
        try:
            awaited = coro.send(None)
        except StopIteration as end:
            self._coro = None
            if end.value.get("type") == "http.disconnect":
                self._on_disconnect()
            else:  # more of the body, say: ask again
                self._ask()
            return
        except Exception:
            self._coro = None
            return
        if isinstance(awaited, asyncio.Future):
            awaited._asyncio_future_blocking = False  # as Task.__step does
            self._waiting = awaited
            awaited.add_done_callback(self._step)
        else:  # a bare yield (asyncio.sleep(0)): step again on the next loop turn
            asyncio.get_running_loop().call_soon(self._step)

    def stop(self) -> None:
        """Stop watching: the pending receive() is closed (its waits are released)."""
        coro, self._coro = self._coro, None
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.remove_done_callback(self._step)
        if coro is not None:
            coro.close()


# RFC 7240: `Prefer: return=minimal` asks for a smaller answer; the answer that honours
# it says so in Preference-Applied.
PREFERENCE_APPLIED = "Preference-Applied"
RETURN_MINIMAL = "return=minimal"
# One piece of a Prefer value: a quoted string (its escapes kept), a separator, or a run
# of anything else. Commas and semicolons inside quotes separate nothing.
_PREFER_PART = re.compile(r'"(?:[^"\\]|\\.)*"?|[,;=]|[^",;=]+')


def _unquote(word: str) -> str:
    word = word.strip()
    if len(word) >= 2 and word[0] == word[-1] == '"':
        return re.sub(r"\\(.)", r"\1", word[1:-1])
    return word


def prefers_minimal(values: Iterable[str]) -> bool:
    """Whether Prefer headers (RFC 7240; each a comma-separated list, several headers
    read as one list) ask for `return=minimal`. Names and values are compared without
    case and spaces around `=`; a preference's parameters (after `;`) and unknown
    preferences are ignored; of several `return` preferences the first counts."""
    for value in values:
        name: list[str] = []
        word: list[str] | None = None
        in_params = False
        for part in [*_PREFER_PART.findall(value), ","]:
            if part == ",":
                if "".join(name).strip().lower() == "return":
                    return _unquote("".join(word or [])).lower() == "minimal"
                name, word, in_params = [], None, False
            elif in_params:
                continue
            elif part == ";":
                in_params = True
            elif part == "=" and word is None:
                word = []
            elif word is None:
                name.append(part)
            else:
                word.append(part)
    return False


def internal_error_response() -> Response:
    """The 500 answer to an unexpected exception; the detail goes to the log only."""
    return problem_response(
        GatewayError("the gateway failed to handle this request; the error is in its log")
    )


# The status nginx logs for a client that left: nobody receives this answer.
CLIENT_LEFT = 499
# The scope key of the request's connection (admission.Caller), set by the HTTP protocol
# (server.py): work whose client has left is not started.
CALLER = "gateway.caller"
# The scope key under which a refusal tells the protocol how long, in seconds, to leave
# the connection unread once its answer is out (shedding.py, server.py).
HOLD_READING = "gateway.hold_reading_seconds"
# The scope key the door sets on a request it judged whole and let in (shedding.early,
# from the protocol), so that the app does not judge it again: a claim while the
# instance is busy would have its body parsed twice.
DOOR_PASSED = "gateway.door_passed"


def encoded_problem(error: GatewayError) -> tuple[int, bytes]:
    """The status and problem+json body (RFC 9457) for any gateway error, status from
    errors.PROBLEMS."""
    status, body = problem_for(error)
    return status, orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


def problem_response(error: GatewayError, headers: Mapping[str, str] | None = None) -> Response:
    """RFC 9457 problem+json for any gateway error (encoded_problem)."""
    status, content = encoded_problem(error)
    return Response(
        content,
        status,
        {**(headers or {}), **error.headers()},
        media_type="application/problem+json",
    )


def constant_problem(error: GatewayError) -> ConstantResponse:
    """problem_response(error) encoded once, to answer many requests with: for the
    refusals of a flood, which must cost as little as they can."""
    status, content = encoded_problem(error)
    return constant_response(status, content, "application/problem+json", error.headers())


def header_value(scope: Scope, name: bytes) -> str | None:
    """The first value of the header `name` (lower case, as the server hands names
    over) as Starlette's `request.headers.get` gives it (latin-1), read from the scope
    without building a Headers object: the claim path reads two headers per request."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _refuse_declared(scope: Scope, limit: int) -> None:
    """PayloadTooLarge when the request's Content-Length is over `limit`."""
    declared = header_value(scope, b"content-length")
    # More than 18 digits is over any limit, and int() has a digit limit of its own.
    if declared and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise PayloadTooLarge(f"request body is larger than {limit} bytes")


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing more than `limit` bytes (GATEWAY_MAX_BODY_BYTES: 413)
    before reading it all when Content-Length says so, and as soon as the stream passes
    the limit. A client that leaves first raises ClientDisconnect. Read from the ASGI
    messages themselves, as `request.stream()` does, without its async generator."""
    _refuse_declared(request.scope, limit)
    cached: bytes | None = getattr(request, "_body", None)  # request.body() read it
    if cached is not None:
        if len(cached) > limit:
            raise PayloadTooLarge(f"request body is larger than {limit} bytes")
        return cached
    if request._stream_consumed:
        raise RuntimeError("Stream consumed")  # as request.stream() says
    return await _read_rest(request, limit, await request.receive())


async def _read_rest(request: Request, limit: int, message: Message) -> bytes:
    """The body from its first ASGI message, `message`, on."""
    chunks: list[bytes] = []
    size = 0
    while True:
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                request._stream_consumed = True
                return b"".join(chunks)
        elif kind == "http.disconnect":
            request._is_disconnected = True
            raise ClientDisconnect()
        message = await request.receive()


async def read_json(request: Request, settings: Settings) -> dict[str, Any]:
    """The body as a JSON object (decode.decode_body), within the body limit."""
    limit = settings.max_body_bytes
    if request._stream_consumed or getattr(request, "_body", None) is not None:
        raw = await read_body(request, limit)
    else:
        _refuse_declared(request.scope, limit)
        message = await request.receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            # The whole body in one message, as most arrive: read here, without
            # read_body's coroutine (one frame less on every claim).
            raw = message.get("body", b"")
            if len(raw) > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            request._stream_consumed = True
        else:
            raw = await _read_rest(request, limit, message)
    return decode.decode_body(raw, settings.max_json_depth)
