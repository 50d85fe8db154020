"""uvicorn's keep-alive timeout (--keep-alive-seconds), with one timer per connection.

uvicorn makes a timer when each answer completes and cancels it when the next request
arrives: two calls into the event loop, and a timer made and dropped, per request of
a keep-alive connection. Here a connection keeps one timer, left armed while its
requests come and go; when it fires, it looks at how long the connection has been
idle, and closes it, or waits out the rest, or (the connection is busy) lets the next
answer arm it again. The read deadline in gateway/http/server.py works the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class KeepAlive:
    """One connection's keep-alive clock: `idle()` when an answer completes and
    nothing else is queued, `busy()` when data arrives, `cancel()` when the
    connection is lost. `on_timeout` is called once it has been idle for `seconds`."""

    __slots__ = ("_idle_since", "_loop", "_on_timeout", "_seconds", "_timer")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, on_timeout: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._seconds = seconds
        self._on_timeout = on_timeout
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # loop time it went idle; None: busy

    def idle(self) -> None:
        """Idle from now: `on_timeout` after `seconds` unless `busy()` comes first."""
        self._idle_since = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self._seconds, self._due)

    def busy(self) -> None:
        """At work from now (the timer, if armed, stays so and finds it busy)."""
        self._idle_since = None

    def cancel(self) -> None:
        self._idle_since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> None:
        self._timer = None
        since = self._idle_since
        if since is None:
            return  # busy: armed again when it next goes idle
        left = since + self._seconds - self._loop.time()
        if left > 0:  # went idle after the timer was armed
            self._timer = self._loop.call_later(left, self._due)
            return
        self._idle_since = None
        self._on_timeout()
