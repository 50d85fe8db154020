"""The Postgres side: a pool and one method per named query.

Owns the asyncpg pool. asyncpg and socket errors are translated here into
StoreUnavailable; nothing above this module sees a driver exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn, TypeAlias, TypeVar

import asyncpg
import orjson
from asyncpg.pgproto.pgproto import UUID as DriverUUID

from . import queries as q
from .controls import (
    HELD_RECHECK_SECONDS,
    Controls,
    ControlsChange,
    LimitedClaim,
    refill_wait_seconds,
)
from .errors import (
    Conflict,
    DatabaseBusy,
    GatewayError,
    IdempotencyKeyReused,
    LeaseLost,
    NotFound,
    StoreUnavailable,
)
from .metrics import Metrics
from .migrate import schema_is_current
from .models import EnqueueRequest, task_bytes_or_stub
from .rows import Leased, Reclaimed, TaskRow

# Records of the credential tables (credentials.py); task rows go up as TaskRow.
Row: TypeAlias = asyncpg.Record
# What the driver raises when Postgres is unreachable, slow or refuses a statement;
# translated into StoreUnavailable here and nowhere else.
DRIVER_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
T = TypeVar("T")
UNAVAILABLE = "the database failed or could not be reached; the error is in the gateway's log"
# What a transaction pooler (PgBouncer, pool_mode = transaction) does to asyncpg's named
# prepared statements: each lives on one server connection, and the next transaction
# may run on another.
PREPARED_STATEMENT_ERRORS = (
    asyncpg.InvalidSQLStatementNameError,
    asyncpg.DuplicatePreparedStatementError,
)
log = logging.getLogger("gateway.store")

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


def _column(values: list[T]) -> list[T] | None:
    """An optional column of a batch for unnest(): None (a NULL array, which unnest
    pads with NULLs like any shorter array) when no item sets it, so that the driver
    does not encode, nor Postgres decode, a thousand NULLs."""
    return values if any(v is not None for v in values) else None


def _json_array(texts: list[str]) -> str:
    """JSON texts (checked already) as one JSON array: a batch statement's payloads
    (json_array_elements()), or the batch answer."""
    return "[" + ",".join(texts) + "]"


def _int_array(values: list[int]) -> str:
    """Integers as a Postgres array literal, for a `$n::text::int[]` parameter."""
    return "{" + ",".join(map(str, values)) + "}"


def new_task_ids(count: int) -> list[uuid.UUID]:
    """`count` random (version 4) UUIDs, as the driver's own UUID type: the same ids
    uuid.uuid4() makes, at a quarter of its cost, which showed in a 1,000-task batch."""
    raw = bytearray(os.urandom(16 * count))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # RFC 4122 variant
    return [DriverUUID(bytes(raw[i : i + 16])) for i in range(0, len(raw), 16)]


@dataclass(frozen=True)
class RuntimePage:
    """A page of the repair walk: the runtimes with a task claimable for over a second,
    and where the next page starts ('' once the walk has reached the end)."""

    claimable: list[str]
    next_after: str
    visited: int  # runtimes with a queued task the page looked at


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb goes in as JSON text (already serialized and checked) and comes out as the
    # text Postgres wrote, embedded in answers verbatim: never re-parsed, so numbers
    # stay exact and no stored value can fail to serialize.
    await conn.set_type_codec(
        "jsonb", encoder=lambda text: text, decoder=orjson.Fragment, schema="pg_catalog"
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset for a returned connection, beyond asyncpg's own (which rolls
    back a transaction left open): nothing. Pooled connections carry no session state
    (no session SET, LISTEN, cursor or advisory lock: those live on connections of
    their own), so the driver's default reset query would cost a round trip on every
    request and, through a shared PgBouncer, release other clients' advisory locks."""


