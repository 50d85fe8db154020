"""The HTTP server: uvicorn, with a connection protocol that cuts hostile clients.

uvicorn (0.54) bounds neither how long a client may take to send a request nor how
large its head may be, and after an early answer (a 413, say) it goes on reading
whatever body is still coming. `GatewayHttpProtocol` adds, per connection:

- a request must arrive in full (head and body) within GATEWAY_READ_TIMEOUT_SECONDS,
  counted from the connection's opening for its first request and from the first
  byte for later ones; otherwise it is answered 408 and the connection closed. The
  clock stops once the request has arrived: the time taken to answer (a long poll)
  is never counted. An idle keep-alive connection is closed after uvicorn's timeout,
  kept with one timer for all connections rather than one per request (keep_alive.py).
- a head (request line and headers) over MAX_HEAD_BYTES is answered 431 and the
  connection closed; no more than the limit of it is parsed.
- an answer given before the request's body arrived carries `Connection: close`,
  and the rest of the body is not read.
- an answer must keep moving: while it waits in the gateway's buffer for a client
  that does not take it (the transport paused writing, or a close waits for it to
  drain), at least MIN_DRAIN_BYTES of it must leave per GATEWAY_READ_TIMEOUT_SECONDS,
  or the connection is aborted and the answer dropped. So that setting bounds both
  directions: a client that never reads cannot hold its answer's memory.
- each request carries its connection's `Caller` in its scope (io.CALLER), told when
  the connection is lost or cut, so that work waiting for a database connection whose
  client has left is not started (gateway/admission.py).
- the requests read and not yet answered are counted (gateway/in_flight.py), and a
  connection refused under overload is read again at the end of its Retry-After.

Closing a socket while the client is still sending makes the kernel reset the
connection, which can destroy the answer before the client reads it. So those closes
send the answer, stop reading, shut down the sending side and wait LINGER_SECONDS
before closing for good (RFC 9112, section 9.6; Go's net/http does the same). What
the client sends meanwhile stays in the kernel's buffers and is never read.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable
from typing import Any, cast

from starlette.types import Message, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from ..admission import Caller
from ..errors import GatewayError, HeadersTooLarge, RequestTimeout
from ..flag import Flag
from ..in_flight import InFlight
from ..metrics import Metrics
from .access import server_answer
from .io import CALLER, HOLD_READING
from .keep_alive import KeepAlive
from .transport import Transport

log = logging.getLogger("gateway.server")

MAX_HEAD_BYTES = 64 * 1024
LINGER_SECONDS = 1.0
# What an answer waiting for its client must lose per GATEWAY_READ_TIMEOUT_SECONDS
# (asyncio's low-water mark). Any progress at all would let a client hold a large answer
# for days, taking a kilobyte now and then.
MIN_DRAIN_BYTES = 16 * 1024
# A connection held after a refusal is read again at a random point of the hold's last
# fifth: those refused in one turn of the loop would otherwise all come back in one.
HOLD_SPREAD = 0.2


class _ClosingSend:
    """A request's `send`: an answer that starts before the request's body has all
    arrived asks the client to close the connection, since the rest of the body will
    not be read. An object with slots, not a closure, for the memory of parked polls."""

    __slots__ = ("_protocol", "_scope", "_send")

    def __init__(self, protocol: GatewayHttpProtocol, scope: Scope, send: Send) -> None:
        self._protocol = protocol
        self._scope = scope
        self._send = send

    def __call__(self, message: Message) -> Awaitable[None]:
        # Not a coroutine of its own: uvicorn's send is awaited directly, one frame less
        # per message sent.
        protocol = self._protocol
        if message["type"] == "http.response.start" and self._scope is protocol._pending_body:
            # Answered before its body arrived: the rest of it will not be read.
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = {**message, "headers": headers}
            if not protocol.lingering:  # not already cut
                protocol._count("body_unread")
        return self._send(message)


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read and write deadlines, a head limit and
    lingering closes (see the module docstring). Build a configured subclass with
    `protocol_class()`; uvicorn makes one instance per connection.

    Written against uvicorn 0.54: it overrides the parser callbacks and
    `on_response_complete` (which it replaces, as `_unset_keepalive_if_required`), reads the
    attributes `app`, `scope`, `cycle`, `pipeline`, `flow` and `server_state`, and marks
    request cycles gone as uvicorn's connection_lost does (`response_complete`,
    `disconnected`, `message_event`). It replaces the two asyncio.Events uvicorn makes
    per connection and per request (the flow control's writable event, a request's
    message event) with Flags, which a parked poll holds for its whole wait
    (gateway/flag.py)."""

    # Slots, not the instance dict: uvicorn's protocol keeps 27 attributes there, and
    # 14 more took the dict past what CPython shares between instances (30 keys), so
    # each connection's dict grew from 288 bytes to 1.5 KiB: about a tenth of what a
    # parked poll costs.
    __slots__ = (
        "_at_work",
        "_caller",
        "_clock_on",
        "_cycles",
        "_deadline",
        "_got_bytes",
        "_head_bytes",
        "_held",
        "_inner_app",
        "_linger",
        "_pending_body",
        "_raw",
        "_receiving",
        "_request_started",
        "_unsent",
        "_write_deadline",
        "_write_paused",
        "lingering",
    )

    read_timeout_seconds: float = 30.0
    metrics: Metrics | None = None
    in_flight: InFlight = InFlight()  # protocol_class gives each app its own
    keep_alive: KeepAlive = KeepAlive()  # and each its own idle connections

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # The start-up gate, once open, is skipped by connections made after that.
        app_if_open = getattr(self.app, "app_if_open", None)
        self._inner_app = (app_if_open() if app_if_open is not None else None) or self.app
        self.app = self._app
        self.lingering = False
        self._raw: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None  # the read clock's timer
        self._clock_on = False  # the read clock runs (the timer may outlive it)
        self._linger: asyncio.TimerHandle | None = None
        self._receiving = True  # a request is due or arriving, and its clock runs
        self._got_bytes = False  # some of that request has arrived
        self._head_bytes = 0  # of its head, so far
        self._pending_body: object | None = None  # its scope once the head is in
        self._cycles: list[RequestResponseCycle] = []  # requests not yet fully answered
        self._at_work: list[RequestResponseCycle] = []  # those of them read in full
        self._write_paused = False  # the transport's buffer is over its high-water mark
        self._write_deadline: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes in the transport's buffer when that clock started
        self._request_started = 0.0  # loop time its read clock started
        self._caller = Caller()  # told when the connection is lost (_leave)
        # While refused at the door (HOLD_READING): what arrives meanwhile, kept unread.
        self._held: bytearray | None = None

    # -- connection events ---------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        super().connection_made(cast(asyncio.Transport, Transport(transport, self)))
        writable = Flag()
        writable.set()  # as FlowControl starts: nothing written yet
        # Typed as an asyncio.Event in uvicorn; a Flag does all it is asked.
        setattr(self.flow, "_is_writable_event", writable)  # noqa: B010
        self._start_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_clock()
        self._stop_write_clock()
        self.keep_alive.busy(self)
        if self._linger is not None:
            self._linger.cancel()
        self._leave()
        self._raw = None  # gone: nothing left to close, write or time
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._write_paused = True
        self._start_write_clock()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._write_paused = False
        self._start_write_clock()

    def data_received(self, data: bytes) -> None:
        if self._held is not None:
            # Held after a refusal at the door: kept as it came, and fed to the parser
            # when the hold ends. Read rather than left in the socket, so that a client
            # that gives up and closes meanwhile is seen to leave, and what it sent is
            # never started.
            self._held += data
            if len(self._held) > MAX_HEAD_BYTES:
                self.flow.pause_reading()  # enough kept: the rest waits in the socket
            return
        if self.lingering:
            return  # read before reading was paused: the rest of a refused request
        if not self._receiving:
            self._start_request()
        self._got_bytes = True
        while data:
            if self._pending_body is not None:
                super().data_received(data)
                return
            # Feed a head no further than the limit, so the parser never holds more;
            # what follows the head in the same read is fed next, as body. (A head
            # pipelined behind a body in one read is counted from the next read: at
            # most one read, 256 KiB, more.)
            room = MAX_HEAD_BYTES - self._head_bytes
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            super().data_received(piece)
            if self.transport.is_closing():
                return
            if self._pending_body is None and self._head_bytes >= MAX_HEAD_BYTES:
                self._cut("head_too_large")
                return

    def on_response_complete(self) -> None:
        # uvicorn's, with the server's one keep-alive timer (keep_alive.py), and the
        # hold after a refusal under overload.
        done = self._answered()
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()  # (not idle: data came since it last was)
        pause = None if done is None else done.scope.get(HOLD_READING)
        if isinstance(pause, float):
            # Refused under overload: this connection's next request is parsed at the
            # end of the Retry-After it was told, so that a client that sends again at
            # once (as a misbehaving fleet does) is not refused, and paid for, in a tight
            # loop. The refusal itself went out at once. Requests already read behind it
            # (pipelined in the same write) wait as well.
            self._held = bytearray()
            self.loop.call_later(pause * (1 - HOLD_SPREAD * random.random()), self._end_hold)
        elif self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self.keep_alive.idle(self)

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn's, called as data arrives (and as the connection is lost).
        self.keep_alive.busy(self)

    def _answered(self) -> RequestResponseCycle | None:
        """The request whose answer just completed (uvicorn answers a connection's
        requests one at a time, in order), no longer tracked, nor counted at work."""
        cycles, at_work = self._cycles, self._at_work
        for i, done in enumerate(cycles):
            if done.response_complete:
                del cycles[i]
                break
        else:
            return None
        if at_work and at_work[0] is done:  # both lists are in the order requests came
            del at_work[0]
            self.in_flight.requests -= 1
        return done

    def _end_hold(self) -> None:
        held, self._held = self._held, None
        if self.transport.is_closing():
            return  # the client left meanwhile: what it sent is never started
        self.flow.resume_reading()
        if self.pipeline:  # the next request read before the hold began starts now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif not held:  # idle: kept alive from now, as uvicorn would have from the answer
            self.keep_alive.idle(self)
        if held:
            self.data_received(bytes(held))

    # -- parser events -------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._receiving:  # pipelined behind the previous request, in the same read
            self._start_request()
        self._got_bytes = True

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and type(cycle.message_event) is asyncio.Event:
            # Made just now, and its task not started yet: nothing waits on it, and
            # nothing has set it.
            cycle.message_event = cast(asyncio.Event, Flag())
        self._pending_body = self.scope
        if cycle is not None and cycle not in self._cycles:  # not an upgrade's head
            self._cycles.append(cycle)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle not in self._cycles:
            return
        pipeline = self.pipeline
        if pipeline and pipeline[0][0] is cycle:
            return  # queued behind an earlier request: counted once it starts
        self._count_at_work(cycle)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        super()._start_asgi_task(cycle, app)
        if not cycle.more_body:  # a request that was queued, its body already in
            self._count_at_work(cycle)

    def _count_at_work(self, cycle: RequestResponseCycle) -> None:
        """At work from here: a request is counted once its body is in and it has been
        started, so that neither a client sending slowly (up to
        GATEWAY_READ_TIMEOUT_SECONDS) nor requests queued behind another on one
        connection (pipelined, or held after a refusal) count."""
        self._at_work.append(cycle)
        self.in_flight.requests += 1
        self._stop_clock()
        self._receiving = self._got_bytes = False
        self._head_bytes = 0
        self._pending_body = None

    # -- the application -----------------------------------------------------

    def _app(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Not a coroutine of its own: its frame would be held for as long as the request
        # runs, which for a parked poll is its whole wait.
        if scope is self._pending_body:  # its body is still arriving (see _ClosingSend);
            send = _ClosingSend(self, scope, send)  # once in, it is never pending again
        scope[CALLER] = self._caller
        answer: Awaitable[None] = self._inner_app(scope, receive, send)
        return answer

    # -- deadline and cuts ---------------------------------------------------

    def _start_request(self) -> None:
        self._receiving = True
        self._clock_on = True
        self._request_started = self.loop.time()
        # One timer per connection, not one per request: it is left armed when a
        # request's clock stops, and when it fires it looks at the clock running then
        # (the next request's, or none), so that a keep-alive connection's requests
        # make no timer each.
        if self._deadline is None:
            self._deadline = self.loop.call_later(self.read_timeout_seconds, self._read_timed_out)

    def _stop_clock(self) -> None:
        self._clock_on = False

    def _cancel_clock(self) -> None:
        self._clock_on = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if not self._clock_on:
            return  # no request is arriving: the next one arms the timer again
        left = self._request_started + self.read_timeout_seconds - self.loop.time()
        if left > 0:  # armed for an earlier request: this one has time left
            self._deadline = self.loop.call_later(left, self._read_timed_out)
            return
        if self.flow.read_paused:
            # The server stopped reading (an earlier request is still being answered, or
            # the body was not consumed yet): the client cannot be late. Look again later.
            self._deadline = self.loop.call_later(self.read_timeout_seconds, self._read_timed_out)
            return
        self._cut("read_timeout")

    def _start_write_clock(self) -> None:
        """(Re)start the write deadline if an answer waits in the buffer for the client:
        writes are paused, or a close waits for the buffer to drain."""
        self._stop_write_clock()
        raw = self._raw
        if raw is None:
            return
        self._unsent = raw.get_write_buffer_size()
        if self._unsent and (self._write_paused or raw.is_closing()):
            self._write_deadline = self.loop.call_later(
                self.read_timeout_seconds, self._write_timed_out
            )

    def _stop_write_clock(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        raw = self._raw
        assert raw is not None
        if self._unsent - raw.get_write_buffer_size() >= min(MIN_DRAIN_BYTES, self._unsent):
            # A single large answer resumes writing only once nearly all of it is sent:
            # a slow client that reads steadily shows here, by what left the buffer.
            self._start_write_clock()
            return
        self._leave()
        self._count("write_timeout")
        log.debug("aborting the connection from %s: write_timeout", _peer(self.client))
        raw.abort()  # drops the buffer, and the answer with it

    def _may_answer(self) -> bool:
        # uvicorn 0.54: `cycle` is the latest request's exchange (the previous one while
        # a head is arriving); `pipeline` holds requests waiting for an earlier answer.
        if self.pipeline:
            return False
        if self._pending_body is None:
            return self.cycle is None or self.cycle.response_complete
        return self.cycle is not None and not self.cycle.response_started

    def _cut(self, reason: str) -> None:
        """Close the connection of a request that broke a limit, answering it when no
        other answer is under way; `reason` labels gateway_connections_cut_total."""
        answer = self._answer(reason) if self._got_bytes and self._may_answer() else None
        self._leave()
        self._count(reason)
        log.debug("closing the connection from %s: %s", _peer(self.client), reason)
        if answer is not None and self._raw is not None:
            cast(Transport, self.transport).flush()
            self._raw.write(answer)
        self.close_softly()

    def _leave(self) -> None:
        """Tell every request of this connection not yet answered that its client left:
        its receive() returns http.disconnect and its answer is dropped. uvicorn 0.54
        tells only the latest (`cycle`), so a long poll with a request pipelined behind
        it would never learn that its client is gone. Work of theirs waiting for a
        database connection leaves the line (admission.Caller)."""
        self._caller.leave()
        for cycle in self._cycles:
            if not cycle.response_complete:
                cycle.disconnected = True  # as uvicorn's connection_lost does
            cycle.message_event.set()
        self.in_flight.requests -= len(self._at_work)  # their answers will never complete
        self._cycles = []
        self._at_work = []

    def _answer(self, reason: str) -> bytes:
        error: GatewayError
        if reason == "head_too_large":
            error = HeadersTooLarge(
                f"the request line and headers are larger than {MAX_HEAD_BYTES} bytes; "
                "the connection is closed"
            )
        else:
            error = RequestTimeout(
                f"the request did not arrive in full within {self.read_timeout_seconds:g} "
                "seconds (GATEWAY_READ_TIMEOUT_SECONDS); the connection is closed"
            )
        seconds = self.loop.time() - self._request_started
        return server_answer(
            self.metrics, self._pending_body, error, seconds, self.server_state.default_headers
        )

    def close_softly(self) -> None:
        """Close, or, when part of a request may still be on its way, stop reading,
        shut down the sending side, and close LINGER_SECONDS later."""
        raw = self._raw
        if raw is None:
            return
        cast(Transport, self.transport).flush()  # the answer goes before the close
        unread = self._receiving and self._got_bytes
        if self.lingering or raw.is_closing() or not unread or not raw.can_write_eof():
            raw.close()
            if self._write_deadline is None:
                self._start_write_clock()  # the close waits for what is still unsent
            return
        self.lingering = True
        cast(Transport, self.transport).stop_writing()
        self._stop_clock()
        self.flow.pause_reading()
        raw.write_eof()
        self._linger = self.loop.call_later(LINGER_SECONDS, self.close_softly)

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_cut.labels(reason).inc()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"
