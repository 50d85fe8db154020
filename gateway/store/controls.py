"""Runtime controls (gateway/claim/controls.py) in Postgres: reading and storing them, and the claim
of a runtime with limits (`claim_limited`), which leases in the same transaction that
locks the runtime's control row and spends its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import asyncpg

from ..rows import Controls, ControlsChange, Leased, LimitedClaim, TaskRow
from .leases import CLAIM_WINDOW, CONTENDED_RECHECK_SECONDS, LeaseStatements
from .sql import controls as sql

# How long a pump holds a runtime at its max_in_flight before it claims again without a
# wake-up (seconds). A freed slot wakes it at once; this only bounds a lost wake-up.
HELD_RECHECK_SECONDS = 5.0


def refill_wait_seconds(tokens: float, rate: float) -> float:
    """Seconds until a bucket holding `tokens` (< 1) at `rate` per second holds one."""
    return max((1.0 - tokens) / rate, 0.001) if rate > 0 else math.inf


class ControlStatements(LeaseStatements):
    """On the lease statements: a runtime without a control row is claimed as usual
    (`claim`)."""

    async def all_controls(self) -> list[Controls]:
        """Every runtime's stored controls (one statement; a row per controlled runtime)."""
        rows = await self._run(lambda c: c.fetch(sql.ALL_CONTROLS))
        return [Controls.of(r) for r in rows]

    async def get_controls(self, runtime_id: str) -> Controls | None:
        row = await self._run(lambda c: c.fetchrow(sql.GET_CONTROLS, runtime_id))
        return None if row is None else Controls.of(row)

    async def set_controls(self, runtime_id: str, change: ControlsChange) -> Controls:
        """Store a change of the runtime's controls; idempotent. Returns them all."""
        args = (
            runtime_id,
            change.paused,
            change.max_in_flight,
            change.claims_per_second,
            change.paused is not None,
            change.sets_max_in_flight,
            change.sets_claims_per_second,
            change.paused_reason,
            change.paused_until,
        )
        row = await self._run(lambda c: c.fetchrow(sql.SET_CONTROLS, *args))
        return Controls.of(row)

    async def claim_limited(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> LimitedClaim:
        """The claim of a runtime with a max_in_flight or claims_per_second: one
        transaction that locks the runtime's control row (so its claims run one at a
        time on every instance), leases at most what the limits leave, and takes a
        token per leased task. A runtime without a control row is claimed as usual."""

        async def claim_in_tx(c: asyncpg.Connection) -> LimitedClaim | None:
            async with self._transaction(c):
                ctl = await c.fetchrow(sql.CONTROLS_REFILL, runtime_id)
                if ctl is None:
                    return None
                if ctl["paused"]:
                    return LimitedClaim([], None, HELD_RECHECK_SECONDS)
                allowed, held = len(worker_ids), None
                if ctl["max_in_flight"] is not None:
                    leased_now = await c.fetchval(sql.CONTROLS_IN_FLIGHT, runtime_id)
                    if ctl["max_in_flight"] - leased_now < allowed:
                        allowed, held = ctl["max_in_flight"] - leased_now, HELD_RECHECK_SECONDS
                rate, tokens = ctl["claims_per_second"], ctl["tokens"]
                if rate is not None and math.floor(tokens) < allowed:
                    allowed = math.floor(tokens)
                    held = refill_wait_seconds(tokens - allowed, rate)
                if allowed <= 0:
                    return LimitedClaim([], None, held)
                result = await self._claim_on(
                    c,
                    runtime_id,
                    worker_ids[:allowed],
                    lease_seconds[:allowed],
                    allowed + CLAIM_WINDOW,
                )
                rows = [Leased(r["slot"], TaskRow.of(r)) for r in result if r["slot"] is not None]
                if rate is not None and rows:
                    await c.execute(sql.CONTROLS_SPEND, runtime_id, float(len(rows)))
                due_in = None
                if len(rows) < allowed:
                    # Fewer than the limits allowed: the runtime ran out of claimable work,
                    # so this is an ordinary empty scan (other claims' rows: look again soon).
                    due_in = CONTENDED_RECHECK_SECONDS if result[0]["more"] else result[0]["due_in"]
                    held = None
                return LimitedClaim(sorted(rows, key=lambda x: x.slot), due_in, held)

        with self._metrics.claim_seconds.time():
            limited = await self._run(claim_in_tx)
        if limited is None:
            rows, due_in = await self.claim(runtime_id, worker_ids, lease_seconds)
            return LimitedClaim(rows, due_in, None)
        self._metrics.pg_claims.inc()
        self._metrics.tasks_claimed.inc(len(limited.rows))
        return limited
