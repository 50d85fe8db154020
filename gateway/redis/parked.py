"""Parked pollers over the whole fleet, for the runtimes listing (GET /v1/runtimes).

Each instance writes its per-runtime counts of parked claims to Redis every
REPORT_SECONDS: one hash per runtime, `<prefix>:{<rt>}:parked`, field = this instance's
id, value = "<count> <expiry in epoch ms>". A count older than TTL_SECONDS (its instance
stopped or lost Redis) is ignored by readers, and the key itself expires once no
instance refreshes it. The listing adds this instance's own count, live, to the other
instances' reported ones, so a single instance answers exactly as before; without Redis
it answers its own count alone.

The same report carries, in a second field per instance, the tasks the instance handed
out in the last minute (gateway/claim/activity.py), read the same way for the listing's
`claims_per_minute`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from ..background import stop_task
from ..errors import CacheUnavailable

log = logging.getLogger("gateway.parked")

REPORT_SECONDS = 5.0  # how often an instance writes its counts
TTL_SECONDS = 15.0  # a count not refreshed for this long is ignored: its instance is gone


class ParkedCache(Protocol):
    """What the report needs from Redis (VerdictCache)."""

    async def write_parked(
        self,
        instance: str,
        counts: Mapping[str, int],
        ttl_seconds: float,
        claims: Mapping[str, int] | None = None,
    ) -> None: ...

    async def read_parked(
        self, runtime_ids: Sequence[str], exclude: str
    ) -> tuple[dict[str, int], dict[str, int]]: ...


class Fleet(NamedTuple):
    """Per runtime, over every instance: parked claims, tasks handed out in the last
    minute."""

    parked: dict[str, int]
    claims: dict[str, int]


class ParkedReport:
    """This instance's side of the fleet-wide count. Owned by the Gateway; `start()` and
    `stop()` belong to the lifespan. `counts` gives this instance's parked claims per
    runtime (the Claimer's, memory only); `claims` the tasks it handed out per runtime
    in the last minute (gateway/claim/activity.py, only runtimes with some)."""

    def __init__(
        self,
        cache: ParkedCache,
        counts: Callable[[], dict[str, int]],
        claims: Callable[[], dict[str, int]] = dict,
    ) -> None:
        self.instance = secrets.token_hex(8)
        self._cache = cache
        self._counts = counts
        self._claims = claims
        self._reported: dict[str, int] = {}
        self._reported_claims: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def report(self) -> None:
        """Write the counts that are not zero, and a zero for those that just became
        zero (so that readers stop adding them at once); one round trip."""
        now = {rt: n for rt, n in self._counts().items() if n > 0}
        counts = {**dict.fromkeys(self._reported.keys() - now.keys(), 0), **now}
        tasks = {rt: n for rt, n in self._claims().items() if n > 0}
        claims = {**dict.fromkeys(self._reported_claims.keys() - tasks.keys(), 0), **tasks}
        if counts or claims:
            await self._cache.write_parked(self.instance, counts, TTL_SECONDS, claims)
        self._reported = now
        self._reported_claims = tasks

    async def fleet(
        self,
        runtime_ids: Sequence[str],
        here: Mapping[str, int],
        claims_here: Mapping[str, int] | None = None,
    ) -> Fleet:
        """Parked claims and last-minute tasks per runtime over every instance: `here`
        and `claims_here` (this instance's, live) plus the others' last reports. Without
        Redis, this instance's alone."""
        try:
            parked, claims = await self._cache.read_parked(runtime_ids, self.instance)
        except CacheUnavailable as exc:
            log.warning("parked pollers of other instances not read: %s", exc.detail)
            parked, claims = {}, {}
        mine = claims_here or {}
        return Fleet(
            {rt: here.get(rt, 0) + parked.get(rt, 0) for rt in runtime_ids},
            {rt: mine.get(rt, 0) + claims.get(rt, 0) for rt in runtime_ids},
        )

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
                self._reported_claims = {}
            await asyncio.sleep(REPORT_SECONDS)
