"""Requests this process refused before doing any work, per reason, over the last
minutes: what the console shows an operator after a GatewayShedding alert
(GET /v1/instance/load). Prometheus has the same counts, for ever, in
`gateway_shed_total{reason}`.

Memory only, so that a refusal, which must cost as little as it can under a flood, pays
a clock read and a dict increment: a count per reason per BUCKET_SECONDS of the wall
clock, the last WINDOW_MINUTES of them kept. Buckets older than that are dropped when a
new one starts, so a process that sheds nothing keeps nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

BUCKET_SECONDS = 10
WINDOW_MINUTES = 10
PER_MINUTE = 60 // BUCKET_SECONDS


class Minute(NamedTuple):
    """One minute of the clock: its start (epoch seconds) and its refusals by reason."""

    start: int
    counts: dict[str, int]


class Refusals:
    """Owned by the database line (gateway/admission.py), which counts every refusal
    here as it counts it in `gateway_shed_total`. `clock` gives epoch seconds; tests
    replace it."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._buckets: dict[int, dict[str, int]] = {}  # bucket number -> reason -> count

    def add(self, reason: str, count: int = 1) -> None:
        """Count `count` requests refused now for `reason`."""
        now = int(self.clock() // BUCKET_SECONDS)
        counts = self._buckets.get(now)
        if counts is None:
            counts = self._buckets[now] = {}
            oldest = now - WINDOW_MINUTES * PER_MINUTE
            for old in [b for b in self._buckets if b <= oldest]:
                del self._buckets[old]
        counts[reason] = counts.get(reason, 0) + count

    def last_minute(self) -> dict[str, int]:
        """Refusals by reason over the last 60 seconds (sliding in BUCKET_SECONDS steps)."""
        now = int(self.clock() // BUCKET_SECONDS)
        return _sum(counts for b, counts in self._buckets.items() if b > now - PER_MINUTE)

    def per_minute(self) -> list[Minute]:
        """Each of the last WINDOW_MINUTES minutes of the clock, oldest first: the last one
        is the current minute, so far. A minute without refusals has empty counts."""
        now = int(self.clock() // BUCKET_SECONDS)
        current = now // PER_MINUTE
        minutes = range(current - WINDOW_MINUTES + 1, current + 1)
        by_minute: dict[int, list[dict[str, int]]] = {m: [] for m in minutes}
        for bucket, counts in self._buckets.items():
            if bucket // PER_MINUTE in by_minute:
                by_minute[bucket // PER_MINUTE].append(counts)
        return [Minute(m * 60, _sum(by_minute[m])) for m in minutes]


def _sum(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in parts:
        for reason, n in counts.items():
            total[reason] = total.get(reason, 0) + n
    return total


def held_back(refused: int) -> str:
    """The end of a throttled warning about refusals (logs.Throttle): how many more were
    refused since the last one, or nothing when none was (as for the first)."""
    return f" ({refused} more refused since the last warning)" if refused else ""
