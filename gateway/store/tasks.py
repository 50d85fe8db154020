"""Task statements outside any lease: enqueue (one task, or a batch in one statement),
and reading and changing a task by id or runtime: get, cancel, retry, the listing and a
runtime's stats.

Also the helpers that shape a batch's item columns for its one statement, and the
task ids a keyed batch is written with.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
from asyncpg.pgproto.pgproto import UUID as DriverUUID

from ..admission import releasing
from ..api.render import task_bytes_or_stub, task_ref_json
from ..api.requests import EnqueueRequest
from ..errors import Conflict, DatabaseBusy, IdempotencyKeyReused, NotFound, StoreUnavailable
from ..rows import TaskRow
from .base import Row, StoreBase, T
from .sql import tasks as sql


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
    if values and values.count(values[0]) == len(values):
        # All alike (every item left priority or max_attempts to its default, as most
        # batches do): one number written once, a fifth of the time.
        return "{" + ",".join([str(values[0])] * len(values)) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def _is_plain(req: EnqueueRequest) -> bool:
    """An item that sets no time and no trace: due at once, never expiring
    (sql.ENQUEUE_BATCH_PLAIN)."""
    return (
        req.run_at is None
        and not req.delay_seconds
        and req.ttl_seconds is None
        and req.trace_parent is None
    )


def _times(start: datetime, count: int) -> list[str]:
    """`count` times a microsecond apart from `start`, as render.format_time writes
    them: the date and second are written once per second crossed, not per time."""
    second = start.astimezone(UTC).replace(tzinfo=None, microsecond=0)
    head = second.isoformat(timespec="seconds") + "."
    micro = start.microsecond
    out = []
    for _ in range(count):
        if micro == 1_000_000:
            second, micro = second + timedelta(seconds=1), 0
            head = second.isoformat(timespec="seconds") + "."
        out.append(f"{head}{micro:06d}Z")
        micro += 1
    return out


def plain_tasks_json(
    runtime_id: str, reqs: Sequence[EnqueueRequest], start: datetime, lines: str
) -> str:
    """The answer to a plain batch (sql.ENQUEUE_BATCH_PLAIN) as one JSON array: byte
    for byte what render.task_bytes makes of each stored row. `start` is the batch's
    time, `lines` Postgres's id-and-payload line per task, in request order."""
    runtime = orjson.dumps(runtime_id).decode()
    times = _times(start, len(reqs))
    run_at = times[0]
    return (
        "["
        + ",".join(
            f'{{"id":"{line[:36]}","runtime_id":{runtime},"status":"queued",'
            f'"priority":{req.priority},"payload":{line[36:]},"attempts":0,'
            f'"max_attempts":{req.max_attempts},"run_at":"{run_at}","expires_at":null,'
            f'"created_at":"{at}","updated_at":"{at}"}}'
            for req, line, at in zip(reqs, lines.split("\n"), times, strict=True)
        )
        + "]"
    )


