"""Steady load over the gateways, recording everything the clients saw.

Producers enqueue round-robin over the runtimes and the gateways at a fixed rate, and
may cancel some of what they enqueued; workers (per gateway and runtime) long-poll and
complete what they get at once, but for a few tasks they drop, as a dead daemon would,
and may fail some with a retry (the task comes back and is completed later). An
answer with no usable outcome (timeout, connection error, 5xx) is recorded as unknown.
All times are `time.time()` seconds, as the checker wants.

A row may also ask for schedules: created at the start on runtimes of their own, whose
tasks the same workers drain, and backfilled now and then over their last seconds, so
that a backfill races the tick passes over the same ticks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import orjson

from tests.faults.checker import Cancel, Claim, Complete, Enqueue, Fail, History, Lease, Unknown

MAX_IN_FLIGHT_ENQUEUES = 50
RETRY_PAUSE_SECONDS = 0.2
NOT_SENT = 0  # the status _post gives a request that never reached a gateway
PUT_ATTEMPTS = 10  # a schedule's PUT, again after no usable answer
# A backfill covers its schedule's last BACKFILL_SECONDS up to BACKFILL_LAG_SECONDS ago
# (its end must not be after the database's clock, the same machine's): ticks the
# passes decided, and the last ones, which a pass may be deciding at that moment.
BACKFILL_SECONDS = 4.0
BACKFILL_LAG_SECONDS = 0.1


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule the load creates at its start: `body` is its PUT's definition;
    `backfilled`: the load backfills it (LoadShape.backfill_every_seconds)."""

    runtime: str
    name: str
    body: dict[str, Any]
    backfilled: bool = False


@dataclass(frozen=True)
class LoadShape:
    """Rates in tasks/s, durations in seconds."""

    runtimes: tuple[str, ...]  # the last one is sparse: its pollers mostly park on a verdict
    enqueue_rate: float = 40.0
    sparse_every: int = 30  # one enqueue in this many goes to the sparse runtime
    # While producing, one task in this many is held and never completed, as by a
    # daemon that died: its lease must run out and the janitor hand the task on.
    abandon_every: int = 25
    workers_per_runtime: int = 2  # on each gateway
    wait_seconds: float = 2.0
    # The sparse runtime's pollers park for long, as real daemons do, so that a poll
    # left parked on a verdict across a fault shows (stale-empty, or a long recovery).
    sparse_wait_seconds: float = 20.0
    lease_seconds: int = 3
    max_tasks: int = 2
    request_seconds: float = 4.0  # client budget beyond the long poll's wait
    connections: int = 500  # the client's connection limit: room for every parked poll
    # One task in this many is failed with a retry on its first attempt (0: none); it
    # comes back after `retry_after_seconds` and is completed then.
    fail_every: int = 0
    retry_after_seconds: float = 1.0
    # One enqueue in this many is cancelled by its producer (0: none), between 0 and
    # 0.45 s after its 201: some while queued, some while held, most after their complete.
    cancel_every: int = 0
    # How long (s) a producer retries an enqueue with no usable answer (a timeout, a
    # connection error, a 5xx, a 429), always with the same idempotency key, so that a
    # retry after a lost answer gets the task already stored, never a second one; its
    # 200 (the replay) counts as the enqueue's answer. 0: no retry, no key.
    enqueue_retry_seconds: float = 0.0
    # Schedules created at the start, their runtimes worked as the others are; while
    # producing, one of those marked `backfilled` backfilled every
    # `backfill_every_seconds` (0: never).
    schedules: tuple[ScheduleSpec, ...] = ()
    backfill_every_seconds: float = 0.0

    @property
    def schedule_runtimes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.runtime for s in self.schedules))


