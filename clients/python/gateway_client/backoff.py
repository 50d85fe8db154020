"""Full-jitter exponential backoff (a random delay between a floor and the capped
exponential), which spreads a fleet's retries instead of synchronising them."""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_SECONDS = 0.5
CAP_SECONDS = 30.0
# A pause is never shorter than this, so that a run of failures cannot spin the loop.
FLOOR_SECONDS = 0.05


class Backoff:
    """`next_delay()` after each failure, `reset()` after a success."""

    def __init__(
        self,
        base_seconds: float = BASE_SECONDS,
        cap_seconds: float = CAP_SECONDS,
        floor_seconds: float = FLOOR_SECONDS,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base_seconds = base_seconds
        self.cap_seconds = cap_seconds
        self.floor_seconds = floor_seconds
        self.failures = 0
        self._rng = rng

    def next_delay(self, retry_after_seconds: float | None = None) -> float:
        """Seconds to wait before the next try. A server's Retry-After is honoured:
        the pause is at least that long (capped, so a bad header cannot stall us)."""
        self.failures += 1
        ceiling = min(self.cap_seconds, self.base_seconds * 2.0 ** min(self.failures, 32))
        delay = max(self.floor_seconds, self._rng() * ceiling)
        if retry_after_seconds is not None:
            delay = max(delay, min(retry_after_seconds, self.cap_seconds * 10))
        return delay

    def reset(self) -> None:
        self.failures = 0