class Store:
    """Task storage in Postgres. `open()` and `close()` are called by the app's lifespan."""

    def __init__(
        self,
        dsn: str,
        metrics: Metrics,
        *,
        min_size: int = 2,
        max_size: int = 20,
        statement_timeout_ms: int = 10_000,
        statement_cache_size: int = 100,
        lock_dsn: str | None = None,
        acquire_timeout_ms: int = 5_000,
    ) -> None:
        self._dsn = dsn
        self._lock_dsn = lock_dsn or dsn
        self._metrics = metrics
        self._min_size = min_size
        self._max_size = max_size
        self._statement_timeout_ms = statement_timeout_ms
        self._statement_cache_size = statement_cache_size
        self._acquire_timeout_ms = acquire_timeout_ms
        self._busy_since_log: tuple[float, int] = (0.0, 0)  # (last logged, refused since)
        self._begin = q.BEGIN_WITH_TIMEOUT.format(timeout_ms=statement_timeout_ms)
        self._pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        # No statement_timeout among the startup parameters: PgBouncer refuses the
        # connection. A transaction sets it with SET LOCAL (`_transaction`); a statement
        # of its own is bounded by the driver's timeout, which cancels it on the server
        # (PgBouncer forwards the cancel to the server connection running it).
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                init=_init_connection,
                reset=_keep_session,
                statement_cache_size=self._statement_cache_size,
                command_timeout=self._statement_timeout_ms / 1000,
                server_settings={"application_name": "claim-gateway"},
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc}") from exc

    async def close(self, timeout_seconds: float = 10.0) -> None:
        """Close the pool, waiting for borrowed connections at most `timeout_seconds`,
        then closing the rest by force, so that shutdown stays inside its grace period."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), timeout_seconds)
            except TimeoutError:
                pool.terminate()

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable("the database pool is not open")
        return self._pool

    def connection_free(self) -> bool:
        """True when a request would get a connection without waiting for another to
        come back: one is idle, or the pool may open another. A hint, not a promise."""
        pool = self._pool
        if pool is None:
            return False
        idle: int = pool.get_idle_size()
        return idle > 0 or pool.get_size() < pool.get_max_size()

    async def _run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        pool = self.pool
        try:
            # Bounded: with every connection busy (or Postgres not answering a new
            # connection), a request is refused with Retry-After instead of queueing
            # without end behind the others.
            conn = await pool.acquire(timeout=self._acquire_timeout_ms / 1000)
        except TimeoutError:
            self._metrics.db_acquire_timeouts.inc()
            self._log_busy()
            raise DatabaseBusy(
                f"no database connection came free within {self._acquire_timeout_ms} ms "
                "(GATEWAY_DB_ACQUIRE_TIMEOUT_MS); retry"
            ) from None
        except DRIVER_ERRORS as exc:
            self._driver_error(exc)
        try:
            return await fn(conn)
        except DRIVER_ERRORS as exc:
            self._driver_error(exc)
        finally:
            await pool.release(conn)

    def _log_busy(self) -> None:
        """One warning per 10 s at most: under overload every request would log one."""
        logged_at, refused = self._busy_since_log
        now = time.monotonic()
        if now - logged_at < 10.0:
            self._busy_since_log = (logged_at, refused + 1)
            return
        self._busy_since_log = (now, 0)
        log.warning(
            "every database connection (GATEWAY_DB_POOL_MAX) stayed busy for %d ms: "
            "requests are refused with 503 and Retry-After (%d more since the last warning)",
            self._acquire_timeout_ms,
            refused,
        )

    def _driver_error(self, exc: BaseException) -> NoReturn:
        # The driver's text can name hosts, databases, or other callers' values (a
        # batched claim's worker ids): it goes to the log, never to the client.
        log.warning("database error: %s: %s", type(exc).__name__, exc)
        if isinstance(exc, PREPARED_STATEMENT_ERRORS) and self._statement_cache_size:
            log.error(
                "prepared statements are lost between transactions: DATABASE_URL "
                "goes through a transaction pooler; set GATEWAY_DB_STATEMENT_CACHE_SIZE=0"
            )
        raise StoreUnavailable(UNAVAILABLE) from exc

    @contextlib.asynccontextmanager
    async def _transaction(self, conn: asyncpg.Connection) -> AsyncIterator[None]:
        """A transaction whose statements stop after the statement timeout. Its BEGIN
        carries the SET LOCAL, so it costs no more round trips than asyncpg's own."""
        await conn.execute(self._begin)
        try:
            yield
        except BaseException:
            # Also on cancellation: a connection back in the pool must not be left
            # inside a transaction. If even the ROLLBACK fails, the pool's reset on
            # release rolls back or discards the connection.
            with contextlib.suppress(*DRIVER_ERRORS):
                await conn.execute(q.ROLLBACK)
            raise
        await conn.execute(q.COMMIT)

    async def run(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `fn` on a pooled connection, for storage modules that keep their own
        statements (credentials). Driver errors become StoreUnavailable, as here;
        a GatewayError that `fn` raises passes through unchanged."""
        return await self._run(fn)

    async def schema_is_current(self) -> bool:
        """True when every migration file has been applied (for readiness)."""
        return await self._run(schema_is_current)

    async def enqueue(
        self, runtime_id: str, req: EnqueueRequest, lease: tuple[str, float] | None = None
    ) -> tuple[TaskRow, bool]:
        """Insert a task; returns (row, created). With an idempotency key already used,
        returns the existing task (created=False) if the request matches, else raises
        ValidationFailed(code idempotency_key_reused). Concurrent first requests with
        one key make one task: the unique index arbitrates.

        `lease`: (worker_id, lease_seconds) of a parked poll (sync match, claim.py): a
        task due now is written already leased to it (status `claimed`). If that fails
        with StoreUnavailable, the task may have been written all the same (an answer
        lost after the commit): it is given back to the queue before the error goes up,
        so that it never waits out a lease its poll was not handed."""
        leased = lease is not None and req.run_at is None and not req.delay_seconds
        task_id, lease_id = (uuid.uuid4(), uuid.uuid4()) if leased else (None, None)

        async def go(c: asyncpg.Connection) -> tuple[Row, bool]:
            key_hash = req.request_hash if req.idempotency_key else None
            if lease is not None and leased:
                row = await c.fetchrow(
                    q.ENQUEUE_LEASED,
                    runtime_id,
                    req.priority,
                    req.payload_json,
                    req.max_attempts,
                    req.ttl_seconds,
                    req.idempotency_key,
                    key_hash,
                    lease[0],
                    lease[1],
                    task_id,
                    lease_id,
                )
            else:
                row = await c.fetchrow(
                    q.ENQUEUE,
                    runtime_id,
                    req.priority,
                    req.payload_json,
                    req.max_attempts,
                    req.run_at,
                    req.delay_seconds,
                    req.ttl_seconds,
                    req.idempotency_key,
                    key_hash,
                )
            if row is not None:
                return row, True
            existing = await c.fetchrow(q.GET_BY_IDEMPOTENCY_KEY, runtime_id, req.idempotency_key)
            if existing is None:  # deleted between the two statements; extremely rare
                raise StoreUnavailable("idempotency key changed hands; retry the request")
            return existing, False

        try:
            row, created = await self._run(go)
        except DatabaseBusy:
            raise  # nothing was sent: nothing to give back
        except StoreUnavailable:
            if leased:
                with contextlib.suppress(StoreUnavailable):  # else the lease runs out
                    await self._run(lambda c: c.execute(q.UNCLAIM_LEASE, task_id, lease_id))
            raise
        if not created and row["request_hash"] != req.request_hash:
            raise IdempotencyKeyReused(
                f"idempotency key {req.idempotency_key!r} was already used for a different "
                "request on this runtime",
                task_id=str(row["id"]),
            )
        if created:
            self._metrics.tasks_enqueued.inc()
            if row["status"] == "claimed":
                self._metrics.tasks_claimed.inc()
        return TaskRow.of(row), created

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
        self._metrics.pg_claims.inc()
        leased: list[Leased] = []
        due_in: float | None = None
        window = len(worker_ids) + CLAIM_WINDOW
        with self._metrics.claim_seconds.time():
            for round_ in range(CLAIM_ROUNDS):
                done = len(leased)
                try:
                    result = await self._claim_once(
                        runtime_id, worker_ids[done:], lease_seconds[done:], window
                    )
                except StoreUnavailable:
                    if not leased:
                        raise
                    # The leases already taken are delivered; the poll checks again soon.
                    due_in = CONTENDED_RECHECK_SECONDS
                    break
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
        return sorted(leased, key=lambda x: x.slot), due_in

    async def _claim_once(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        window: int,
    ) -> list[Row]:
        async def claim_statement(c: asyncpg.Connection) -> list[Row]:
            rows: list[Row] = await c.fetch(
                q.CLAIM, runtime_id, list(worker_ids), list(lease_seconds), window
            )
            return rows

        return await self._run(claim_statement)

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        """Give back leases that were never delivered, each task by its lease;
        idempotent. Returns the ids of the tasks given back."""
        args = (list(task_ids), list(lease_ids))
        rows: list[Row] = await self._run(lambda c: c.fetch(q.UNCLAIM, *args))
        self._metrics.unclaimed.inc(len(rows))
        return [r["id"] for r in rows]

    async def bury(self, task_id: uuid.UUID, lease_id: uuid.UUID, reason: str) -> None:
        """End a claimed task `dead` with `reason`, if `lease_id` still holds it."""
        await self._run(lambda c: c.execute(q.BURY, task_id, lease_id, reason))

    async def get(self, task_id: uuid.UUID) -> TaskRow:
        row = await self._run(lambda c: c.fetchrow(q.GET_TASK, task_id))
        if row is None:
            raise NotFound(f"no task with id {task_id}")
        return TaskRow.of(row)

    async def task_runtime(self, task_id: uuid.UUID) -> str:
        """The runtime a task belongs to, or NotFound."""
        runtime_id = await self._run(lambda c: c.fetchval(q.TASK_RUNTIME, task_id))
        if runtime_id is None:
            raise NotFound(f"no task with id {task_id}")
        return str(runtime_id)

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
        return await self._lease_op(q.HEARTBEAT, task_id, lease_id, float(lease_seconds))

    async def complete(
        self, task_id: uuid.UUID, lease_id: uuid.UUID, result: str | None
    ) -> TaskRow:
        """One task's complete in a statement of its own; idempotent for the same lease
        (a repeat returns the finished task). The gateway's requests go through
        completions.py instead, grouped (complete_group, then complete_missed); this
        is for the tools and tests that measure or drive one statement."""
        row = await self._run(lambda c: c.fetchrow(q.COMPLETE, task_id, lease_id, result))
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
        rows = await self._run(lambda c: c.fetch(q.COMPLETE_GROUP, *args))
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
        return await self._lease_op(q.FAIL, task_id, lease_id, error, retry, retry_after_seconds)

    async def release(self, task_id: uuid.UUID, lease_id: uuid.UUID) -> TaskRow:
        return await self._lease_op(q.RELEASE, task_id, lease_id)

    async def enqueue_batch(
        self, runtime_id: str, reqs: Sequence[EnqueueRequest]
    ) -> tuple[str, bool]:
        """Insert a batch in one transaction, all or nothing. Returns the tasks as one
        JSON array, each task's object as the API shows it (models.task_bytes), in
        request order, and whether every item was an idempotent replay. A key reused
        with a different request fails the whole batch, naming the item's index. A batch
        without idempotency keys cannot conflict: its one statement is all or nothing by
        itself, and is sent alone (one round trip instead of three), and its answer is
        one row (queries.ENQUEUE_BATCH_NEW). New tasks come back already written by
        Postgres (queries.NEW_TASK_JSON); only replayed ones are read whole."""
        keys = [r.idempotency_key for r in reqs if r.idempotency_key]
        # Both statements' item columns, in their parameter order.
        columns = (
            _int_array([r.priority for r in reqs]),
            _json_array([r.payload_json for r in reqs]),
            _int_array([r.max_attempts for r in reqs]),
            _column([r.run_at for r in reqs]),
            _column([r.delay_seconds for r in reqs]),
            _column([r.ttl_seconds for r in reqs]),
        )

        if not keys:

            async def insert_new(c: asyncpg.Connection) -> str:
                row = await c.fetchrow(q.ENQUEUE_BATCH_NEW, runtime_id, *columns)
                if row is None or row["n"] != len(reqs):
                    raise StoreUnavailable("a batch item vanished mid-insert; retry")
                joined: str = row["tasks"]
                return "[" + joined + "]"

            tasks = await self._run(insert_new)
            self._metrics.tasks_enqueued.inc(len(reqs))
            return tasks, False

        ids = new_task_ids(len(reqs))

        async def insert_and_match(c: asyncpg.Connection) -> tuple[list[str], int]:
            inserted = await c.fetch(
                q.ENQUEUE_BATCH,
                runtime_id,
                ids,
                *columns,
                _column([r.idempotency_key for r in reqs]),
                _column([r.request_hash if r.idempotency_key else None for r in reqs]),
            )
            by_id = {row[0]: row[1] for row in inserted}
            if len(by_id) == len(reqs):  # every item new: nothing to match by key
                return [by_id[task_id] for task_id in ids], len(by_id)
            existing = {}
            for row in await c.fetch(q.GET_BY_IDEMPOTENCY_KEYS, runtime_id, keys):
                existing[row["idempotency_key"]] = row
            out: list[str] = []
            for index, (task_id, req) in enumerate(zip(ids, reqs, strict=True)):
                text = by_id.get(task_id)
                if text is not None:
                    out.append(text)
                    continue
                row = existing.get(req.idempotency_key or "")
                if row is None:
                    raise StoreUnavailable("a batch item vanished mid-insert; retry")
                if row["request_hash"] != req.request_hash:
                    raise IdempotencyKeyReused(
                        f"tasks[{index}]: idempotency key {req.idempotency_key!r} was "
                        "already used for a different request on this runtime",
                        field=f"tasks[{index}].idempotency_key",
                        index=index,
                    )
                out.append(task_bytes_or_stub(TaskRow.of(row)).decode())
            return out, len(by_id)

        async def go(c: asyncpg.Connection) -> tuple[list[str], int]:
            # A refused item must undo the rows inserted before the refusal was known.
            async with self._transaction(c):
                return await insert_and_match(c)

        written, created = await self._run(go)
        self._metrics.tasks_enqueued.inc(created)
        return _json_array(written), created == 0

    async def cancel(self, task_id: uuid.UUID) -> TaskRow:
        """Idempotent: cancelling a cancelled task returns it."""
        row = await self._run(lambda c: c.fetchrow(q.CANCEL, task_id))
        if row is not None:
            return TaskRow.of(row)
        current = await self.get(task_id)
        if current.status == "cancelled":
            return current
        raise Conflict(
            f"task {task_id} is {current.status}; only queued or claimed tasks can be cancelled",
            task_status=current.status,
        )

    async def retry(self, task_id: uuid.UUID) -> TaskRow:
        row = await self._run(lambda c: c.fetchrow(q.RETRY, task_id))
        if row is not None:
            return TaskRow.of(row)
        current = await self.get(task_id)
        raise Conflict(
            f"task {task_id} is {current.status}; only dead, expired or cancelled tasks "
            "can be retried",
            task_status=current.status,
        )

    async def list_tasks(
        self,
        runtime_id: str,
        status: str | None,
        limit: int,
        after: tuple[datetime, uuid.UUID] | None,
    ) -> list[TaskRow]:
        created, task_id = after if after else (None, None)
        rows = await self._run(
            lambda c: c.fetch(q.LIST_TASKS, runtime_id, status, created, task_id, limit)
        )
        return [TaskRow.of(r) for r in rows]

    async def stats(self, runtime_id: str) -> tuple[dict[str, int], float | None]:
        """(count per reported status, age in seconds of the oldest due queued task).
        Exact, and in time proportional to the runtime's live tasks, not its history
        (STATS_COUNTS)."""

        async def stats_in_tx(c: asyncpg.Connection) -> tuple[dict[str, int], float | None]:
            counts = {r["status"]: r["n"] for r in await c.fetch(q.STATS_COUNTS, runtime_id)}
            return counts, await c.fetchval(q.OLDEST_QUEUED_AGE, runtime_id)

        return await self._run(stats_in_tx)

    # -- janitor ---------------------------------------------------------------

    async def reclaim_leases(self, limit: int) -> list[Reclaimed]:
        """One batch of lapsed leases back to the queue."""
        rows = await self._run(lambda c: c.fetch(q.RECLAIM_LEASES, limit))
        return [Reclaimed(r["runtime_id"], r["status"], r["id"]) for r in rows]

    async def promote_scheduled(self, limit: int) -> list[str]:
        """One batch of due scheduled tasks made queued; returns the runtime of each
        task moved. Idempotent: a task moves once, and a locked one waits for the next."""
        rows = await self._run(lambda c: c.fetch(q.PROMOTE_SCHEDULED, limit))
        return [r["runtime_id"] for r in rows]

    async def expire_tasks(self, limit: int) -> int:
        """One batch of queued or scheduled tasks past expires_at marked expired;
        returns the count."""
        status = await self._run(lambda c: c.execute(q.EXPIRE_TASKS, limit))
        return int(status.split()[-1])

    async def purge_finished(self, statuses: Sequence[str], age_seconds: float, limit: int) -> int:
        """Delete one batch of finished rows older than age_seconds; returns the count."""
        status = await self._run(
            lambda c: c.execute(q.PURGE_FINISHED, list(statuses), age_seconds, limit)
        )
        return int(status.split()[-1])

    async def queue_depth(self) -> tuple[dict[str, int], float | None]:
        """(tasks per stored status, age in seconds of the oldest claimable queued task
        or None), in one statement over the live rows and the finished counts."""
        rows = await self._run(lambda c: c.fetch(q.QUEUE_DEPTH))
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
                rows = await c.fetch(q.FOLD_TASK_COUNTS, limit)
                zero = [r for r in rows if r["n"] == 0]
                if zero:
                    await c.execute(
                        q.DROP_ZERO_COUNTS,
                        [r["runtime_id"] for r in zero],
                        [r["status"] for r in zero],
                    )
                return len(rows)

        return await self._run(fold_in_tx)

    async def claimable_runtimes(self, limit: int, after: str = "") -> RuntimePage:
        """One page of the runtimes with a queued task: up to `limit` visited, in id
        order, after `after`."""
        rows = await self._run(lambda c: c.fetch(q.CLAIMABLE_RUNTIMES, limit, after))
        return RuntimePage(
            claimable=[r["runtime_id"] for r in rows if r["claimable"]],
            next_after=rows[-1]["runtime_id"] if len(rows) == limit else "",
            visited=len(rows),
        )

    async def try_leadership(self, key: int) -> Leadership | None:
        """Advisory lock `key` on a dedicated connection, or None if another process
        holds it. The lock lives as long as that connection: if this process dies,
        Postgres releases it and another instance takes over. The connection goes to
        the lock URL (GATEWAY_DIRECT_DATABASE_URL when set): through a transaction
        pooler a session lock would sit on a server connection others share."""
        try:
            conn = await asyncpg.connect(
                self._lock_dsn,
                server_settings={"application_name": "claim-gateway-janitor"},
            )
        except DRIVER_ERRORS as exc:
            raise StoreUnavailable(f"cannot connect to Postgres: {exc}") from exc
        try:
            if await conn.fetchval(q.JANITOR_TRY_LOCK, key):
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

    # -- batch lease operations ----------------------------------------------------
    # Each is one statement whatever the batch's size, and an item that fails never
    # fails the others. `task_ids` are distinct (the parser refuses a repeat).
    # `runtimes`: the caller's runtime patterns, None for every runtime; a task outside
    # them is NotFound, as for a single operation.

    async def complete_many(
        self,
        task_ids: Sequence[uuid.UUID],
        lease_ids: Sequence[uuid.UUID],
        results: Sequence[str | None],
        runtimes: Sequence[str] | None,
    ) -> list[ItemResult]:
        """complete, per item; idempotent per item for the same lease, as complete."""
        args = (list(task_ids), _patterns(runtimes), list(lease_ids), list(results))
        rows = await self._run(lambda c: c.fetch(q.BATCH_COMPLETE, *args))
        return _item_results(rows, replay_statuses=COMPLETE_REPLAYS)

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
        args = (
            list(task_ids),
            _patterns(runtimes),
            list(lease_ids),
            list(errors),
            list(retries),
            list(retry_after_seconds),
        )
        rows = await self._run(lambda c: c.fetch(q.BATCH_FAIL, *args))
        return _item_results(rows)

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
        rows = await self._run(lambda c: c.fetch(q.BATCH_HEARTBEAT, *args))
        return _item_results(rows)

    # -- runtime controls (gateway/controls.py) ------------------------------------

    async def all_controls(self) -> list[Controls]:
        """Every runtime's stored controls (one statement; a row per controlled runtime)."""
        rows = await self._run(lambda c: c.fetch(q.ALL_CONTROLS))
        return [Controls.of(r) for r in rows]

    async def get_controls(self, runtime_id: str) -> Controls | None:
        row = await self._run(lambda c: c.fetchrow(q.GET_CONTROLS, runtime_id))
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
        row = await self._run(lambda c: c.fetchrow(q.SET_CONTROLS, *args))
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
                ctl = await c.fetchrow(q.CONTROLS_REFILL, runtime_id)
                if ctl is None:
                    return None
                if ctl["paused"]:
                    return LimitedClaim([], None, HELD_RECHECK_SECONDS)
                allowed, held = len(worker_ids), None
                if ctl["max_in_flight"] is not None:
                    leased_now = await c.fetchval(q.CONTROLS_IN_FLIGHT, runtime_id)
                    if ctl["max_in_flight"] - leased_now < allowed:
                        allowed, held = ctl["max_in_flight"] - leased_now, HELD_RECHECK_SECONDS
                rate, tokens = ctl["claims_per_second"], ctl["tokens"]
                if rate is not None and math.floor(tokens) < allowed:
                    allowed = math.floor(tokens)
                    held = refill_wait_seconds(tokens - allowed, rate)
                if allowed <= 0:
                    return LimitedClaim([], None, held)
                result = await c.fetch(
                    q.CLAIM,
                    runtime_id,
                    list(worker_ids[:allowed]),
                    list(lease_seconds[:allowed]),
                    allowed + CLAIM_WINDOW,
                )
                rows = [Leased(r["slot"], TaskRow.of(r)) for r in result if r["slot"] is not None]
                if rate is not None and rows:
                    await c.execute(q.CONTROLS_SPEND, runtime_id, float(len(rows)))
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


# -- batch lease operations ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item of a batch lease operation, in the request's order. `error` is what the
    single operation would have raised for it (LeaseLost, NotFound); else it is None
    and `status` is the task's status after the operation (effective, as answers show
    it). A fail sets `run_at`; a heartbeat `lease_expires_at` and `cancel_requested`.
    `runtime_id` is None for a task the caller cannot see: it counts as not found."""

    task_id: uuid.UUID
    runtime_id: str | None
    status: str | None
    error: GatewayError | None = None
    run_at: datetime | None = None
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False


def _patterns(runtimes: Sequence[str] | None) -> list[str] | None:
    return None if runtimes is None else list(runtimes)


def _item_results(rows: Sequence[Row], replay_statuses: tuple[str, ...] = ()) -> list[ItemResult]:
    """A batch statement's answer rows (queries._BATCH_ANSWER) classified as _lease_op
    classifies a single operation's outcome."""
    out = []
    for r in rows:
        task_id, runtime_id, status = r["item_id"], r["held_runtime"], r["new_status"]
        if runtime_id is None:
            out.append(ItemResult(task_id, None, None, NotFound(f"no task with id {task_id}")))
        elif status is not None:
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
        elif r["held_status"] in replay_statuses and r["held_lease"] == r["item_lease"]:
            out.append(ItemResult(task_id, runtime_id, r["held_status"]))
        else:
            error = lease_lost(task_id, r["item_lease"], r["held_status"])
            out.append(ItemResult(task_id, runtime_id, r["held_status"], error))
    return out


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
            holds = await self._conn.fetchval(q.JANITOR_HOLDS_LOCK, self._key, timeout=5)
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


