"""The janitor's statements (janitor.py): lease reclaim, promotion of due scheduled
tasks, TTL expiry, retention purge, the finished-task counts' fold, the queue depth, the
repair walk's pages and the task table's vacuum; and its leadership, an advisory lock
held on a connection of its own (`Leadership`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from ..errors import StoreUnavailable
from ..rows import Reclaimed
from .base import DRIVER_ERRORS, StoreBase, log
from .sql import janitor as sql

# How long closing the vacuum's connection may take: long enough to deliver the cancel
# request of a VACUUM cut short, and for Postgres to acknowledge it.
VACUUM_CLOSE_SECONDS = 10.0


@dataclass(frozen=True)
class RuntimePage:
    """A page of the repair walk: the runtimes with a task claimable for over a second,
    and where the next page starts ('' once the walk has reached the end)."""

    claimable: list[str]
    next_after: str
    visited: int  # runtimes with a queued task the page looked at


class JanitorStatements(StoreBase):
    """The janitor's batches, each bounded by its `limit`, and its leadership lock."""

    async def reclaim_leases(self, limit: int) -> list[Reclaimed]:
        """One batch of lapsed leases back to the queue."""
        rows = await self._run(lambda c: c.fetch(sql.RECLAIM_LEASES, limit))
        return [
            Reclaimed(
                r["runtime_id"],
                r["status"],
                r["id"],
                r["lease_id"],
                (r["trace_parent"], r["trace_state"]),
            )
            for r in rows
        ]

    async def promote_scheduled(self, limit: int) -> list[str]:
        """One batch of due scheduled tasks made queued; returns the runtime of each
        task moved. Idempotent: a task moves once, and a locked one waits for the next."""
        rows = await self._run(lambda c: c.fetch(sql.PROMOTE_SCHEDULED, limit))
        return [r["runtime_id"] for r in rows]

    async def expire_tasks(self, limit: int) -> int:
        """One batch of queued or scheduled tasks past expires_at marked expired;
        returns the count."""
        status = await self._run(lambda c: c.execute(sql.EXPIRE_TASKS, limit))
        return int(status.split()[-1])

    async def purge_finished(self, statuses: Sequence[str], age_seconds: float, limit: int) -> int:
        """Delete one batch of finished rows older than age_seconds; returns the count."""
        status = await self._run(
            lambda c: c.execute(sql.PURGE_FINISHED, list(statuses), age_seconds, limit)
        )
        return int(status.split()[-1])

    async def queue_depth(self) -> tuple[dict[str, int], float | None]:
        """(tasks per stored status, age in seconds of the oldest claimable queued task
        or None), in one statement over the live rows and the finished counts."""
        rows = await self._run(lambda c: c.fetch(sql.QUEUE_DEPTH))
        oldest = [r["oldest"] for r in rows if r["oldest"] is not None]
        counts: dict[str, int] = {}
        for r in rows:
            # A scheduled task is a queued one to every reader (EFFECTIVE_STATUS).
            status = "queued" if r["status"] == "scheduled" else r["status"]
            counts[status] = counts.get(status, 0) + r["n"]
        return counts, max(oldest, default=None)

    async def fold_counts(self, limit: int) -> int:
        """Fold up to `limit` per-backend rows of the finished-task counts into one row
        per runtime and status. Idempotent; it skips rows a writer holds, and a writer
        that needs a row being folded waits for this short transaction. Returns how
        many rows it folded into."""

        async def fold_in_tx(c: asyncpg.Connection) -> int:
            async with self._transaction(c):
                rows = await c.fetch(sql.FOLD_TASK_COUNTS, limit)
                zero = [r for r in rows if r["n"] == 0]
                if zero:
                    await c.execute(
                        sql.DROP_ZERO_COUNTS,
                        [r["runtime_id"] for r in zero],
                        [r["status"] for r in zero],
                    )
                return len(rows)

        return await self._run(fold_in_tx)

    async def claimable_runtimes(self, limit: int, after: str = "") -> RuntimePage:
        """One page of the runtimes with a queued task: up to `limit` visited, in id
        order, after `after`."""
        rows = await self._run(lambda c: c.fetch(sql.CLAIMABLE_RUNTIMES, limit, after))
        return RuntimePage(
            claimable=[r["runtime_id"] for r in rows if r["claimable"]],
            next_after=rows[-1]["runtime_id"] if len(rows) == limit else "",
            visited=len(rows),
        )

    async def dead_task_rows(self) -> int:
        """Dead row versions in the task table, as Postgres's statistics count them
        (the count autovacuum goes by); 0 when the statistics have none yet."""
        return int(await self._run(lambda c: c.fetchval(sql.TASKS_DEAD_ROWS)) or 0)

    async def vacuum_tasks(self, timeout_seconds: float) -> bool:
        """`VACUUM (ANALYZE) tasks` on a connection of its own to the lock URL
        (GATEWAY_DIRECT_DATABASE_URL when set), so that no pooled connection is held
        for its duration; closed afterwards. True when it ran; False when another
        VACUUM or ANALYZE of the table was running, and this one skipped.

        Blocks no read or write of the table (sql.VACUUM_TASKS). Bounded by
        `timeout_seconds`: past it, or when the caller is cancelled, the driver sends
        Postgres a cancel request, and the work done so far is kept (the pages already
        cleaned stay clean). Safe to run again at any time."""
        try:
            conn = await self._lock_hosts.connect(
                server_settings={"application_name": "claim-gateway-vacuum"},
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc}") from exc
        skipped: list[str] = []

        def note_skip(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
            if message.sqlstate == sql.LOCK_NOT_AVAILABLE:
                skipped.append(message.message)

        conn.add_log_listener(note_skip)
        try:
            await conn.execute(sql.VACUUM_TASKS, timeout=timeout_seconds)
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"database error: {exc}") from exc
        finally:
            # close() first sends the cancel request a timeout or a cancel asked for, and
            # waits for it (bounded); terminate() would drop that request, and the
            # VACUUM would run on without anyone waiting for it. Shielded: a caller
            # cancelled again meanwhile does not cut it short.
            with contextlib.suppress(Exception):
                await asyncio.shield(conn.close(timeout=VACUUM_CLOSE_SECONDS))
        return not skipped

    async def try_leadership(self, key: int) -> Leadership | None:
        """Advisory lock `key` on a dedicated connection, or None if another process
        holds it. The lock lives as long as that connection: if this process dies,
        Postgres releases it and another instance takes over. The connection goes to
        the lock URL (GATEWAY_DIRECT_DATABASE_URL when set): through a transaction
        pooler a session lock would sit on a server connection others share."""
        try:
            conn = await self._lock_hosts.connect(
                server_settings={"application_name": "claim-gateway-janitor"},
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc}") from exc
        try:
            if await conn.fetchval(sql.JANITOR_TRY_LOCK, key):
                return Leadership(conn, key)
        except DRIVER_ERRORS as exc:
            conn.terminate()
            raise StoreUnavailable(f"database error: {exc}") from exc
        except BaseException:
            # Cancelled (the janitor stopping): a connection left open would keep the
            # lock it may have just taken until the garbage collector found it.
            conn.terminate()
            raise
        await conn.close()
        return None


class Leadership:
    """A held advisory lock. `held()` checks the connection still lives and its backend
    still holds the lock; `release()` resigns (idempotent)."""

    def __init__(self, conn: asyncpg.Connection, key: int) -> None:
        self._conn = conn
        self._key = key

    async def held(self) -> bool:
        if self._conn.is_closed():
            return False
        try:
            holds = await self._conn.fetchval(sql.JANITOR_HOLDS_LOCK, self._key, timeout=5)
        except DRIVER_ERRORS:
            await self.release()
            return False
        if not holds:
            log.error(
                "the janitor's advisory lock is not held by its own connection: the lock "
                "URL goes through a transaction pooler; set GATEWAY_DIRECT_DATABASE_URL "
                "to a URL that reaches Postgres directly"
            )
            await self.release()
            return False
        return True

    async def release(self) -> None:
        if not self._conn.is_closed():
            self._conn.terminate()
