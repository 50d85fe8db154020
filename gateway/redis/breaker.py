"""The circuit breaker every Redis call goes through: after repeated errors Redis is
skipped for a while, then probed, so that a hung Redis costs a claim nothing (I5)."""

from __future__ import annotations

import time
from collections.abc import Callable


class CircuitBreaker:
    """Opens after `failures` consecutive errors; while open, Redis is skipped for
    `open_seconds`, then one call is let through to probe it."""

    def __init__(
        self, failures: int, open_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.open_seconds = open_seconds
        self._clock = clock
        self._errors = 0
        self._open_until = 0.0

    @property
    def consecutive_failures(self) -> int:
        return self._errors

    @property
    def is_open(self) -> bool:
        return self._errors >= self.failures and self._clock() < self._open_until

    def allow(self) -> bool:
        if self._errors < self.failures:
            return True
        if self._clock() >= self._open_until:
            # Half-open: let this call probe; another failure re-opens at once.
            self._open_until = self._clock() + self.open_seconds
            return True
        return False

    def record_success(self) -> None:
        self._errors = 0

    def record_failure(self) -> None:
        self._errors += 1
        if self._errors >= self.failures:
            self._open_until = self._clock() + self.open_seconds
