"""A blocking wrapper for scripts: the async client on an event loop of its own.

    with Client() as gw:
        task = gw.enqueue("demo", {"n": 1})
        print(gw.get(task.id).status)

Not for use inside a running event loop (use AsyncClient there), nor from several
threads at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Iterator
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from .client import DEFAULT_TIMEOUT_SECONDS, AsyncClient
from .models import (
    KEEP,
    Beat,
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
)

T = TypeVar("T")


class Client:
    """Every method of AsyncClient, blocking. Close it (or use `with`) when done."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._runner = asyncio.Runner()
        self.aio = AsyncClient(url, token, timeout_seconds=timeout_seconds)

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
        return self._runner.run(coro)

    @overload
    def enqueue(
        self, runtime: str, payload: Any, *, minimal: Literal[False] = False, **fields: Any
    ) -> Task: ...

    @overload
    def enqueue(
        self, runtime: str, payload: Any, *, minimal: Literal[True], **fields: Any
    ) -> str: ...

    def enqueue(
        self, runtime: str, payload: Any, *, minimal: bool = False, **fields: Any
    ) -> Task | str:
        """Fields as AsyncClient.enqueue: priority, idempotency_key, delay_seconds, ...
        With `minimal=True`, the task's id only."""
        if minimal:
            task_id: str = self._run(self.aio.enqueue(runtime, payload, minimal=True, **fields))
            return task_id
        task: Task = self._run(self.aio.enqueue(runtime, payload, **fields))
        return task

    @overload
    def enqueue_batch(
        self, runtime: str, tasks: Iterable[NewTask], *, minimal: Literal[False] = False
    ) -> list[Task]: ...

    @overload
    def enqueue_batch(
        self, runtime: str, tasks: Iterable[NewTask], *, minimal: Literal[True]
    ) -> list[str]: ...

    def enqueue_batch(
        self, runtime: str, tasks: Iterable[NewTask], *, minimal: bool = False
    ) -> list[Task] | list[str]:
        """As AsyncClient.enqueue_batch; with `minimal=True`, the tasks' ids only."""
        if minimal:
            return self._run(self.aio.enqueue_batch(runtime, tasks, minimal=True))
        return self._run(self.aio.enqueue_batch(runtime, tasks))

    def claim(self, runtime: str, worker_id: str, **fields: Any) -> list[Task]:
        return self._run(self.aio.claim(runtime, worker_id, **fields))

    def heartbeat(self, task_id: str, lease_id: str, lease_seconds: int | None = None) -> Task:
        return self._run(self.aio.heartbeat(task_id, lease_id, lease_seconds))

    def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task:
        return self._run(self.aio.complete(task_id, lease_id, result))

    def fail(self, task_id: str, lease_id: str, error: str, **fields: Any) -> Task:
        return self._run(self.aio.fail(task_id, lease_id, error, **fields))

    def release(self, task_id: str, lease_id: str) -> Task:
        return self._run(self.aio.release(task_id, lease_id))

    def complete_many(self, items: Iterable[Completion]) -> list[ItemOutcome]:
        return self._run(self.aio.complete_many(items))

    def fail_many(self, items: Iterable[Failure]) -> list[ItemOutcome]:
        return self._run(self.aio.fail_many(items))

    def heartbeat_many(self, items: Iterable[Beat]) -> list[ItemOutcome]:
        return self._run(self.aio.heartbeat_many(items))

    def cancel(self, task_id: str) -> Task:
        return self._run(self.aio.cancel(task_id))

    def retry(self, task_id: str) -> Task:
        return self._run(self.aio.retry(task_id))

    def get(self, task_id: str) -> Task:
        return self._run(self.aio.get(task_id))

    def wait(self, task_id: str, *, timeout_seconds: float, **fields: Any) -> Task:
        """As AsyncClient.wait: the finished task, or WaitTimedOut."""
        return self._run(self.aio.wait(task_id, timeout_seconds=timeout_seconds, **fields))

    def list_tasks(self, runtime: str, **query: Any) -> Page:
        return self._run(self.aio.list_tasks(runtime, **query))

    def iter_tasks(
        self, runtime: str, *, status: str | None = None, page_size: int | None = None
    ) -> Iterator[Task]:
        cursor: str | None = None
        while True:
            page = self.list_tasks(runtime, status=status, limit=page_size, cursor=cursor)
            yield from page.tasks
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def stats(self, runtime: str) -> Stats:
        return self._run(self.aio.stats(runtime))

    def list_runtimes(self, **query: Any) -> RuntimePage:
        return self._run(self.aio.list_runtimes(**query))

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

    def iter_runtimes(self, *, page_size: int | None = None) -> Iterator[RuntimeSummary]:
        cursor: str | None = None
        while True:
            page = self.list_runtimes(limit=page_size, cursor=cursor)
            yield from page.runtimes
            if page.next_cursor is None:
                return
            cursor = page.next_cursor
