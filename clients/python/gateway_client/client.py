"""The async client: one method per endpoint of the gateway's API, over one aiohttp
session whose connections are reused across calls.

Configuration comes from arguments, else GATEWAY_URL (default http://127.0.0.1:8080)
and GATEWAY_TOKEN.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, overload

import aiohttp

from .backoff import Backoff
from .bulk import BulkCalls
from .calls.history import HistoryCalls
from .errors import (
    GatewayError,
    TransportError,
    ValidationFailed,
    WaitTimedOut,
    error_from_answer,
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
    format_time,
)
from .paths import runtime_path, task_path
from .retries import own_key, retrying
from .schedules import ScheduleCalls
from .tracing.propagation import request_headers

DEFAULT_URL = "http://127.0.0.1:8080"
# Any call but a long poll; a database under load can take a few seconds.
DEFAULT_TIMEOUT_SECONDS = 30.0
# A long poll may take its whole wait_seconds: its timeout is that plus this margin.
LONG_POLL_MARGIN_SECONDS = 10.0
DEFAULT_CONNECTIONS = 100
# The statuses a task never leaves by itself: `wait()` returns once the task has one.
FINISHED: frozenset[TaskStatus] = frozenset({"completed", "dead", "expired", "cancelled"})
# One request of `wait()` waits at most this long on the gateway: within the default
# GATEWAY_MAX_WAIT_SECONDS (60), and short enough for proxies' idle timeouts.
WAIT_STEP_SECONDS = 20.0
# RFC 7240: asks an enqueue to answer the tasks' ids only (`minimal=True`).
PREFER_MINIMAL = {"Prefer": "return=minimal"}


def config_from_env(url: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """The arguments, else GATEWAY_URL / GATEWAY_TOKEN, else the defaults."""
    base = url or os.environ.get("GATEWAY_URL") or DEFAULT_URL
    return base.rstrip("/"), token or os.environ.get("GATEWAY_TOKEN") or None


class AsyncClient(ScheduleCalls, BulkCalls, HistoryCalls):
    """Talks to one gateway. Use it as `async with AsyncClient() as gw:`, or call
    `close()`; the session is opened on the first call, inside the running loop."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        long_poll_margin_seconds: float = LONG_POLL_MARGIN_SECONDS,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self.url, self.token = config_from_env(url, token)
        self.timeout_seconds = timeout_seconds
        self.long_poll_margin_seconds = long_poll_margin_seconds
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"User-Agent": "claim-gateway-client/0.1"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections),
                headers=headers,
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One call: (status, decoded JSON body, headers); raises the GatewayError
        subclass of an error answer, or TransportError when no answer came. `path` is
        sent as given: quote an id put into it with `paths.segment`."""
        session = self._open()
        timeout = aiohttp.ClientTimeout(total=timeout_seconds or self.timeout_seconds)
        data = None if body is None else json.dumps(body).encode()
        send_headers = {"Content-Type": "application/json"} if data is not None else {}
        send_headers.update(headers or {})
        try:
            async with session.request(
                method,
                self.url + path,
                data=data,
                params=params,
                headers=send_headers,
                timeout=timeout,
            ) as resp:
                raw = await resp.read()
                status, answer_headers = resp.status, resp.headers
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise TransportError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode("utf-8", "replace")
        if status >= 400:
            raise error_from_answer(status, decoded, answer_headers)
        return status, decoded, answer_headers

    async def _task(self, method: str, path: str, body: Any = None) -> Task:
        _, data, _ = await self.request(method, path, body)
        return Task.from_json(data)

    # -- producers ---------------------------------------------------------------

    @overload
    async def enqueue(
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
    async def enqueue(
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

    async def enqueue(
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
        """A new task (or, for a repeated idempotency key, the one already stored).
        With `minimal=True`, only its id: the gateway answers no more
        (`Prefer: return=minimal`). With `retry_seconds`, a retryable failure (overload,
        no answer) is retried for up to that long, honouring Retry-After; the enqueue
        then always carries an idempotency key (yours, or one the client makes), so that
        a retry after a lost answer gets the stored task, never a second one.

        `traceparent` and `tracestate` (W3C Trace Context) are stored with the task, and
        handed to whatever claims it; without them, the active OpenTelemetry span's
        context is sent, when OpenTelemetry is installed (see `tracing`)."""
        if retry_seconds and idempotency_key is None:
            idempotency_key = own_key()
        body = NewTask(
            payload, priority, idempotency_key, delay_seconds, run_at, ttl_seconds, max_attempts
        ).to_json()
        path = runtime_path(runtime, "/tasks")
        headers = request_headers(traceparent, tracestate)
        if minimal:
            headers.update(PREFER_MINIMAL)

        async def send() -> Task | str:
            _, data, _ = await self.request("POST", path, body, headers=headers)
            if not minimal:
                return Task.from_json(data)
            return str(data["id"])  # a gateway that ignores Prefer answers the task: same id

        return await retrying(send, retry_seconds)

    @overload
    async def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: Literal[False] = False,
        retry_seconds: float = 0.0,
    ) -> list[Task]: ...

    @overload
    async def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: Literal[True],
        retry_seconds: float = 0.0,
    ) -> list[str]: ...

    async def enqueue_batch(
        self,
        runtime: str,
        tasks: Iterable[NewTask],
        *,
        minimal: bool = False,
        retry_seconds: float = 0.0,
    ) -> list[Task] | list[str]:
        """1-1000 tasks, all or nothing; answered in the order given. With
        `minimal=True`, only their ids, which spares the gateway and this client the
        payloads coming back (`Prefer: return=minimal`). `retry_seconds` as for
        `enqueue`: each task without an idempotency key gets one of the client's own.
        A task's `trace` is its own; the others get the active OpenTelemetry span's
        context, when OpenTelemetry is installed."""
        if retry_seconds:
            tasks = [
                t if t.idempotency_key else replace(t, idempotency_key=own_key()) for t in tasks
            ]
        body = {"tasks": [t.to_json() for t in tasks]}
        path = runtime_path(runtime, "/tasks:batch")
        headers = request_headers(None, None)
        if minimal:
            headers.update(PREFER_MINIMAL)

        async def send() -> list[Task] | list[str]:
            _, data, _ = await self.request("POST", path, body, headers=headers)
            if not minimal:
                return [Task.from_json(t) for t in data["tasks"]]
            return [str(t["id"]) for t in data["tasks"]]

        return await retrying(send, retry_seconds)

    async def cancel(self, task_id: str) -> Task:
        return await self._task("POST", task_path(task_id, "/cancel"))

    async def retry(self, task_id: str) -> Task:
        return await self._task("POST", task_path(task_id, "/retry"))

    # -- daemons -----------------------------------------------------------------

    async def claim(
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
        """Up to `max_tasks` tasks, each with a lease; waits up to `wait_seconds` for
        work, so its timeout is that plus `long_poll_margin_seconds`.

        `complete` and `fail` report earlier tasks in the same request (at most 1000
        together, each task once), each as `complete_many` and `fail_many` would: the
        gateway applies them before it claims, and the answer's `acks` says what became
        of each, whatever became of the claim (see Claimed)."""
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "max_tasks": max_tasks,
            "wait_seconds": wait_seconds,
        }
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        if complete is not None:
            body["complete"] = [item.to_json() for item in complete]
        if fail is not None:
            body["fail"] = [item.to_json() for item in fail]
        _, data, _ = await self.request(
            "POST",
            runtime_path(runtime, "/claim"),
            body,
            timeout_seconds=wait_seconds + self.long_poll_margin_seconds,
        )
        return Claimed.from_json(data)

    async def heartbeat(
        self, task_id: str, lease_id: str, lease_seconds: int | None = None
    ) -> Task:
        """Extends the lease; the answer's `cancel_requested` says whether to stop."""
        body: dict[str, Any] = {"lease_id": lease_id}
        if lease_seconds is not None:
            body["lease_seconds"] = lease_seconds
        return await self._task("POST", task_path(task_id, "/heartbeat"), body)

    async def complete(self, task_id: str, lease_id: str, result: Any = None) -> Task:
        body: dict[str, Any] = {"lease_id": lease_id}
        if result is not None:
            body["result"] = result
        return await self._task("POST", task_path(task_id, "/complete"), body)

    async def fail(
        self,
        task_id: str,
        lease_id: str,
        error: str,
        *,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task:
        """Queued again after a backoff (or `retry_after_seconds`), or `dead`."""
        body: dict[str, Any] = {"lease_id": lease_id, "error": error, "retry": retry}
        if retry_after_seconds is not None:
            body["retry_after_seconds"] = retry_after_seconds
        return await self._task("POST", task_path(task_id, "/fail"), body)

    async def release(self, task_id: str, lease_id: str) -> Task:
        """Queued again at once (or `cancelled`, when a cancel was requested)."""
        return await self._task("POST", task_path(task_id, "/release"), {"lease_id": lease_id})

    # -- batch lease operations ---------------------------------------------------
    # One request for many tasks (1-1000, each task once): one ItemOutcome per item, in
    # the order given. An item's refusal (lease_lost, not_found) is its outcome, not an
    # exception; only a problem with the whole request raises.

    async def _many(self, op: str, items: Iterable[Any]) -> list[ItemOutcome]:
        body = {"tasks": [item.to_json() for item in items]}
        _, data, _ = await self.request("POST", f"/v1/tasks:{op}", body)
        return [ItemOutcome.from_json(r) for r in data["results"]]

    async def complete_many(self, items: Iterable[Completion]) -> list[ItemOutcome]:
        """Each as `complete`: `completed` (also for a repeat with the same lease) or
        `cancelled`."""
        return await self._many("complete", items)

    async def fail_many(self, items: Iterable[Failure]) -> list[ItemOutcome]:
        """Each as `fail`: `queued` (with `run_at`), `dead` or `cancelled`."""
        return await self._many("fail", items)

    async def heartbeat_many(self, items: Iterable[Beat]) -> list[ItemOutcome]:
        """Each as `heartbeat`: `extended`, with `cancel_requested` saying whether to stop."""
        return await self._many("heartbeat", items)

    # -- reading -----------------------------------------------------------------

    async def get(self, task_id: str) -> Task:
        return await self._task("GET", task_path(task_id))

    async def wait(
        self,
        task_id: str,
        *,
        timeout_seconds: float,
        step_seconds: float = WAIT_STEP_SECONDS,
    ) -> Task:
        """The task once it has finished (`status` in FINISHED: completed, dead,
        expired or cancelled), waiting up to `timeout_seconds` in all; WaitTimedOut
        (with the task as last read) when it has not finished by then.

        Repeats `GET /v1/tasks/{id}?wait_seconds=...`, each waiting at most
        `step_seconds` on the gateway, which answers as soon as the task finishes.
        A step above the gateway's cap (GATEWAY_MAX_WAIT_SECONDS) is halved until it
        is accepted. Retryable errors (overload, shutdown, network) are retried with
        backoff while time is left; then the last one is raised."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        backoff = Backoff()
        while True:
            remaining = deadline - loop.time()
            wait = max(0.0, min(step_seconds, remaining))
            asked_at = loop.time()
            try:
                _, data, _ = await self.request(
                    "GET",
                    task_path(task_id),
                    params={"wait_seconds": f"{wait:.3f}"},
                    timeout_seconds=wait + self.long_poll_margin_seconds,
                )
            except ValidationFailed as exc:
                if exc.field != "wait_seconds" or step_seconds <= 1:
                    raise
                step_seconds = max(1.0, step_seconds / 2)  # above this gateway's cap
                continue
            except GatewayError as exc:
                if not exc.retryable or deadline - loop.time() <= 0:
                    raise
                pause = backoff.next_delay(exc.retry_after_seconds)
                await asyncio.sleep(min(pause, max(deadline - loop.time(), 0.0)))
                continue
            task = Task.from_json(data)
            if task.status in FINISHED:
                return task
            if deadline - loop.time() <= 0:
                raise WaitTimedOut(
                    f"task {task_id} had not finished after {timeout_seconds:g} s "
                    f"(it is {task.status})",
                    task,
                )
            if loop.time() - asked_at < wait / 2:
                # Unfinished, yet answered early: a gateway shutting down answers at
                # once. Pause rather than ask it again in a tight loop.
                pause = backoff.next_delay()
                await asyncio.sleep(min(pause, max(deadline - loop.time(), 0.0)))

    async def list_tasks(
        self,
        runtime: str,
        *,
        status: TaskStatus | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        schedule: str | None = None,
    ) -> Page:
        """One page, oldest first; pass its `next_cursor` back for the next. `schedule`:
        only the tasks that schedule made."""
        given = (("status", status), ("limit", limit), ("cursor", cursor), ("schedule", schedule))
        params = {k: str(v) for k, v in given if v is not None}
        _, data, _ = await self.request("GET", runtime_path(runtime, "/tasks"), params=params)
        return Page([Task.from_json(t) for t in data["tasks"]], data.get("next_cursor"))

    async def iter_tasks(
        self,
        runtime: str,
        *,
        status: TaskStatus | None = None,
        page_size: int | None = None,
        schedule: str | None = None,
    ) -> AsyncIterator[Task]:
        """Every task of the runtime (with that status, made by that schedule),
        following the cursors."""
        cursor: str | None = None
        while True:
            page = await self.list_tasks(
                runtime, status=status, limit=page_size, cursor=cursor, schedule=schedule
            )
            for task in page.tasks:
                yield task
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def stats(self, runtime: str) -> Stats:
        _, data, _ = await self.request("GET", runtime_path(runtime, "/stats"))
        return Stats.from_json(data)

    async def list_runtimes(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        include_sparkline: bool = False,
    ) -> RuntimePage:
        """One page of the runtimes with live tasks (that the token covers), in id
        order; pass its `next_cursor` back for the next. `include_sparkline`: each with
        its queue depth over the last hour, in the same request."""
        params = {k: str(v) for k, v in (("limit", limit), ("cursor", cursor)) if v is not None}
        if include_sparkline:
            params["include"] = "sparkline"
        _, data, _ = await self.request("GET", "/v1/runtimes", params=params)
        return RuntimePage(
            [RuntimeSummary.from_json(r) for r in data["runtimes"]], data["next_cursor"]
        )

    # -- runtime controls (the `control` scope, or admin, to change them) --

    async def get_controls(self, runtime: str) -> Controls:
        """The runtime's pause state and limits."""
        _, data, _ = await self.request("GET", runtime_path(runtime, "/controls"))
        return Controls.from_json(data)

    async def set_controls(
        self,
        runtime: str,
        *,
        paused: bool | Keep = KEEP,
        max_in_flight: int | Keep | None = KEEP,
        claims_per_second: float | Keep | None = KEEP,
    ) -> Controls:
        """Change the controls given; KEEP (the default) leaves one as it is, None
        removes a limit. Returns them all after the change."""
        fields = {
            "paused": paused,
            "max_in_flight": max_in_flight,
            "claims_per_second": claims_per_second,
        }
        body = {k: v for k, v in fields.items() if v is not KEEP}
        _, data, _ = await self.request("PATCH", runtime_path(runtime, "/controls"), body)
        return Controls.from_json(data)

    async def pause(
        self, runtime: str, *, reason: str | None = None, until: datetime | str | None = None
    ) -> Controls:
        """Claims of the runtime hand out nothing until it is resumed, or until `until`
        (an aware datetime or an RFC 3339 string, in the future) if given; `reason` (at
        most 500 characters) is shown with its controls. Idempotent; pausing again
        replaces the reason and end."""
        body: dict[str, str] = {}
        if reason is not None:
            body["reason"] = reason
        if until is not None:
            body["until"] = format_time(until)
        _, data, _ = await self.request("POST", runtime_path(runtime, ":pause"), body or None)
        return Controls.from_json(data)

    async def resume(self, runtime: str) -> Controls:
        """Claims of the runtime hand out tasks again; idempotent."""
        _, data, _ = await self.request("POST", runtime_path(runtime, ":resume"))
        return Controls.from_json(data)

    async def iter_runtimes(self, *, page_size: int | None = None) -> AsyncIterator[RuntimeSummary]:
        """Every runtime with live tasks that the token covers, following the cursors."""
        cursor: str | None = None
        while True:
            page = await self.list_runtimes(limit=page_size, cursor=cursor)
            for runtime in page.runtimes:
                yield runtime
            if page.next_cursor is None:
                return
            cursor = page.next_cursor


__all__ = ["AsyncClient", "GatewayError", "config_from_env"]