# -- the runtimes listing (GET /v1/runtimes, the console) ------------------------------


@dataclass(frozen=True, slots=True)
class RuntimeSummary:
    """One runtime's live counts: `queued` includes scheduled (not yet due) tasks and
    excludes expired ones; the age is in seconds, None when no queued task is due."""

    runtime_id: str
    queued: int
    claimed: int
    oldest_queued_age_seconds: float | None
    dead: int = 0  # finished dead, from task_counts (not a count of the history)


async def walk_runtimes(
    store: Store, after: str, limit: int, prefixes: Sequence[str] | None = None
) -> list[str]:
    """Up to `limit` runtime ids after `after`, in id order, that hold tasks (live, or
    finished and still stored) or have controls set, from the smallest of `prefixes` on
    (None: from the start). Reads the live rows' partial indexes, the finished-task
    counters and the controls, never the history."""
    starts = None if prefixes is None else list(prefixes)
    rows = await store.run(lambda c: c.fetch(q.RUNTIMES_WALK, after, limit, starts))
    return [r["runtime_id"] for r in rows]


async def summarize_runtimes(store: Store, runtime_ids: Sequence[str]) -> list[RuntimeSummary]:
    """Live counts for each of `runtime_ids`, in id order."""
    if not runtime_ids:
        return []
    rows = await store.run(lambda c: c.fetch(q.RUNTIMES_SUMMARY, list(runtime_ids)))
    return [
        RuntimeSummary(
            r["runtime_id"], r["queued"], r["claimed"], r["oldest_queued_age_seconds"], r["dead"]
        )
        for r in rows
    ]
