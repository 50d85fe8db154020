"""A connection's clocks (gateway/http/server.py): two deadlines, each bounded by
GATEWAY_READ_TIMEOUT_SECONDS, and the keep-alive timeout of idle connections.

- A request must arrive in full in time (`ReadClock`), counted from the connection's
  opening for its first request and from the first byte for later ones; the time taken
  to answer it (a long poll) is never counted.
- An answer must keep moving (`WriteClock`): while it waits in the connection's buffer
  for a client that does not take it (the transport paused writing, or a close waits
  for the buffer to drain), at least MIN_DRAIN_BYTES of it must leave per timeout, or
  the connection is aborted and the answer dropped. So a client that never reads
  cannot hold its answer's memory. A connection gets this clock only once its writes
  pause or it closes: a parked poll's connection holds none.
- An idle keep-alive connection is closed after uvicorn's keep-alive timeout
  (--keep-alive-seconds), with one timer for all of a server's connections
  (`KeepAlive`). uvicorn makes a timer when each answer completes and cancels it when
  the next request arrives: two calls into the event loop, and a timer made and
  dropped, per request of a keep-alive connection. Here the server keeps its idle
  connections in one dict, in the order they went idle, each with the loop time it is
  to be closed at: a connection enters it when its answer completes with nothing else
  queued and leaves it when data arrives or it is lost, and one timer, armed for the
  oldest entry, closes those whose time has come. A busy connection (a parked poll,
  say) holds nothing there at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

# What an answer waiting for its client must lose per GATEWAY_READ_TIMEOUT_SECONDS
# (asyncio's low-water mark). Any progress at all would let a client hold a large answer
# for days, taking a kilobyte now and then.
MIN_DRAIN_BYTES = 16 * 1024


class ReadOwner(Protocol):
    """What a ReadClock asks of its connection."""

    def reading_paused(self) -> bool:
        """Whether the server stopped reading (an earlier request is still being
        answered, or the body was not consumed yet): the client cannot be late."""
        ...

    def read_late(self) -> None:
        """The request did not arrive in time."""
        ...


class ReadClock:
    """The read deadline of one connection, `owner`: a request must arrive in full
    within `timeout_seconds` of `start()`, and `stop()` is called once it has.

    One timer per connection, not one per request: it is left armed when the clock
    stops, and when it fires it looks at the clock running then (the next request's,
    or none), so that a keep-alive connection's requests make no timer each."""

    __slots__ = ("_loop", "_owner", "_timeout_seconds", "_timer", "running", "started")

    def __init__(
        self, owner: ReadOwner, loop: asyncio.AbstractEventLoop, timeout_seconds: float
    ) -> None:
        self._owner = owner
        self._loop = loop
        self._timeout_seconds = timeout_seconds
        self._timer: asyncio.TimerHandle | None = None  # may outlive the clock's run
        self.running = False
        self.started = 0.0  # loop time the clock last started

    def start(self) -> None:
        self.running = True
        self.started = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout_seconds, self._read_timed_out)

    def stop(self) -> None:
        self.running = False

    def cancel(self) -> None:
        """Stop the clock and its timer: the connection is gone."""
        self.running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _read_timed_out(self) -> None:
        self._timer = None
        if not self.running:
            return  # no request is arriving: the next one arms the timer again
        left = self.started + self._timeout_seconds - self._loop.time()
        if left > 0:  # armed for an earlier request: this one has time left
            self._timer = self._loop.call_later(left, self._read_timed_out)
        elif self._owner.reading_paused():  # not the client's delay: look again later
            self._timer = self._loop.call_later(self._timeout_seconds, self._read_timed_out)
        else:
            self._owner.read_late()


class WriteClock:
    """The write deadline of one connection's transport, `raw`; `on_stalled` is called
    (once, from the loop) when an answer did not move enough in `timeout_seconds`."""

    __slots__ = ("_loop", "_on_stalled", "_raw", "_timeout_seconds", "_timer", "_unsent", "paused")

    def __init__(
        self,
        raw: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        timeout_seconds: float,
        on_stalled: Callable[[], None],
    ) -> None:
        self._raw = raw
        self._loop = loop
        self._timeout_seconds = timeout_seconds
        self._on_stalled = on_stalled
        self._timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes in the transport's buffer when the clock started
        self.paused = False  # the transport's buffer is over its high-water mark

    @property
    def running(self) -> bool:
        return self._timer is not None

    def restart(self) -> None:
        """(Re)start the clock if an answer waits in the buffer for the client: writes
        are paused, or a close waits for the buffer to drain; else leave it stopped."""
        self.stop()
        self._unsent = self._raw.get_write_buffer_size()
        if self._unsent and (self.paused or self._raw.is_closing()):
            self._timer = self._loop.call_later(self._timeout_seconds, self._due)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        unsent = self._unsent
        if unsent - self._raw.get_write_buffer_size() >= min(MIN_DRAIN_BYTES, unsent):
            # A single large answer resumes writing only once nearly all of it is sent:
            # a slow client that reads steadily shows here, by what left the buffer.
            self.restart()
            return
        self._on_stalled()


# How early the timer may fire and still close what is due then (the event loop's
# clock, libuv's, counts whole milliseconds).
SLACK_SECONDS = 0.001


class Connection(Protocol):
    """What the clock needs of a connection (uvicorn's protocol has all three)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def timeout_keep_alive(self) -> float: ...

    def timeout_keep_alive_handler(self) -> None: ...


class KeepAlive:
    """The idle connections of one server: `idle(c)` when an answer completes and
    nothing else is queued, `busy(c)` when data arrives or the connection is lost. A
    connection idle for its `timeout_keep_alive` has its `timeout_keep_alive_handler()`
    called (it closes). Every connection of one server has the same timeout, so the
    dict's order is the order they are due in."""

    __slots__ = ("_idle", "_loop", "_timer")

    def __init__(self) -> None:
        self._idle: dict[Connection, float] = {}  # loop time each is closed at
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def idle(self, conn: Connection) -> None:
        """Idle from now: closed after its keep-alive timeout unless `busy` first."""
        loop = conn.loop
        if loop is not self._loop:  # a new event loop (tests): the old one's are gone
            self._idle.clear()
            self._timer, self._loop = None, loop
        idle = self._idle
        idle.pop(conn, None)  # to the end: the newest idle
        idle[conn] = loop.time() + conn.timeout_keep_alive
        if self._timer is None:
            self._timer = loop.call_at(idle[next(iter(idle))], self._due)

    def busy(self, conn: Connection) -> None:
        """At work, or gone: not idle."""
        self._idle.pop(conn, None)

    def __len__(self) -> int:
        return len(self._idle)

    def _due(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        idle = self._idle
        now = loop.time() + SLACK_SECONDS
        due = []
        for conn, at in idle.items():
            if at > now:
                break
            due.append(conn)
        for conn in due:
            del idle[conn]
        if idle:  # the oldest left, whose time has not come
            self._timer = loop.call_at(idle[next(iter(idle))], self._due)
        for conn in due:  # armed first: a close that raised would stop the clock
            conn.timeout_keep_alive_handler()
