"""The HTTP server: uvicorn, with a connection protocol that cuts hostile clients.

uvicorn (0.54) bounds neither how long a client may take to send a request nor how
large its head may be, and after an early answer (a 413, say) it goes on reading
whatever body is still coming. `GatewayHttpProtocol` adds, per connection:

- a request must arrive in full (head and body) within GATEWAY_READ_TIMEOUT_SECONDS
  (deadlines.ReadClock), or it is answered 408 and the connection closed. An idle
  keep-alive connection is closed after uvicorn's timeout, kept with one timer for
  all connections rather than one per request (deadlines.KeepAlive).
- a head (request line and headers) over MAX_HEAD_BYTES is answered 431 and the
  connection closed; no more than the limit of it is parsed.
- an answer given before the request's body arrived carries `Connection: close`,
  and the rest of the body is not read.
- an answer must keep moving (deadlines.WriteClock), or the connection is aborted
  and the answer dropped: a client that never reads cannot hold its answer's memory.
- each request carries its connection's `Caller` in its scope (io.CALLER), told when
  the connection is lost or cut, so that work waiting for a database connection whose
  client has left is not started (gateway/admission.py).
- the requests read and not yet answered are counted (gateway/in_flight.py), and a
  connection refused under overload is read again at the end of its Retry-After.
- a request that arrives in full in one read, and that the app's door refuses under
  overload (its `early_answer`, gateway/http/shedding.py), is answered from the read
  itself, with no task or app call made for it.

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
from collections.abc import Awaitable, Callable
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
from .deadlines import KeepAlive, ReadClock, WriteClock
from .io import CALLER, HOLD_READING, ConstantResponse
from .transport import Transport
from .whole import write_whole

log = logging.getLogger("gateway.server")

MAX_HEAD_BYTES = 64 * 1024
LINGER_SECONDS = 1.0
# The app's refusal at the door of a request read in full (scope, body), or None.
EarlyAnswer = Callable[[Scope, bytes | bytearray], ConstantResponse | None]

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
        "_cycles",
        "_deferred",
        "_early",
        "_got_bytes",
        "_head_bytes",
        "_held",
        "_inner_app",
        "_linger",
        "_parsing",
        "_pending_body",
        "_raw",
        "_read_clock",
        "_receiving",
        "_write_clock",
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
        self._read_clock = ReadClock(self, self.loop, self.read_timeout_seconds)
        self._linger: asyncio.TimerHandle | None = None
        self._receiving = True  # a request is due or arriving, and its clock runs
        self._got_bytes = False  # some of that request has arrived
        self._head_bytes = 0  # of its head, so far
        self._pending_body: object | None = None  # its scope once the head is in
        self._cycles: list[RequestResponseCycle] = []  # requests not yet fully answered
        self._at_work: list[RequestResponseCycle] = []  # those of them read in full
        self._write_clock: WriteClock | None = None  # made when first needed (_writes)
        self._caller = Caller()  # told when the connection is lost (_leave)
        # While refused at the door (HOLD_READING): what arrives meanwhile, kept unread.
        self._held: bytearray | None = None
        # The door's refusal of a request read in full, written with no app task (the
        # app's `early_answer`, gateway/http/app.py), when the app has one.
        self._early: EarlyAnswer | None = getattr(self._inner_app, "early_answer", None)
        self._parsing = False  # within a read's parse
        # The request whose head that parse read, its app not started yet.
        self._deferred: tuple[RequestResponseCycle, Any] | None = None

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
        self._read_clock.cancel()
        if self._write_clock is not None:
            self._write_clock.stop()
        self.keep_alive.busy(self)
        if self._linger is not None:
            self._linger.cancel()
        self._leave()
        self._raw = None  # gone: nothing left to close, write or time
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        clock = self._writes()
        if clock is not None:
            clock.paused = True
            clock.restart()

    def resume_writing(self) -> None:
        super().resume_writing()
        clock = self._write_clock
        if clock is not None:
            clock.paused = False
            clock.restart()

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
        self._parsing = True
        try:
            self._parse(data)
        finally:
            self._parsing = False
            deferred, self._deferred = self._deferred, None
            if deferred is not None:
                self._start_or_refuse(*deferred)

    def _parse(self, data: bytes) -> None:
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
        # uvicorn's, with the server's one keep-alive timer (deadlines.KeepAlive), and the
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
        if self._parsing and self._deferred is None:
            # uvicorn starts a request's app as soon as its head is parsed. Started
            # instead once the read is parsed (the same turn of the loop, before the
            # app could run), when its body may be in too: see _start_or_refuse.
            self._deferred = (cycle, app)
            return
        super()._start_asgi_task(cycle, app)
        if not cycle.more_body:  # a request that was queued, its body already in
            self._count_at_work(cycle)

    def _start_or_refuse(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Start the app for a request whose head the last read brought, unless the
        request arrived in full and the door refuses it (gateway/http/shedding.py): its
        refusal is then written here, whole, and no task, app or middleware runs for
        it. Under a flood that sends again the moment it is answered, refusals are much
        of what the gateway does, and the task and the app were a third of their cost
        in this process (`python -m bench.refusal_cost`)."""
        early = self._early
        if early is not None and not cycle.more_body and not self.transport.is_closing():
            try:
                answer = early(cast(Scope, cycle.scope), cycle.body)
            except Exception:  # a defect of the door's: the app answers, as it would have
                log.exception("the door's early check failed; the request goes to the app")
                answer = None
            if answer is not None:
                if write_whole(cycle, answer.status_code, answer.head, answer.content):
                    return
                app = answer  # not in the plain state: sent as two messages, by a task
        super()._start_asgi_task(cycle, app)  # counted at work when its body is in

    def _count_at_work(self, cycle: RequestResponseCycle) -> None:
        """At work from here: a request is counted once its body is in and it has been
        started (or is about to be, in the same turn: _start_or_refuse), so that
        neither a client sending slowly (up to GATEWAY_READ_TIMEOUT_SECONDS) nor
        requests queued behind another on one connection (pipelined, or held after a
        refusal) count."""
        self._at_work.append(cycle)
        self.in_flight.requests += 1
        self._read_clock.stop()
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
        self._read_clock.start()

    def reading_paused(self) -> bool:
        """For the read clock (deadlines.ReadOwner)."""
        return bool(self.flow.read_paused)

    def read_late(self) -> None:
        """For the read clock (deadlines.ReadOwner)."""
        self._cut("read_timeout")

    def _writes(self) -> WriteClock | None:
        """The connection's write deadline (deadlines.py), made the first time it is
        needed; None if the connection went before it was."""
        if self._write_clock is None and self._raw is not None:
            self._write_clock = WriteClock(
                self._raw, self.loop, self.read_timeout_seconds, self._write_stalled
            )
        return self._write_clock

    def _write_stalled(self) -> None:
        self._leave()
        self._count("write_timeout")
        log.debug("aborting the connection from %s: write_timeout", _peer(self.client))
        if self._raw is not None:
            self._raw.abort()  # drops the buffer, and the answer with it

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
        seconds = self.loop.time() - self._read_clock.started
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
            clock = self._writes()
            if clock is not None and not clock.running:
                clock.restart()  # the close waits for what is still unsent
            return
        self.lingering = True
        cast(Transport, self.transport).stop_writing()
        self._read_clock.stop()
        self.flow.pause_reading()
        raw.write_eof()
        self._linger = self.loop.call_later(LINGER_SECONDS, self.close_softly)

    def _count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_cut.labels(reason).inc()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown client"
