"""Batch lease operations (batch.py; completions.py for grouped completes): complete,
fail and heartbeat many tasks, each in one statement whatever the batch's size, and
`ItemResult`, one item's outcome. An item that fails never fails the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..rows import ItemResult
from .base import Row, StoreBase
from .leases import COMPLETE_REPLAYS, item_results
from .sql import acks as sql


class BatchAckStatements(StoreBase):
    """Each operation per item, as the single one. `task_ids` are distinct (the parser
    refuses a repeat). `runtimes`: the caller's runtime patterns, None for every
    runtime; a task outside them is NotFound, as for a single operation."""

    async def complete_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        results: Sequence[str | None],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]:
        """complete, per item; idempotent per item for the same lease, as complete."""
        args = _complete_args(task_ids, lease_ids, results, runtimes)
        rows = await self._run(lambda c: c.fetch(sql.BATCH_COMPLETE, *args))
        return item_results(task_ids, lease_ids, rows, replay_statuses=COMPLETE_REPLAYS)

    async def fail_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        errors: Sequence[str],
        retries: Sequence[bool],
        retry_after_seconds: Sequence[float | None],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]:
        """fail, per item."""
        args = _fail_args(task_ids, lease_ids, errors, retries, retry_after_seconds, runtimes)
        rows = await self._run(lambda c: c.fetch(sql.BATCH_FAIL, *args))
        return item_results(task_ids, lease_ids, rows)

    async def complete_and_fail_many(
        self, completes: CompleteItems, fails: FailItems, runtimes: Sequence[str] | None
    ) -> tuple[list[ItemResult], list[ItemResult]]:
        """complete_many and fail_many in one transaction (a claim's acknowledgements):
        both are applied, or neither. Their items name distinct tasks."""
        complete_args = _complete_args(*completes, runtimes)
        fail_args = _fail_args(*fails, runtimes)

        async def both_in_tx(conn: asyncpg.Connection) -> tuple[list[Row], list[Row]]:
            async with self._transaction(conn):
                done = await conn.fetch(sql.BATCH_COMPLETE, *complete_args)
                failed = await conn.fetch(sql.BATCH_FAIL, *fail_args)
            return done, failed

        done, failed = await self._run(both_in_tx)
        return (
            item_results(completes[0], completes[1], done, replay_statuses=COMPLETE_REPLAYS),
            item_results(fails[0], fails[1], failed),
        )

    async def heartbeat_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        lease_seconds: Sequence[int],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]:
        """heartbeat, per item: each lease runs out its own lease_seconds from now."""
        seconds = [float(n) for n in lease_seconds]
        args = (list(task_ids), _patterns(runtimes), list(lease_ids), seconds)
        rows = await self._run(lambda c: c.fetch(sql.BATCH_HEARTBEAT, *args))
        return item_results(task_ids, lease_ids, rows)


# complete_many's items, column by column: task ids, lease ids, results (JSON text).
CompleteItems = tuple[Sequence[uuid.UUID], Sequence[uuid.UUID], Sequence[str | None]]
# fail_many's: task ids, lease ids, errors, retry flags, retry delays in seconds.
FailItems = tuple[
    Sequence[uuid.UUID], Sequence[uuid.UUID], Sequence[str], Sequence[bool], Sequence[float | None]
]


def _patterns(runtimes: Sequence[str] | None) -> list[str] | None:
    return None if runtimes is None else list(runtimes)


def _complete_args(
    task_ids: Sequence[uuid.UUID],
    lease_ids: Sequence[uuid.UUID],
    results: Sequence[str | None],
    runtimes: Sequence[str] | None,
) -> tuple[Any, ...]:
    """sql.BATCH_COMPLETE's arguments."""
    return (list(task_ids), _patterns(runtimes), list(lease_ids), list(results))


def _fail_args(
    task_ids: Sequence[uuid.UUID],
    lease_ids: Sequence[uuid.UUID],
    errors: Sequence[str],
    retries: Sequence[bool],
    retry_after_seconds: Sequence[float | None],
    runtimes: Sequence[str] | None,
) -> tuple[Any, ...]:
    """sql.BATCH_FAIL's arguments."""
    return (
        list(task_ids),
        _patterns(runtimes),
        list(lease_ids),
        list(errors),
        list(retries),
        list(retry_after_seconds),
    )
