"""An answer written whole: status line, headers and body in one write, for the
answers the gateway gives most (an empty claim's `{"tasks":[]}`, and under a flood
its refusals: io.ConstantResponse).

uvicorn's send takes an answer as two ASGI messages, each through a coroutine, and
checks every header against two patterns as it writes the head. For an answer whose
headers were encoded and checked once, when it was made, `write_whole` writes the same bytes
in one call, and leaves the request's exchange as uvicorn's send would have.

Written against uvicorn 0.54's httptools `RequestResponseCycle` (the attributes it
reads and sets below); used only when the `send` a request was handed is that cycle's
own (`exchange_of`), so any other server, or a wrapped send, takes the usual path.
"""

from __future__ import annotations

from starlette.types import Send
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

# The server's own headers (date, server) as written, for the list they were written
# from: uvicorn replaces that list when the date changes, once a second.
_server_head: tuple[object, bytes] = (None, b"")


def exchange_of(send: Send) -> RequestResponseCycle | None:
    """The exchange whose own send `send` is, or None for any other callable."""
    if getattr(send, "__func__", None) is RequestResponseCycle.send:
        cycle: RequestResponseCycle = getattr(send, "__self__")  # noqa: B009
        return cycle
    return None


def _server_head_of(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The server's headers as uvicorn writes them, checked as it checks them; None
    when one would not pass, so that uvicorn's send refuses it as it does."""
    global _server_head
    known, text = _server_head
    if known is not headers:
        if any(HEADER_RE.search(n) or HEADER_VALUE_RE.search(v) for n, v in headers):
            return None
        text = b"".join(name.lower() + b": " + value + b"\r\n" for name, value in headers)
        _server_head = (headers, text)
    return text


def write_whole(cycle: RequestResponseCycle, status: int, head: bytes, body: bytes) -> bool:
    """Write the answer: `head` is its header lines ("name: value\\r\\n" each, content-length
    among them, checked by whoever encoded them), `body` all of its body. False, with
    nothing written, unless the exchange is in the plain state (nothing sent yet, the
    client there, writing not paused, no uvicorn access log, not a HEAD request): the
    caller then sends the usual two messages, which handle every other case."""
    if (
        cycle.response_started
        or cycle.disconnected
        or cycle.flow.write_paused
        or cycle.access_log
        or cycle.scope["method"] == "HEAD"
    ):
        return False
    server_head = _server_head_of(cycle.default_headers)
    if server_head is None:
        return False
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    cycle.expected_content_length = 0
    close = b"" if cycle.keep_alive else b"connection: close\r\n"
    cycle.transport.write(b"".join((STATUS_LINE[status], server_head, head, close, b"\r\n", body)))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
    return True


def write_whole_to(send: Send, status: int, head: bytes, body: bytes) -> bool:
    """`write_whole` on the exchange whose own send `send` is; False, with nothing
    written, for any other send (the caller then sends the two messages)."""
    cycle = exchange_of(send)
    return cycle is not None and write_whole(cycle, status, head, body)
