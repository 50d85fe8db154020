"""Stopping the gateway's background loops (janitor, pub/sub reader) within a bound.

On Python 3.11, `asyncio.wait_for` (used inside asyncpg and redis-py) can swallow a
cancellation that arrives just as its inner call finishes (fixed in 3.12). A loop
that lost its cancellation would keep running and hold up shutdown forever, so each
loop also checks a stop flag, and `stop_task` cancels repeatedly, within a bound.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("gateway")


async def stop_task(task: asyncio.Task[None], name: str, timeout_seconds: float = 5.0) -> None:
    """Cancel `task` until it ends, waiting at most `timeout_seconds`; logs a task that
    died of an error, or one that would not stop. Idempotent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while not task.done():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.warning("%s did not stop within %.0fs; leaving it behind", name, timeout_seconds)
            return
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.5, remaining))
    if not task.cancelled() and task.exception() is not None:
        log.error("%s had died of an error", name, exc_info=task.exception())
