"""Lease statements: the claim (CLAIM, run again wider when other claims hold its
candidates), and one task's operations under its lease: heartbeat, complete (alone, or
grouped by completions.py), fail, release, bury, and unclaim for leases never
delivered. An operation whose lease no longer holds the task is refused with
LeaseLost (`lease_lost`, which the batch operations of store/acks.py share).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import orjson

from ..errors import LeaseLost, NotFound, StoreUnavailable
from ..rows import CarriedCompletes, ItemResult, Leased, TaskRow
from .base import Row
from .sql import leases as sql
from .tasks import TaskStatements

# CLAIM reads at most this many candidates beyond the slots wanted from each source
# (queued, due scheduled); candidates that other claims hold count against it. When it
# runs out with slots left, the claim runs again with a window this many times wider,
# at most CLAIM_ROUNDS times in all; then the poll checks again after
# CONTENDED_RECHECK_SECONDS instead of trusting an empty verdict.
CLAIM_WINDOW = 50
CLAIM_WINDOW_GROWTH = 20
CLAIM_ROUNDS = 3
CONTENDED_RECHECK_SECONDS = 0.05
# The statuses a repeated complete by the same lease is answered with, as the first was.
COMPLETE_REPLAYS = ("completed", "cancelled")


def lease_lost(task_id: uuid.UUID, lease_id: uuid.UUID, status: str) -> LeaseLost:
    """The refusal of a lease operation whose lease no longer holds the task (I7), the
    same for a single operation and for a batch's item."""
    return LeaseLost(
        f"lease {lease_id} does not hold task {task_id} (status {status}); "
        "it expired and the task was claimed again, or it was already reported",
        task_status=status,
    )


