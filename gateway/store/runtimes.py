"""The runtimes listing's reads (GET /v1/runtimes, the console;
http/handlers/runtimes.py): the runtimes that hold tasks or have controls, a page at a
time, and their live counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .base import StoreBase
from .sql import runtimes as sql


@dataclass(frozen=True, slots=True)
class RuntimeSummary:
    """One runtime's live counts: `queued` includes scheduled (not yet due) tasks and
    excludes expired ones; the age is in seconds, None when no queued task is due."""

    runtime_id: str
    queued: int
    claimed: int
    oldest_queued_age_seconds: float | None
    dead: int = 0  # finished dead, from task_counts (not a count of the history)


class RuntimeListStatements(StoreBase):
    """The listing's two reads: a page of runtime ids, then the counts of that page."""

    async def walk_runtimes(
        self, after: str, limit: int, prefixes: Sequence[str] | None = None
    ) -> list[str]:
        """Up to `limit` runtime ids after `after`, in id order, that hold tasks (live,
        or finished and still stored) or have controls set, from the smallest of
        `prefixes` on (None: from the start). Reads the live rows' partial indexes, the
        finished-task counters and the controls, never the history."""
        starts = None if prefixes is None else list(prefixes)
        rows = await self._run(lambda c: c.fetch(sql.RUNTIMES_WALK, after, limit, starts))
        return [r["runtime_id"] for r in rows]

    async def summarize_runtimes(self, runtime_ids: Sequence[str]) -> list[RuntimeSummary]:
        """Live counts for each of `runtime_ids`, in id order."""
        if not runtime_ids:
            return []
        rows = await self._run(lambda c: c.fetch(sql.RUNTIMES_SUMMARY, list(runtime_ids)))
        return [
            RuntimeSummary(
                r["runtime_id"],
                r["queued"],
                r["claimed"],
                r["oldest_queued_age_seconds"],
                r["dead"],
            )
            for r in rows
        ]
