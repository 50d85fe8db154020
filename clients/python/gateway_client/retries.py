"""Enqueues that the client retries, made safe to retry.

An enqueue refused under overload (`429`, `503 database_busy`: nothing was stored) may
simply be sent again. One whose answer was lost (the connection failed after the
gateway stored the task) may not: sent again, it would make a second task. So an
enqueue that may be retried always carries an idempotency key, the caller's or one
made here; a retry then gets the task already stored (`200`,
`Idempotent-Replayed: true`), never a copy.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .backoff import Backoff
from .errors import GatewayError

T = TypeVar("T")

# The idempotency keys the client makes itself start with this.
OWN_KEY_PREFIX = "client-"


def own_key() -> str:
    """A new idempotency key, unique to one enqueue (and its retries)."""
    return OWN_KEY_PREFIX + uuid.uuid4().hex


async def retrying(
    call: Callable[[], Awaitable[T]],
    retry_seconds: float,
    backoff: Backoff | None = None,
) -> T:
    """`call()`, tried again after each retryable failure (overload, a refusal before
    any work, a database or network failure) with full-jitter backoff, never sooner
    than the gateway's Retry-After, while `retry_seconds` last; then the last failure
    is raised. A pause that would end past that time is not taken."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + retry_seconds
    backoff = backoff or Backoff()
    while True:
        try:
            return await call()
        except GatewayError as exc:
            if not exc.retryable:
                raise
            pause = backoff.next_delay(exc.retry_after_seconds)
            if loop.time() + pause > deadline:
                raise
            await asyncio.sleep(pause)