def new_task_ids(count: int) -> list[uuid.UUID]:
    """`count` new task ids (RFC 9562 version 7: Unix time in milliseconds, then 74
    random bits), as the driver's own UUID type: the form Postgres's default for
    tasks.id writes (migration 0009), so that ids grow with time and a batch's rows
    land on the last pages of the id index. One random read for all of them: building
    them one by one with the uuid module showed in a 1,000-task batch."""
    raw = bytearray(os.urandom(16 * count))
    millis = (time.time_ns() // 1_000_000).to_bytes(6, "big")
    for offset, byte in enumerate(millis):
        raw[offset::16] = bytes((byte,)) * count
    raw[6::16] = bytes(b & 0x0F | 0x70 for b in raw[6::16])  # version 7
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # RFC 9562 variant
    return [DriverUUID(bytes(raw[i : i + 16])) for i in range(0, len(raw), 16)]


class TaskStatements(StoreBase):
    """Enqueue, batch enqueue, and the statements on a task that take no lease."""

    async def enqueue(
        self, runtime_id: str, req: EnqueueRequest, lease: tuple[str, float] | None = None
    ) -> tuple[TaskRow, bool]:
        """Insert a task; returns (row, created). With an idempotency key already used,
        returns the existing task (created=False) if the request matches, else raises
        ValidationFailed(code idempotency_key_reused). Concurrent first requests with
        one key make one task: the unique index arbitrates.

        `lease`: (worker_id, lease_seconds) of a parked poll (sync match, claim/claimer.py): a
        task due now is written already leased to it (status `claimed`). If that fails
        with StoreUnavailable, the task may have been written all the same (an answer
        lost after the commit): it is given back to the queue before the error goes up,
        so that it never waits out a lease its poll was not handed."""
        leased = lease is not None and req.run_at is None and not req.delay_seconds
        # Both time-ordered: a lease id says when the lease began (the lease's span).
        task_id, lease_id = new_task_ids(2) if leased else (None, None)

        async def go(c: asyncpg.Connection) -> tuple[Row, bool]:
            key_hash = req.request_hash if req.idempotency_key else None
            if lease is not None and leased:
                row = await c.fetchrow(
                    sql.ENQUEUE_LEASED,
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
                    req.trace_parent,
                    req.trace_state,
                )
            else:
                row = await c.fetchrow(
                    sql.ENQUEUE,
                    runtime_id,
                    req.priority,
                    req.payload_json,
                    req.max_attempts,
                    req.run_at,
                    req.delay_seconds,
                    req.ttl_seconds,
                    req.idempotency_key,
                    key_hash,
                    req.trace_parent,
                    req.trace_state,
                )
            if row is not None:
                return row, True
            existing = await c.fetchrow(sql.GET_BY_IDEMPOTENCY_KEY, runtime_id, req.idempotency_key)
            if existing is None:  # deleted between the two statements; extremely rare
                raise StoreUnavailable("idempotency key changed hands; retry the request")
            return existing, False

        try:
            row, created = await self._run(go)
        except DatabaseBusy:
            raise  # nothing was sent: nothing to give back
        except StoreUnavailable:
            if leased:
                # It frees work: a release's place in line, whatever the client does
                # (gateway/admission.py). On failure the lease runs out instead.
                with contextlib.suppress(StoreUnavailable), releasing():
                    await self._run(lambda c: c.execute(sql.UNCLAIM_LEASE, task_id, lease_id))
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

    async def get(self, task_id: uuid.UUID) -> TaskRow:
        row = await self._run(lambda c: c.fetchrow(sql.GET_TASK, task_id))
        if row is None:
            raise NotFound(f"no task with id {task_id}")
        return TaskRow.of(row)

    async def trace_contexts(
        self, task_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[str, str | None]]:
        """(traceparent, tracestate) of those of `task_ids` that have a stored context."""
        rows = await self._run(lambda c: c.fetch(sql.TRACE_CONTEXTS, list(task_ids)))
        return {r["id"]: (r["trace_parent"], r["trace_state"]) for r in rows}

    async def task_runtime(self, task_id: uuid.UUID) -> str:
        """The runtime a task belongs to, or NotFound."""
        runtime_id = await self._run(lambda c: c.fetchval(sql.TASK_RUNTIME, task_id))
        if runtime_id is None:
            raise NotFound(f"no task with id {task_id}")
        return str(runtime_id)

    async def _inserted(self, statement: str, count: int, *args: object) -> str:
        """Runs a keyless batch statement (`count` items) whose one row is how many it
        inserted (`n`) and their JSON objects joined by commas (`tasks`); returns them
        as one JSON array."""

        async def insert(c: asyncpg.Connection) -> str:
            row = await c.fetchrow(statement, *args)
            if row is None or row["n"] != count:
                raise StoreUnavailable("a batch item vanished mid-insert; retry")
            joined: str = row["tasks"]
            return "[" + joined + "]"

        tasks = await self._run(insert)
        self._metrics.tasks_enqueued.inc(count)
        return tasks

    async def enqueue_batch(
        self, runtime_id: str, reqs: Sequence[EnqueueRequest], ids_only: bool = False
    ) -> tuple[str, bool]:
        """Insert a batch in one transaction, all or nothing. Returns the tasks as one
        JSON array, each task's object as the API shows it (render.task_bytes), in
        request order, and whether every item was an idempotent replay. With
        `ids_only`, each task is only `{"id": ...}` (a replayed one's is the stored
        task's id), and no statement sends a payload back (sql.TASK_REF_JSON,
        sql.GET_REFS_BY_IDEMPOTENCY_KEYS). A key reused with a different request
        fails the whole batch, naming the item's index. A batch without idempotency
        keys cannot conflict: its one statement is all or nothing by itself, and is sent
        alone (one round trip instead of three), and its answer is one row
        (sql.ENQUEUE_BATCH_NEW, _inserted). New tasks come back already written by
        Postgres (sql.NEW_TASK_JSON); only replayed ones are read whole. A keyless
        batch whose items set no time (the usual one) comes back as ids and payloads
        only (sql.ENQUEUE_BATCH_PLAIN), and the gateway writes the rest, after the
        connection is given back (plain_tasks_json)."""
        keys = [r.idempotency_key for r in reqs if r.idempotency_key]
        # The statements' item columns, in their parameter order: every statement takes
        # these three; the others also the three `timed` ones after them.
        columns = (
            _int_array([r.priority for r in reqs]),
            _json_array([r.payload_json for r in reqs]),
            _int_array([r.max_attempts for r in reqs]),
        )

        plain = not keys and all(_is_plain(r) for r in reqs)
        if plain and ids_only:
            return await self._inserted(
                sql.ENQUEUE_BATCH_PLAIN_IDS, len(reqs), runtime_id, *columns
            ), False

        if plain:

            async def insert_plain(c: asyncpg.Connection) -> Row | None:
                return await c.fetchrow(sql.ENQUEUE_BATCH_PLAIN, runtime_id, *columns)

            row = await self._run(insert_plain)
            if row is None or row["n"] != len(reqs):
                raise StoreUnavailable("a batch item vanished mid-insert; retry")
            self._metrics.tasks_enqueued.inc(len(reqs))
            return plain_tasks_json(runtime_id, reqs, row["t"], row["lines"]), False

        timed = (
            _column([r.run_at for r in reqs]),
            _column([r.delay_seconds for r in reqs]),
            _column([r.ttl_seconds for r in reqs]),
        )
        traces = (
            _column([r.trace_parent for r in reqs]),
            _column([r.trace_state for r in reqs]),
        )
        if not keys:
            statement = sql.ENQUEUE_BATCH_NEW_IDS if ids_only else sql.ENQUEUE_BATCH_NEW
            inserted = await self._inserted(
                statement, len(reqs), runtime_id, *columns, *timed, *traces
            )
            return inserted, False

        ids = new_task_ids(len(reqs))

        async def insert_and_match(c: asyncpg.Connection) -> tuple[list[str], int]:
            inserted = await c.fetch(
                sql.ENQUEUE_BATCH_IDS if ids_only else sql.ENQUEUE_BATCH,
                runtime_id,
                ids,
                *columns,
                *timed,
                _column([r.idempotency_key for r in reqs]),
                _column([r.request_hash if r.idempotency_key else None for r in reqs]),
                *traces,
            )
            by_id = {row[0]: row[1] for row in inserted}
            if len(by_id) == len(reqs):  # every item new: nothing to match by key
                return [by_id[task_id] for task_id in ids], len(by_id)
            existing = {}
            lookup = sql.GET_REFS_BY_IDEMPOTENCY_KEYS if ids_only else sql.GET_BY_IDEMPOTENCY_KEYS
            for row in await c.fetch(lookup, runtime_id, keys):
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
                if ids_only:
                    out.append(task_ref_json(row["id"]))
                else:
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
        row = await self._run(lambda c: c.fetchrow(sql.CANCEL, task_id))
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
        row = await self._run(lambda c: c.fetchrow(sql.RETRY, task_id))
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
        schedule: str | None = None,
    ) -> list[TaskRow]:
        """A page of the runtime's tasks oldest first, after the (created_at, id) of
        `after`; with `schedule`, only the tasks that schedule made (tasks_schedule_idx)."""
        created, task_id = after if after else (None, None)
        if schedule is not None:
            args: tuple[object, ...] = (runtime_id, status, created, task_id, limit, schedule)
            statement = sql.LIST_SCHEDULE_TASKS
        else:
            args, statement = (runtime_id, status, created, task_id, limit), sql.LIST_TASKS
        rows = await self._run(lambda c: c.fetch(statement, *args))
        return [TaskRow.of(r) for r in rows]

    async def stats(self, runtime_id: str) -> tuple[dict[str, int], float | None]:
        """(count per reported status, age in seconds of the oldest due queued task).
        Exact, and in time proportional to the runtime's live tasks, not its history
        (STATS_COUNTS)."""

        async def stats_in_tx(c: asyncpg.Connection) -> tuple[dict[str, int], float | None]:
            counts = {r["status"]: r["n"] for r in await c.fetch(sql.STATS_COUNTS, runtime_id)}
            return counts, await c.fetchval(sql.OLDEST_QUEUED_AGE, runtime_id)

        return await self._run(stats_in_tx)
