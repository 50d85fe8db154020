"""Tasks handed out per runtime by this instance over the last minute, for the runtimes
listing's `claims_per_minute` (gateway/http/handlers/runtimes.py; gateway/redis/parked.py
reports the counts to the other instances).

Memory only, so the claim path pays a dict increment and no round trip: per runtime, a
count per BUCKET_SECONDS bucket of the clock, the last BUCKETS of them summed. The
minute therefore slides in 5 s steps. Buckets older than the window are dropped when
counts are read (every report), so a runtime with no recent claims costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BUCKET_SECONDS = 5.0
BUCKETS = 12  # 12 x 5 s: one minute


class ClaimActivity:
    """Owned by the Claimer (which calls `add`); read by the listing and the reporter.
    `clock` gives seconds (monotonic); tests replace it to pass the minute at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, dict[int, int]] = {}  # runtime -> bucket number -> tasks

    def _now(self) -> int:
        return int(self.clock() // BUCKET_SECONDS)

    def add(self, runtime_id: str, tasks: int) -> None:
        """Count `tasks` handed out now for `runtime_id` (zero is ignored)."""
        if tasks > 0:
            per = self._buckets.setdefault(runtime_id, {})
            now = self._now()
            per[now] = per.get(now, 0) + tasks

    def last_minute(self, runtime_id: str) -> int:
        """Tasks handed out for `runtime_id` in the last minute."""
        oldest = self._now() - BUCKETS + 1
        return sum(n for b, n in self._buckets.get(runtime_id, {}).items() if b >= oldest)

    def counts(self) -> dict[str, int]:
        """Tasks handed out in the last minute, per runtime that has any; drops the
        buckets (and runtimes) that fell out of the window."""
        oldest = self._now() - BUCKETS + 1
        out: dict[str, int] = {}
        for runtime_id, per in list(self._buckets.items()):
            for b in [b for b in per if b < oldest]:
                del per[b]
            if per:
                out[runtime_id] = sum(per.values())
            else:
                del self._buckets[runtime_id]
        return out
