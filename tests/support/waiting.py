"""Polling until something holds, failing the test after a deadline: a condition
read as it is (`wait_until`), or one that must be awaited (`within`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


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


async def within(seconds: float, check: Callable[[], Awaitable[bool]], every: float = 0.1) -> float:
    """Seconds until `check()` holds; fails the test after `seconds`."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > seconds:
            raise AssertionError(f"still not true after {seconds} s")
        await asyncio.sleep(every)
    return time.monotonic() - started
