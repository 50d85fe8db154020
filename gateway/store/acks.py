"""Batch lease operations (batch.py; completions.py for grouped completes): complete,
fail and heartbeat many tasks, each in one statement whatever the batch's size, and
`ItemResult`, one item's outcome. An item that fails never fails the others.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..errors import NotFound
from ..rows import ItemResult
from .base import Row, StoreBase
from .leases import COMPLETE_REPLAYS, lease_lost
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
        return _item_results(task_ids, rows, replay_statuses=COMPLETE_REPLAYS)

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
        return _item_results(task_ids, rows)

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
            _item_results(completes[0], done, replay_statuses=COMPLETE_REPLAYS),
            _item_results(fails[0], failed),
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
        return _item_results(task_ids, rows)


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


def _item_results(
    task_ids: Sequence[uuid.UUID], rows: Sequence[Row], replay_statuses: tuple[str, ...] = ()
) -> list[ItemResult]:
    """A batch statement's answer rows (sql._BATCH_ANSWER, in item order) classified
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
                )
            )
        elif r["found_status"] in replay_statuses and r["found_lease"] == r["item_lease"]:
            out.append(ItemResult(task_id, runtime_id, r["found_status"]))
        else:
            error = lease_lost(task_id, r["item_lease"], r["found_status"])
            out.append(ItemResult(task_id, runtime_id, r["found_status"], error))
    return out
