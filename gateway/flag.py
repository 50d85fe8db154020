"""`Flag`: asyncio.Event's `set`, `clear`, `is_set` and `wait`, in a fraction of its
memory, for the objects kept per parked poll and per runtime.

An asyncio.Event keeps its waiters in a deque made when the event is, and an empty
deque is 760 bytes; with the event's own dict that is over 1 KiB. A parked poll held
two (its connection's write flow control and its request's message event, both
uvicorn's), and each runtime with parked polls two more (its pump's wake-up and its
Redis channel's confirmation): a tenth of what a parked poll cost (15 KiB). A Flag has
slots and makes its list of waiters only when one waits, which most never do.
"""

from __future__ import annotations

import asyncio
from typing import Literal


class Flag:
    """A flag that tasks wait for: `wait()` returns once `set()` was called (at once if
    it is set already); `clear()` lowers it again. As asyncio.Event, it is bound to
    the running loop of whoever waits."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[bool]] | None = None  # made by the first wait

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        """Raise the flag: every task waiting now is woken; later waits return at once
        until `clear()`."""
        if self._value:
            return
        self._value = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> Literal[True]:
        """Until the flag is set: True (cancelling the wait leaves the flag as it is)."""
        if self._value:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
            return True
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)

    def __repr__(self) -> str:
        state = "set" if self._value else "unset"
        return f"<Flag {state}, {len(self._waiters or ())} waiting>"