@dataclass
class Load:
    """Runs producers and workers against `urls()` (read at each request, so that a
    restarted gateway is picked up) until told to stop."""

    urls: Callable[[], list[str]]
    token: str
    shape: LoadShape
    history: History = field(default_factory=History)
    statuses: Counter[int] = field(default_factory=Counter)
    # Each schedule's first tick, (runtime, name) -> the `next_run_at` its PUT answered.
    first_ticks: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # Backfills by their answer ("answered 200", "no answer", "not sent"...), and "ticks
    # enqueued" by those answered 200.
    backfills: Counter[str] = field(default_factory=Counter)
    _producing: asyncio.Event = field(default_factory=asyncio.Event)
    _working: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _handed: itertools.count[int] = field(default_factory=itertools.count)
    _claiming: set[asyncio.Task[Any]] = field(default_factory=set)  # workers inside a poll
    _http: aiohttp.ClientSession | None = None

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.shape.connections, force_close=False)
        self._http = aiohttp.ClientSession(connector=connector)
        await self._create_schedules()
        self._producing.set()
        self._working.set()
        self._tasks.append(asyncio.create_task(self._produce()))
        for gateway in range(len(self.urls())):
            for runtime in self.shape.runtimes + self.shape.schedule_runtimes:
                for _ in range(self.shape.workers_per_runtime):
                    self._tasks.append(asyncio.create_task(self._work(gateway, runtime)))
        if any(s.backfilled for s in self.shape.schedules) and self.shape.backfill_every_seconds:
            self._tasks.append(asyncio.create_task(self._backfill()))

    async def stop_producing(self) -> None:
        self._producing.clear()
        await asyncio.wait_for(self._tasks[0], self.shape.request_seconds + 5)

    def wait_for(self, runtime: str) -> float:
        """The long poll's wait (s) of `runtime`'s workers."""
        sparse = runtime == self.shape.runtimes[-1]
        return self.shape.sparse_wait_seconds if sparse else self.shape.wait_seconds

    async def stop(self) -> None:
        """Workers finish what they hold, then stop. A parked poll is abandoned at once
        (recorded as a claim with no answer), so that long waits do not stretch a row."""
        self._producing.clear()
        self._working.clear()
        for worker in list(self._claiming):
            worker.cancel()
        budget = self.shape.wait_seconds + 3 * self.shape.request_seconds + 5
        _done, pending = await asyncio.wait(self._tasks, timeout=budget)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _post(
        self,
        gateway: int,
        path: str,
        body: Any,
        seconds: float,
        key: str | None = None,
        method: str = "POST",
    ) -> tuple[int, Any] | None:
        """(status, body); (NOT_SENT, None) when no connection could be made, so the
        request surely did nothing; None for no usable answer (it may have taken effect)."""
        assert self._http is not None
        urls = self.urls()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        try:
            async with self._http.request(
                method,
                urls[gateway % len(urls)] + path,
                data=orjson.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=seconds),
            ) as resp:  # fmt: skip
                raw = await resp.read()
                self.statuses[resp.status] += 1
                if resp.status >= 500:
                    return None
                return resp.status, orjson.loads(raw) if raw else None
        except aiohttp.ClientConnectorError:
            return NOT_SENT, None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
            return None

    async def _create_schedules(self) -> None:
        """PUT each schedule, again after no usable answer, and record its first tick:
        the `next_run_at` of the answer. A 200 (an earlier PUT created it, its answer
        lost) names the next tick not yet decided, so that the check starts there."""
        for i, spec in enumerate(self.shape.schedules):
            path = f"/v1/runtimes/{spec.runtime}/schedules/{spec.name}"
            got = None
            for attempt in range(PUT_ATTEMPTS):
                got = await self._post(i + attempt, path, spec.body,
                                       self.shape.request_seconds, method="PUT")  # fmt: skip
                if got is not None and got[0] in (200, 201):
                    first = datetime.fromisoformat(got[1]["next_run_at"])
                    self.first_ticks[(spec.runtime, spec.name)] = first
                    break
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
            else:
                raise RuntimeError(f"PUT {path} was not answered 200 or 201: {got}")

    async def _backfill(self) -> None:
        """While producing, every backfill_every_seconds, one schedule (in turn) is
        backfilled over its last BACKFILL_SECONDS, through the gateways in turn."""
        specs = [s for s in self.shape.schedules if s.backfilled]
        for n in itertools.count():
            await asyncio.sleep(self.shape.backfill_every_seconds)
            if not self._producing.is_set():
                return
            spec = specs[n % len(specs)]
            end = datetime.now(UTC) - timedelta(seconds=BACKFILL_LAG_SECONDS)
            start = max(self.first_ticks[(spec.runtime, spec.name)],
                        end - timedelta(seconds=BACKFILL_SECONDS))  # fmt: skip
            if start > end:
                continue
            path = f"/v1/runtimes/{spec.runtime}/schedules/{spec.name}:backfill"
            body = {"start": start.isoformat(), "end": end.isoformat()}
            got = await self._post(n, path, body, self.shape.request_seconds)
            if got is None or got[0] == NOT_SENT:
                self.backfills["no answer" if got is None else "not sent"] += 1
                continue
            self.backfills[f"answered {got[0]}"] += 1
            if got[0] == 200:
                self.backfills["ticks enqueued"] += len(got[1]["enqueued"])

    async def _produce(self) -> None:
        room = asyncio.Semaphore(MAX_IN_FLIGHT_ENQUEUES)
        pending: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        for n in itertools.count():
            if not self._producing.is_set():
                break
            await asyncio.sleep(max(0.0, started + n / self.shape.enqueue_rate - time.monotonic()))
            await room.acquire()
            task = asyncio.create_task(self._enqueue(n, room))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending, return_exceptions=True)

    async def _enqueue(self, n: int, room: asyncio.Semaphore) -> None:
        busy = self.shape.runtimes[:-1]
        sparse = n % self.shape.sparse_every == 0
        runtime = self.shape.runtimes[-1] if sparse else busy[n % len(busy)]
        # max_attempts high: a lease lost to a fault must come back, not end dead.
        body = {"payload": {"n": n}, "max_attempts": 100}
        retrying = self.shape.enqueue_retry_seconds > 0
        key = f"enqueue-{n}" if retrying else None
        give_up = time.time() + self.shape.enqueue_retry_seconds
        try:
            for attempt in itertools.count():
                sent = time.time()
                got = await self._post(
                    n // len(busy) + attempt, f"/v1/runtimes/{runtime}/tasks", body,
                    self.shape.request_seconds, key,
                )  # fmt: skip
                if got is not None and (got[0] == 201 or (got[0] == 200 and retrying)):
                    answered = time.time()
                    self.history.enqueues.append(
                        Enqueue(got[1]["id"], runtime, answered, sent, replayed=got[0] == 200)
                    )
                    every = self.shape.cancel_every
                    if every and n % every == 1:
                        await asyncio.sleep((n // every) % 10 / 20)  # 0 to 0.45 s
                        await self._cancel(n, runtime, got[1]["id"])
                    return
                if got is None:
                    self.history.unknown.append(Unknown("enqueue", runtime, sent, time.time()))
                elif got[0] not in (NOT_SENT, 429):
                    return  # refused for good
                if not retrying or time.time() > give_up:
                    return
                await asyncio.sleep(RETRY_PAUSE_SECONDS)  # then the other gateway
        finally:
            room.release()

    async def _cancel(self, n: int, runtime: str, task_id: str) -> None:
        sent = time.time()
        got = await self._post(n, f"/v1/tasks/{task_id}/cancel", {}, self.shape.request_seconds)
        if got is None:
            self.history.unknown.append(Unknown("cancel", runtime, sent, time.time(), task_id))
        elif got[0] == 200:
            self.history.cancels.append(Cancel(task_id, sent, time.time()))

    async def _work(self, gateway: int, runtime: str) -> None:
        shape = self.shape
        wait = self.wait_for(runtime)
        body = {
            "worker_id": f"w{gateway}-{runtime}",
            "max_tasks": shape.max_tasks,
            "wait_seconds": wait,
            "lease_seconds": shape.lease_seconds,
        }
        me = asyncio.current_task()
        assert me is not None
        while self._working.is_set():
            sent = time.time()
            self._claiming.add(me)
            try:
                got = await self._post(
                    gateway, f"/v1/runtimes/{runtime}/claim", body, wait + shape.request_seconds
                )
            except asyncio.CancelledError:  # stop(): it may have leased and been given back
                self.history.unknown.append(Unknown("claim", runtime, sent, time.time()))
                raise
            finally:
                self._claiming.discard(me)
            answered = time.time()
            if got is None:
                self.history.unknown.append(Unknown("claim", runtime, sent, answered))
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            if got[0] != 200:  # refused, 429 and the like: nothing was handed out
                await asyncio.sleep(RETRY_PAUSE_SECONDS)
                continue
            tasks = got[1]["tasks"]
            leases = tuple(Lease(t["id"], t["lease_id"]) for t in tasks)
            self.history.claims.append(Claim(runtime, sent, answered, shape.lease_seconds, leases))
            for task in tasks:
                handed = next(self._handed)
                if self._producing.is_set() and handed % shape.abandon_every == 0:
                    continue
                fail = shape.fail_every and task["attempts"] == 1 and handed % shape.fail_every == 1
                await self._finish(gateway, runtime, task, "fail" if fail else "complete")

    async def _finish(self, gateway: int, runtime: str, task: dict[str, Any], kind: str) -> None:
        """Complete (or fail with a retry), repeating it with the same lease while the
        answer is unknown and the lease may still be honoured."""
        give_up = time.time() + self.shape.lease_seconds
        path = f"/v1/tasks/{task['id']}/{kind}"
        body: dict[str, Any] = {"lease_id": task["lease_id"]}
        if kind == "fail":
            body.update(error="failed on purpose", retry=True,
                        retry_after_seconds=self.shape.retry_after_seconds)  # fmt: skip
        while True:
            sent = time.time()
            got = await self._post(gateway, path, body, self.shape.request_seconds)
            if got is None:
                self.history.unknown.append(Unknown(kind, runtime, sent, time.time()))
            elif got[0] != NOT_SENT:
                if got[0] == 200 and kind == "complete":
                    done = Complete(task["id"], task["lease_id"], sent, time.time())
                    self.history.completes.append(done)
                elif got[0] == 200:
                    self.history.fails.append(Fail(task["id"], task["lease_id"], sent, time.time()))
                return  # 409: the lease was lost and the task handed on; not ours now
            if time.time() > give_up:
                return
            gateway += 1  # the other instance, in case this one is down
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
