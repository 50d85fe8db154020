"""Polling until something holds, failing the test after a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(
    predicate: Callable[[], bool], within: float, what: str, interval: float = 0.01
) -> float:
    """Poll `predicate` until it is true, failing the test after `within` seconds;
    returns the monotonic time it became true."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.1f}s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic()
