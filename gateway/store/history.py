"""The per-runtime history's statements (docs/guides/history.md): the janitor's rollup
(the bucket width the triggers use, the fold of the per-backend rows, the depth of the
bucket that just ended, retention) and the reads of GET /v1/runtimes/{rt}/history,
GET /v1/history and the listing's sparklines. The counts are written by the triggers of
migration 0015, never from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..rows import DepthPoint, FleetHistory, HistoryPoint, RuntimeDepth, RuntimeFailures
from .base import StoreBase
from .sql import history as sql

# The claim-wait buckets' bounds in seconds, as migration 0015's history_wait_bucket
# has them: a point's `waits` has one count more than bounds, the first for waits under
# WAIT_BOUNDS_SECONDS[0], the last for waits of WAIT_BOUNDS_SECONDS[-1] or more.
WAIT_BOUNDS_SECONDS = (
    0.1,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)


def wait_percentile(waits: Sequence[int], fraction: float) -> float | None:
    """The claim wait in seconds below which `fraction` of the counted claims fell, read
    from the wait buckets: the upper bound of the bucket the claim at that rank is in
    (the last bucket has none: its lower bound, 3600). None when nothing was counted."""
    total = sum(waits)
    if total == 0:
        return None
    rank = max(1, math.ceil(fraction * total))
    seen = 0
    for index, count in enumerate(waits):
        seen += count
        if seen >= rank:
            return WAIT_BOUNDS_SECONDS[min(index, len(WAIT_BOUNDS_SECONDS) - 1)]
    return WAIT_BOUNDS_SECONDS[-1]


# The rollups that retention trims besides task_history (migration 0017).
HISTORY_ROLLUPS = tuple(sql.PURGE_ROLLUPS)
# Top lists over windows longer than this count failures by the hour.
HOUR_SECONDS = 3600


def covers_every_runtime(patterns: Sequence[str] | None) -> bool:
    """True when a token of these runtime patterns covers every runtime: no patterns
    (None, the admin's), or a pattern of `*` alone, which matches any runtime id."""
    return patterns is None or any(p and set(p) == {"*"} for p in patterns)


def _point(r: Any) -> HistoryPoint:
    waits = list(r["waits"])
    return HistoryPoint(
        at=r["at"],
        enqueued=r["enqueued"],
        claimed=r["claimed"],
        completed=r["completed"],
        failed=r["failed"],
        dead=r["dead"],
        expired=r["expired"],
        cancelled=r["cancelled"],
        depth=r["depth"],
        oldest_queued_age_seconds=r["oldest_queued_age_seconds"],
        claim_wait_p50_seconds=wait_percentile(waits, 0.50),
        claim_wait_p95_seconds=wait_percentile(waits, 0.95),
    )


async def fleet_rows(
    c: asyncpg.Connection, seconds: int, covered: list[str] | None
) -> tuple[list[Any], list[Any], list[Any]]:
    """The fleet's three reads of the last `seconds` on `c` (points, deepest runtimes,
    most failing runtimes), from the rollups when `covered` is None (every runtime),
    else from the covered runtimes' own rows; over more than an hour, the failures in
    whole hours. The caller holds the transaction."""
    hourly = seconds > HOUR_SECONDS
    if covered is None:
        points = await c.fetch(sql.FLEET_POINTS, seconds)
        failing = await c.fetch(sql.HOURLY_FAILURES if hourly else sql.TOP_BY_FAILURES, seconds)
    else:
        points = await c.fetch(sql.COVERED_POINTS, seconds, covered)
        top = sql.COVERED_HOURLY_FAILURES if hourly else sql.COVERED_FAILURES
        failing = await c.fetch(top, seconds, covered)
    deepest = await c.fetch(sql.TOP_BY_DEPTH, seconds, covered)
    return points, deepest, failing


class HistoryStatements(StoreBase):
    """The rollup's bounded batches (idempotent: each may run again, from any
    instance) and the history's reads."""

    async def set_history_interval(self, seconds: int) -> None:
        """Makes the triggers count into buckets of `seconds` from their next statement
        on. Buckets already written keep their width."""
        await self._run(lambda c: c.execute(sql.SET_INTERVAL, seconds))

    async def fold_history(self, limit: int) -> int:
        """Folds up to `limit` per-backend rows of ended buckets, and adds them to the
        rollups (the fleet's buckets, the runtimes' hourly failures and last buckets);
        returns how many rows it moved."""
        moved: int = await self._run(lambda c: c.fetchval(sql.FOLD, limit))
        return moved

    async def fill_history_depth(self, limit: int) -> int:
        """Writes the depth of up to `limit` runtimes with activity in the bucket that
        has just ended, into their folded rows, the bucket's fleet row and the runtimes'
        last depths; returns how many."""
        filled: int = await self._run(lambda c: c.fetchval(sql.FILL_DEPTH, limit))
        return filled

    async def purge_history(self, days: int, limit: int) -> int:
        """Deletes up to `limit` rows of buckets older than `days`; returns how many."""
        status: str = await self._run(lambda c: c.execute(sql.PURGE, days, limit))
        return int(status.split()[-1])

    async def purge_history_rollup(self, rollup: str, days: int, limit: int) -> int:
        """Deletes up to `limit` rows older than `days` of one of HISTORY_ROLLUPS;
        returns how many."""
        statement = sql.PURGE_ROLLUPS[rollup]
        status: str = await self._run(lambda c: c.execute(statement, days, limit))
        return int(status.split()[-1])

    async def runtime_history(self, runtime_id: str, seconds: int) -> list[HistoryPoint]:
        """The runtime's points of the last `seconds`, oldest first; only buckets with
        activity."""
        rows = await self._run(lambda c: c.fetch(sql.RUNTIME_POINTS, runtime_id, seconds))
        return [_point(r) for r in rows]

    async def fleet_history(self, seconds: int, patterns: Sequence[str] | None) -> FleetHistory:
        """The points of the last `seconds` summed over the runtimes `patterns` cover
        (None: every runtime), and the top 10 of those runtimes by depth and by
        failures: three statements in one transaction, so that they read one window
        (one now()), with JIT off (sql.NO_JIT).

        When the patterns cover every runtime, the points are the fleet's rollup and
        the failures over more than an hour its hourly rollup: the cost follows the
        window's buckets. Otherwise only the covered runtimes' own rows are read, so
        nothing of another runtime reaches the answer. Over more than an hour, the
        failures are counted in whole hours (UTC), from the one the window begins in."""
        covered = None if covers_every_runtime(patterns) else list(patterns or ())

        async def read(c: asyncpg.Connection) -> FleetHistory:
            async with self._transaction(c):
                await c.execute(sql.NO_JIT)
                points, deepest, failing = await fleet_rows(c, seconds, covered)
            return FleetHistory(
                [_point(r) for r in points],
                [RuntimeDepth(r["runtime_id"], r["depth"]) for r in deepest],
                [RuntimeFailures(r["runtime_id"], r["failed"], r["dead"]) for r in failing],
            )

        return await self._run(read)

    async def depth_sparklines(
        self, runtime_ids: Sequence[str], seconds: int
    ) -> dict[str, list[DepthPoint]]:
        """Each runtime's depth points of the last `seconds`, oldest first (a runtime
        with none is absent): one statement for them all."""
        if not runtime_ids:
            return {}
        rows = await self._run(lambda c: c.fetch(sql.SPARKLINES, list(runtime_ids), seconds))
        out: dict[str, list[DepthPoint]] = {}
        for r in rows:
            out.setdefault(r["runtime_id"], []).append(DepthPoint(r["at"], r["depth"]))
        return out
