"""A blocking wrapper for scripts: the async client on an event loop of its own, with
the same methods, parameters and types (a test compares the two signature by signature).

    with Client() as gw:
        task = gw.enqueue("demo", {"n": 1})
        print(gw.get(task.id).status)

Not for use inside a running event loop (use AsyncClient there), nor from several
threads at once.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from .bulk import BulkOutcome, ErrorGroups, RetryableStatus
from .calls.history import FleetHistory, RuntimeHistory, Window
from .client import (
    DEFAULT_CONNECTIONS,
    DEFAULT_TIMEOUT_SECONDS,
    LONG_POLL_MARGIN_SECONDS,
    WAIT_STEP_SECONDS,
    AsyncClient,
)
from .models import (
    KEEP,
    Beat,
    Claimed,
    Completion,
    Controls,
    Failure,
    ItemOutcome,
    Keep,
    NewTask,
    Page,
    RuntimePage,
    RuntimeSummary,
    Stats,
    Task,
    TaskStatus,
)
from .schedules import Backfill, Overlap, Schedule, ScheduleTick

T = TypeVar("T")


class Client:
    """Every method of AsyncClient, blocking. Close it (or use `with`) when done."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        long_poll_margin_seconds: float = LONG_POLL_MARGIN_SECONDS,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self._runner = asyncio.Runner()
        self.aio = AsyncClient(
            url,
            token,
            timeout_seconds=timeout_seconds,
            long_poll_margin_seconds=long_poll_margin_seconds,
            connections=connections,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._run(self.aio.close())
        finally:
            self._runner.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        # In the caller's context, not the one the runner copied at its first call: an
        # enqueue sends the OpenTelemetry span active now (contextvars), not then.
        return self._runner.run(coro, context=contextvars.copy_context())

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        """As AsyncClient.request: one call, `path` sent as given."""
        return self._run(
            self.aio.request(
                method, path, body, params=params, headers=headers, timeout_seconds=timeout_seconds
            )
        )

    # -- producers ---------------------------------------------------------------

    @overload
    def enqueue(
        self,
        runtime: str,
        payload: Any,
        *,
        priority: int | None = None,
        idempotency_key: str | None = None,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        ttl_seconds: float | None = None,
        max_attempts: int | None = None,
        minimal: Literal[False] = False,
        retry_seconds: float = 0.0,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Task: ...

    @overload
    def enqueue(
        self,
        runtime: str,
        payload: Any,
        *,
        priority: int | None = None,
        idempotency_key: str | None = None,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        ttl_seconds: float | None = None,
        max_attempts: int | None = None,
        minimal: Literal[True],
        retry_seconds: float = 0.0,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> str: ...

    def enqueue(
        self,
        runtime: str,
        payload: Any,
        *,
        priority: int | None = None,
        idempotency_key: str | None = None,
        delay_seconds: float | None = None,
        run_at: datetime | str | None = None,
        ttl_seconds: float | None = None,
        max_attempts: int | None = None,
        minimal: bool = False,
        retry_seconds: float = 0.0,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Task | str:
        """As AsyncClient.enqueue; with `minimal=True`, the task's id only."""
        if minimal:
            task_id: str = self._run(
                self.aio.enqueue(
                    runtime,
                    payload,
                    priority=priority,
                    idempotency_key=idempotency_key,
                    delay_seconds=delay_seconds,
                    run_at=run_at,
                    ttl_seconds=ttl_seconds,
                    max_attempts=max_attempts,
                    minimal=True,
                    retry_seconds=retry_seconds,
                    traceparent=traceparent,
                    tracestate=tracestate,
                )
            )
            return task_id
        task: Task = self._run(
            self.aio.enqueue(
                runtime,
                payload,
                priority=priority,
                idempotency_key=idempotency_key,
                delay_seconds=delay_seconds,
                run_at=run_at,
                ttl_seconds=ttl_seconds,
                max_attempts=max_attempts,
                retry_seconds=retry_seconds,
                traceparent=traceparent,
                tracestate=tracestate,
            )
        )
        return task

    @overload
    def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: Literal[False] = False,
        retry_seconds: float = 0.0,
    ) -> list[Task]: ...

    @overload
    def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: Literal[True],
        retry_seconds: float = 0.0,
    ) -> list[str]: ...

    def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: bool = False,
        retry_seconds: float = 0.0,
    ) -> list[Task] | list[str]:
        """As AsyncClient.enqueue_batch; with `minimal=True`, the tasks' ids only."""
        if minimal:
            return self._run(
                self.aio.enqueue_batch(runtime, tasks, minimal=True, retry_seconds=retry_seconds)
            )
        return self._run(self.aio.enqueue_batch(runtime, tasks, retry_seconds=retry_seconds))

    def cancel(self, task_id: str) -> Task:
        return self._run(self.aio.cancel(task_id))

    def retry(self, task_id: str) -> Task:
        return self._run(self.aio.retry(task_id))

    def retry_tasks(
        self,
        runtime: str,
        status: RetryableStatus,
        *,
        error_prefix: str | None = None,
        limit: int | None = None,
    ) -> BulkOutcome:
        """As AsyncClient.retry_tasks: up to `limit` of the runtime's tasks in `status`."""
        return self._run(
            self.aio.retry_tasks(runtime, status, error_prefix=error_prefix, limit=limit)
        )

    def cancel_tasks(
        self, runtime: str, status: Literal["queued"] = "queued", *, limit: int | None = None
    ) -> BulkOutcome:
        """As AsyncClient.cancel_tasks: up to `limit` of the runtime's queued tasks."""
        return self._run(self.aio.cancel_tasks(runtime, status, limit=limit))

    def error_groups(
        self, runtime: str, status: RetryableStatus = "dead", *, limit: int | None = None
    ) -> ErrorGroups:
        return self._run(self.aio.error_groups(runtime, status, limit=limit))

    # -- daemons -----------------------------------------------------------------

    def claim(
        self,
        runtime: str,
        worker_id: str,
        *,
        max_tasks: int = 1,
        wait_seconds: float = 0,
        lease_seconds: int | None = None,
        complete: Iterable[Completion] | None = None,
        fail: Iterable[Failure] | None = None,
    ) -> Claimed:
        """As AsyncClient.claim: up to `max_tasks` tasks, waiting up to `wait_seconds`,
        after reporting `complete` and `fail` (their outcomes in the answer's `acks`)."""
        return self._run(
            self.aio.claim(
                runtime,
                worker_id,
                max_tasks=max_tasks,
                wait_seconds=wait_seconds,
                lease_seconds=lease_seconds,
                complete=complete,
                fail=fail,
            )
        )

    def heartbeat(self, task_id: str, lease_id: str, lease_seconds: int | None = None) -> Task:
        return self._run(self.aio.heartbeat(task_id, lease_id, lease_seconds))

    def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task:
        return self._run(self.aio.complete(task_id, lease_id, result))

    def fail(
        self,
        task_id: str,
        lease_id: str,
        error: str,
        *,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task:
        """As AsyncClient.fail: queued again after a backoff, or `dead`."""
        return self._run(
            self.aio.fail(
                task_id, lease_id, error, retry=retry, retry_after_seconds=retry_after_seconds
            )
        )

    def release(self, task_id: str, lease_id: str) -> Task:
        return self._run(self.aio.release(task_id, lease_id))

    def complete_many(self, items: Iterable[Completion]) -> list[ItemOutcome]:
        return self._run(self.aio.complete_many(items))

    def fail_many(self, items: Iterable[Failure]) -> list[ItemOutcome]:
        return self._run(self.aio.fail_many(items))

    def heartbeat_many(self, items: Iterable[Beat]) -> list[ItemOutcome]:
        return self._run(self.aio.heartbeat_many(items))

    # -- reading -----------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        return self._run(self.aio.get(task_id))

    def wait(
        self, task_id: str, *, timeout_seconds: float, step_seconds: float = WAIT_STEP_SECONDS
    ) -> Task:
        """As AsyncClient.wait: the finished task, or WaitTimedOut."""
        return self._run(
            self.aio.wait(task_id, timeout_seconds=timeout_seconds, step_seconds=step_seconds)
        )

    def list_tasks(
        self,
        runtime: str,
        *,
        status: TaskStatus | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        schedule: str | None = None,
    ) -> Page:
        return self._run(
            self.aio.list_tasks(
                runtime, status=status, limit=limit, cursor=cursor, schedule=schedule
            )
        )

    def iter_tasks(
        self,
        runtime: str,
        *,
        status: TaskStatus | None = None,
        page_size: int | None = None,
        schedule: str | None = None,
    ) -> Iterator[Task]:
        """Every task of the runtime (with that status, made by that schedule),
        following the cursors."""
        cursor: str | None = None
        while True:
            page = self.list_tasks(
                runtime, status=status, limit=page_size, cursor=cursor, schedule=schedule
            )
            yield from page.tasks
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def stats(self, runtime: str) -> Stats:
        return self._run(self.aio.stats(runtime))

    def list_runtimes(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        include_sparkline: bool = False,
    ) -> RuntimePage:
        return self._run(
            self.aio.list_runtimes(limit=limit, cursor=cursor, include_sparkline=include_sparkline)
        )

    def runtime_history(self, runtime: str, window: Window = "1h") -> RuntimeHistory:
        """As AsyncClient.runtime_history: the runtime's points over the window."""
        return self._run(self.aio.runtime_history(runtime, window))

    def fleet_history(self, window: Window = "1h") -> FleetHistory:
        """As AsyncClient.fleet_history: every covered runtime's points, summed."""
        return self._run(self.aio.fleet_history(window))

    # -- runtime controls --------------------------------------------------------

    def get_controls(self, runtime: str) -> Controls:
        return self._run(self.aio.get_controls(runtime))

    def set_controls(
        self,
        runtime: str,
        *,
        paused: bool | Keep = KEEP,
        max_in_flight: int | Keep | None = KEEP,
        claims_per_second: float | Keep | None = KEEP,
    ) -> Controls:
        """As AsyncClient.set_controls: KEEP leaves a control as it is, None removes a limit."""
        return self._run(
            self.aio.set_controls(
                runtime,
                paused=paused,
                max_in_flight=max_in_flight,
                claims_per_second=claims_per_second,
            )
        )

    def pause(
        self, runtime: str, *, reason: str | None = None, until: datetime | str | None = None
    ) -> Controls:
        """As AsyncClient.pause: `until` ends the pause by itself, `reason` is shown."""
        return self._run(self.aio.pause(runtime, reason=reason, until=until))

    def resume(self, runtime: str) -> Controls:
        return self._run(self.aio.resume(runtime))

    # -- schedules -----------------------------------------------------------------

    def put_schedule(
        self,
        runtime: str,
        name: str,
        payload: Any,
        *,
        cron: str | None = None,
        every_seconds: int | None = None,
        timezone: str | None = None,
        overlap: Overlap | None = None,
        **options: Any,
    ) -> Schedule:
        """As AsyncClient.put_schedule: create or replace, idempotently."""
        return self._run(
            self.aio.put_schedule(
                runtime,
                name,
                payload,
                cron=cron,
                every_seconds=every_seconds,
                timezone=timezone,
                overlap=overlap,
                **options,
            )
        )

    def get_schedule(self, runtime: str, name: str) -> Schedule:
        return self._run(self.aio.get_schedule(runtime, name))

    def list_schedules(self, runtime: str) -> list[Schedule]:
        return self._run(self.aio.list_schedules(runtime))

    def delete_schedule(self, runtime: str, name: str) -> None:
        self._run(self.aio.delete_schedule(runtime, name))

    def trigger_schedule(self, runtime: str, name: str) -> ScheduleTick:
        return self._run(self.aio.trigger_schedule(runtime, name))

    def pause_schedule(self, runtime: str, name: str, note: str | None = None) -> Schedule:
        return self._run(self.aio.pause_schedule(runtime, name, note))

    def resume_schedule(self, runtime: str, name: str) -> Schedule:
        return self._run(self.aio.resume_schedule(runtime, name))

    def backfill_schedule(
        self, runtime: str, name: str, start: datetime | str, end: datetime | str
    ) -> Backfill:
        return self._run(self.aio.backfill_schedule(runtime, name, start, end))

    def iter_runtimes(self, *, page_size: int | None = None) -> Iterator[RuntimeSummary]:
        """Every runtime with live tasks that the token covers, following the cursors."""
        cursor: str | None = None
        while True:
            page = self.list_runtimes(limit=page_size, cursor=cursor)
            yield from page.runtimes
            if page.next_cursor is None:
                return
            cursor = page.next_cursor