class LeaseStatements(TaskStatements):
    """The claim and the single lease operations. On the task statements: an operation
    that changed nothing reads the task (`get`) to tell why."""

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> tuple[list[Leased], float | None]:
        """Lease up to len(worker_ids) tasks, sorted by slot (1-based: whose each is).

        When fewer than wanted were found, also returns the seconds until the next
        delayed task of the runtime comes due (None if none), measured from the scan's
        own instant (same statement), for the verdict's TTL (I4).

        One statement in one round trip, outside any explicit transaction. It is
        bounded by the driver's timeout (the pool's command_timeout, the statement
        timeout setting), which on expiry sends Postgres a cancel request (PgBouncer
        forwards it), so a slow claim stops on the server too. Only when other claims
        hold more rows than its candidate window does it run again, wider, for the
        slots left (CLAIM's `more`).
        """
        leased, due_in, _ = await self._claim_rounds(runtime_id, worker_ids, lease_seconds, None)
        return leased, due_in

    async def claim_acked(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        completes: CarriedCompletes,
    ) -> tuple[list[Leased], float | None, list[ItemResult]]:
        """`claim`, whose first statement also applies `completes` (those the claims it
        serves carry), so that they commit together: the leases, the seconds until the
        next due task, and each complete's outcome, in the items' order, as
        complete_many answers them. A StoreUnavailable applied nothing. Idempotent per
        complete for the same lease, as complete_many."""
        return await self._claim_rounds(runtime_id, worker_ids, lease_seconds, completes)

    async def _claim_rounds(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        completes: CarriedCompletes | None,
    ) -> tuple[list[Leased], float | None, list[ItemResult]]:
        if worker_ids:  # (without, it only applies the completes)
            self._metrics.pg_claims.inc()
        leased: list[Leased] = []
        outcomes: list[ItemResult] = []
        due_in: float | None = None
        window = len(worker_ids) + CLAIM_WINDOW
        with self._metrics.claim_seconds.time():
            for round_ in range(CLAIM_ROUNDS):
                done = len(leased)
                acks = completes if round_ == 0 else None
                try:
                    result = await self._claim_once(
                        runtime_id, worker_ids[done:], lease_seconds[done:], window, acks
                    )
                except StoreUnavailable:
                    if round_ == 0:
                        raise
                    # The leases already taken are delivered; the poll checks again soon.
                    due_in = CONTENDED_RECHECK_SECONDS
                    break
                if acks is not None:
                    answered = orjson.loads(result[0]["acks"] or "[]")
                    outcomes = item_results(
                        acks.task_ids, acks.lease_ids, answered, COMPLETE_REPLAYS
                    )
                # With nothing leased, the statement's one row carries only due_in.
                rows = [r for r in result if r["slot"] is not None]
                leased.extend(Leased(done + r["slot"], TaskRow.of(r)) for r in rows)
                if len(leased) == len(worker_ids):
                    due_in = None
                    break
                due_in = result[0]["due_in"]
                if not result[0]["more"]:
                    break
                if round_ == CLAIM_ROUNDS - 1:
                    # Rows other claims hold may come free: no long empty verdict.
                    due_in = CONTENDED_RECHECK_SECONDS
                window *= CLAIM_WINDOW_GROWTH
        self._metrics.tasks_claimed.inc(len(leased))
        return sorted(leased, key=lambda x: x.slot), due_in, outcomes

    async def _claim_once(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        window: int,
        completes: CarriedCompletes | None = None,
    ) -> list[Row]:
        return await self._run(
            lambda c: self._claim_on(c, runtime_id, worker_ids, lease_seconds, window, completes)
        )

    async def _claim_on(
        self,
        c: asyncpg.Connection,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        window: int,
        completes: CarriedCompletes | None = None,
    ) -> list[Row]:
        """CLAIM's rows (CLAIM_ACKED's, with `completes`), on a connection the caller
        holds: a pooled one of its own (`_claim_once`), or a limited runtime's
        transaction (`claim_limited`)."""
        args = [runtime_id, list(worker_ids), list(lease_seconds), window]
        if completes is None:
            rows: list[Row] = await c.fetch(sql.CLAIM, *args)
        else:
            # Each item's patterns as one text (a pattern holds no space).
            patterns = [None if r is None else " ".join(r) for r in completes.runtimes]
            acks = (list(completes.task_ids), list(completes.lease_ids), list(completes.results))
            rows = await c.fetch(sql.CLAIM_ACKED, *args, *acks, patterns)
        return rows

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        """Give back leases that were never delivered, each task by its lease;
        idempotent. Returns the ids of the tasks given back."""
        args = (list(task_ids), list(lease_ids))
        rows: list[Row] = await self._run(lambda c: c.fetch(sql.UNCLAIM, *args))
        self._metrics.unclaimed.inc(len(rows))
        return [r["id"] for r in rows]

    async def bury(self, task_id: uuid.UUID, lease_id: uuid.UUID, reason: str) -> None:
        """End a claimed task `dead` with `reason`, if `lease_id` still holds it."""
        await self._run(lambda c: c.execute(sql.BURY, task_id, lease_id, reason))

    async def _lease_op(
        self,
        query: str,
        task_id: uuid.UUID,
        lease_id: uuid.UUID,
        *args: Any,
    ) -> TaskRow:
        row = await self._run(lambda c: c.fetchrow(query, task_id, lease_id, *args))
        if row is not None:
            return TaskRow.of(row)
        current = await self.get(task_id)
        raise lease_lost(task_id, lease_id, current.status)

    async def heartbeat(
        self, task_id: uuid.UUID, lease_id: uuid.UUID, lease_seconds: int
    ) -> TaskRow:
        return await self._lease_op(sql.HEARTBEAT, task_id, lease_id, float(lease_seconds))

    async def complete(
        self, task_id: uuid.UUID, lease_id: uuid.UUID, result: str | None
    ) -> TaskRow:
        """One task's complete in a statement of its own; idempotent for the same lease
        (a repeat returns the finished task). The gateway's requests go through
        completions.py instead, grouped (complete_group, then complete_missed); this
        is for the tools and tests that measure or drive one statement."""
        row = await self._run(lambda c: c.fetchrow(sql.COMPLETE, task_id, lease_id, result))
        if row is not None:
            return TaskRow.of(row)
        return await self.complete_missed(task_id, lease_id)

    # Single completes go through completions.py, grouped: complete_group, then
    # complete_missed for those the statement did not apply.

    async def complete_group(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        results: Sequence[str | None],
    ) -> dict[uuid.UUID, TaskRow]:
        """Complete several tasks, each held by its lease, in one statement (one
        commit): the tasks it completed (or ended cancelled), by id. Task ids must be
        distinct. A task missing from the answer was not changed: `complete_missed`
        tells why."""
        args = (list(task_ids), list(lease_ids), list(results))
        rows = await self._run(lambda c: c.fetch(sql.COMPLETE_GROUP, *args))
        return {r["id"]: TaskRow.of(r) for r in rows}

    async def complete_missed(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow:
        """For a complete that changed nothing: the finished task when this lease
        already completed it (a repeat is answered as the first was), else LeaseLost
        (the lease no longer holds it) or NotFound."""
        current = await self.get(task_id)
        if current.status in COMPLETE_REPLAYS and current.lease_id == lease_id:
            return current
        raise lease_lost(task_id, lease_id, current.status)

    async def fail(
        self,
        task_id: uuid.UUID,
        lease_id: uuid.UUID,
        error: str,
        retry: bool,
        retry_after_seconds: float | None,
    ) -> TaskRow:
        return await self._lease_op(sql.FAIL, task_id, lease_id, error, retry, retry_after_seconds)

    async def release(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow:
        return await self._lease_op(sql.RELEASE, task_id, lease_id)


def item_results(
    task_ids: Sequence[uuid.UUID],
    lease_ids: Sequence[uuid.UUID],
    rows: Sequence[Mapping[str, Any]],
    replay_statuses: tuple[str, ...] = (),
) -> list[ItemResult]:
    """A batch statement's answer rows (sql.acks.BATCH_ANSWER, in item order) classified
    as _lease_op classifies a single operation's outcome. An item with no row (its task
    was deleted while the statement waited for its lock) is not found."""
    by_ord = {r["ord"]: r for r in rows}
    out = []
    for ord_, task_id in enumerate(task_ids, start=1):
        r = by_ord.get(ord_)
        runtime_id = None if r is None else r["found_runtime"]
        if r is None or runtime_id is None:
            out.append(ItemResult(task_id, None, None, NotFound(f"no task with id {task_id}")))
            continue
        status = r["new_status"]
        if status is not None:
            out.append(
                ItemResult(
                    task_id,
                    runtime_id,
                    status,
                    run_at=r.get("new_run_at"),
                    lease_expires_at=r.get("new_lease_expires_at"),
                    cancel_requested=bool(r.get("new_cancel_requested")),
                    lease_id=lease_ids[ord_ - 1],
                )
            )
        elif r["found_status"] in replay_statuses and r["found_lease"] == r["item_lease"]:
            out.append(ItemResult(task_id, runtime_id, r["found_status"]))
        else:
            error = lease_lost(task_id, r["item_lease"], r["found_status"])
            out.append(ItemResult(task_id, runtime_id, r["found_status"], error))
    return out
