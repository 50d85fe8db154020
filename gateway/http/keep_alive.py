"""uvicorn's keep-alive timeout (--keep-alive-seconds), with one timer for all of a
server's connections.

uvicorn makes a timer when each answer completes and cancels it when the next request
arrives: two calls into the event loop, and a timer made and dropped, per request of
a keep-alive connection. Here the server keeps its idle connections in one dict, in the
order they went idle, each with the loop time it is to be closed at: a connection
enters it when its answer completes with nothing else queued and leaves it when data
arrives or it is lost, and one timer, armed for the oldest entry, closes those whose
time has come. A busy connection (a parked poll, say) holds nothing here at all.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

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
