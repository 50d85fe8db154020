"""The near-cache (GATEWAY_NEAR_CACHE, on by default): verdict hits kept in this
process, so that a poll on a runtime known to be empty costs no Redis round trip.

A hit the claim path read from Redis, a verdict it wrote, or one it renewed is kept in
the runtime's RuntimeState (gateway/claim/waiters.py): its version, and until when (loop
time, never past the key's life in Redis, since that life counts from before the
read). It is trusted only while the runtime's wake-up subscription is confirmed and
Redis healthy: then a bump anywhere reaches this process as a wake-up, and the Claimer
drops the kept hit (`drop_near`). Every drop is counted, so that a verdict read before
a drop is never kept after it: `keep` compares the count sampled before the read.
"""

from __future__ import annotations

import asyncio

from .ports import ClaimCache, WakeChannels
from .waiters import RuntimeState


def drop_near(state: RuntimeState) -> None:
    """Forget the runtime's kept verdict hit (a wake-up came, Redis failed), and count
    the drop."""
    state.near_version = None
    state.near_drops += 1


class NearCache:
    """The Claimer's near-cache rules. It holds no verdict itself: what is kept for a
    runtime lives in that runtime's RuntimeState."""

    __slots__ = ("_cache", "_subscriber", "enabled")

    def __init__(self, cache: ClaimCache, subscriber: WakeChannels, enabled: bool) -> None:
        self._cache = cache
        self._subscriber = subscriber
        self.enabled = enabled

    def hit(self, state: RuntimeState) -> float | None:
        """Seconds left of the verdict hit this process holds for the runtime, or None
        (none held, spent, or no longer trusted: it is then dropped)."""
        if state.near_version is None:
            return None
        left = state.near_until - asyncio.get_running_loop().time()
        if left > 0 and self._subscriber.confirmed(state.channel) and self._cache.healthy:
            return left
        drop_near(state)
        return None

    def trusted(self, state: RuntimeState) -> bool:
        """A verdict read now may be kept in the near-cache: a bump after it will reach
        this process as a wake-up (subscription confirmed, Redis healthy)."""
        return self.enabled and self._subscriber.confirmed(state.channel) and self._cache.healthy

    def keep(
        self, state: RuntimeState, version: str, drops: int, read_at: float, ttl: float
    ) -> None:
        """Keep a verdict hit read (or written) under `version`, if nothing dropped the
        near-cache since `drops` was sampled before the read. Its life counts from
        `read_at`, before the read, so it never outlives the key in Redis."""
        if state.near_drops == drops and self.trusted(state):
            state.near_version = version
            state.near_until = read_at + ttl
