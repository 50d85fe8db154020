"""An asyncio event loop on virtual time: when nothing is ready it jumps to the next
timer instead of sleeping, so minutes of timeouts, TTLs and parks run in
microseconds, and the same seed replays the same interleaving."""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from typing import Any


class Stuck(RuntimeError):
    """Nothing ready and no timer pending: the program under test would hang forever."""


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # Only the loop's own self-pipe is ever registered: poll it without blocking.
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise Stuck("no task is ready and no timer is pending")
        if timeout > 0 or (self.loop is not None and not self.loop._ready):  # type: ignore[attr-defined]
            # Idle: jump to the next timer, and by at least a nanosecond, so that code
            # re-waiting for a remainder smaller than a float step still sees time move
            # (a timer exactly due now is not run until the clock has passed it).
            self.now += max(timeout, 1e-9)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """time() starts at 0.0 and advances only when every task is waiting."""

    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)
        self._jumping.loop = self
        self._clock_resolution = 0.0  # timers fire once due, never early

    def time(self) -> float:
        return self._jumping.now


def run(coro: Any) -> Any:
    """Run `coro` to completion on a fresh VirtualLoop, then cancel what is left."""
    loop = VirtualLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            with contextlib.suppress(Stuck):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
