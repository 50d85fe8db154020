"""Parked pollers over the whole fleet, for the runtimes listing (GET /v1/runtimes).

Each instance writes its per-runtime counts of parked claims to Redis every
REPORT_SECONDS: one hash per runtime, `<prefix>:{<rt>}:parked`, field = this instance's
id, value = "<count> <expiry in epoch ms>". A count older than TTL_SECONDS (its instance
stopped or lost Redis) is ignored by readers, and the key itself expires once no
instance refreshes it. The listing adds this instance's own count, live, to the other
instances' reported ones, so a single instance answers exactly as before; without Redis
it answers its own count alone.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from .background import stop_task
from .errors import CacheUnavailable

log = logging.getLogger("gateway.parked")

REPORT_SECONDS = 5.0  # how often an instance writes its counts
TTL_SECONDS = 15.0  # a count not refreshed for this long is ignored: its instance is gone


class ParkedCache(Protocol):
    """What the report needs from Redis (VerdictCache)."""

    async def write_parked(
        self, instance: str, counts: Mapping[str, int], ttl_seconds: float
    ) -> None: ...

    async def read_parked(self, runtime_ids: Sequence[str], exclude: str) -> dict[str, int]: ...


class ParkedReport:
    """This instance's side of the fleet-wide count. Owned by the Gateway; `start()` and
    `stop()` belong to the lifespan. `counts` gives this instance's parked claims per
    runtime (the Claimer's, memory only)."""

    def __init__(self, cache: ParkedCache, counts: Callable[[], dict[str, int]]) -> None:
        self.instance = secrets.token_hex(8)
        self._cache = cache
        self._counts = counts
        self._reported: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def report(self) -> None:
        """Write the counts that are not zero, and a zero for those that just became
        zero (so that readers stop adding them at once); one round trip."""
        now = {rt: n for rt, n in self._counts().items() if n > 0}
        counts = {**dict.fromkeys(self._reported.keys() - now.keys(), 0), **now}
        if counts:
            await self._cache.write_parked(self.instance, counts, TTL_SECONDS)
        self._reported = now

    async def fleet(self, runtime_ids: Sequence[str], here: Mapping[str, int]) -> dict[str, int]:
        """Parked claims per runtime over every instance: `here` (this instance's, live)
        plus the others' last reports. Without Redis, `here` alone."""
        try:
            others = await self._cache.read_parked(runtime_ids, self.instance)
        except CacheUnavailable as exc:
            log.warning("parked pollers of other instances not read: %s", exc.detail)
            others = {}
        return {rt: here.get(rt, 0) + others.get(rt, 0) for rt in runtime_ids}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="parked-report")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task, "parked report")
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.report()
            except CacheUnavailable as exc:
                # Readers ignore the last report once it is TTL_SECONDS old.
                log.debug("parked pollers not reported: %s", exc.detail)
                self._reported = {}
            await asyncio.sleep(REPORT_SECONDS)
