"""A runtime's tasks changed in bulk (POST /v1/runtimes/{rt}/tasks:retry and :cancel,
http/handlers/bulk.py), and the most common errors among its recent tasks (GET
/v1/runtimes/{rt}/errors, the console's failing view). Each call is one statement that
changes at most its limit of tasks, each exactly as the single retry or cancel changes
one (sql/fragments.py's transitions), so its cost is bounded whatever the runtime holds.
Nothing here is idempotent by key: a call acts on the tasks that match when it runs.
"""

from __future__ import annotations

from ..api.bulk_bodies import HISTORY_ROWS
from ..rows import BulkChange, ErrorGroup
from .base import StoreBase
from .sql import bulk as sql


class BulkStatements(StoreBase):
    """Bulk retry and cancel of a runtime's tasks, and its error groups."""

    async def retry_matching(
        self, runtime_id: str, status: str, error_prefix: str | None, limit: int
    ) -> BulkChange:
        """Queues again at once up to `limit` of the runtime's `status` tasks (dead,
        expired or cancelled), among its newest HISTORY_ROWS in that status, whose
        last_error starts with
        `error_prefix` (literally, case-sensitively; None: any task), as Store.retry
        does one. The caller bumps the runtime after it, whatever the count (I1, and
        sql.RETRY_MATCHING on the rows it locks and leaves)."""
        row = await self._run(
            lambda c: c.fetchrow(
                sql.RETRY_MATCHING, runtime_id, status, HISTORY_ROWS, error_prefix, limit
            )
        )
        assert row is not None
        return BulkChange(row["n"], row["more"])

    async def cancel_queued(self, runtime_id: str, limit: int) -> BulkChange:
        """Cancels up to `limit` of the runtime's queued tasks (due or not), as
        Store.cancel does a queued one; the answer names them."""
        row = await self._run(lambda c: c.fetchrow(sql.CANCEL_QUEUED, runtime_id, limit))
        assert row is not None
        ids = row["ids"] or []
        return BulkChange(len(ids), row["more"], ids)

    async def error_groups(
        self, runtime_id: str, status: str, limit: int
    ) -> tuple[list[ErrorGroup], int, bool]:
        """The `limit` most common error lines among the runtime's newest HISTORY_ROWS
        tasks in `status`, most common first; how many tasks were read; and
        whether the runtime may hold older ones, which the groups do not count."""
        rows = await self._run(
            lambda c: c.fetch(sql.ERROR_GROUPS, runtime_id, status, HISTORY_ROWS, limit)
        )
        groups = [
            ErrorGroup(r["line"], r["n"], r["last_at"], r["example_id"])
            for r in rows
            if r["line"] is not None
        ]
        read: int = rows[0]["read"]
        return groups, read, read >= HISTORY_ROWS
