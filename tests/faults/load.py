"""Steady load over the gateways, recording everything the clients saw.

Producers enqueue round-robin over the runtimes and the gateways at a fixed rate;
workers (per gateway and runtime) long-poll and complete what they get at once, but
for a few tasks they drop, as a dead daemon would. An
answer with no usable outcome (timeout, connection error, 5xx) is recorded as unknown.
All times are `time.time()` seconds, as the checker wants.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from tests.faults.checker import Claim, Complete, Enqueue, History, Lease, Unknown

MAX_IN_FLIGHT_ENQUEUES = 50
RETRY_PAUSE_SECONDS = 0.2
NOT_SENT = 0  # the status _post gives a request that never reached a gateway


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
    lease_seconds: int = 3
    max_tasks: int = 2
    request_seconds: float = 4.0  # client budget beyond the long poll's wait


@dataclass
class Load:
    """Runs producers and workers against `urls()` (read at each request, so that a
    restarted gateway is picked up) until told to stop."""

    urls: Callable[[], list[str]]
    token: str
    shape: LoadShape
    history: History = field(default_factory=History)
    statuses: Counter[int] = field(default_factory=Counter)
    _producing: asyncio.Event = field(default_factory=asyncio.Event)
    _working: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _handed: itertools.count[int] = field(default_factory=itertools.count)
    _http: aiohttp.ClientSession | None = None

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=500, force_close=False)
        self._http = aiohttp.ClientSession(connector=connector)
        self._producing.set()
        self._working.set()
        self._tasks.append(asyncio.create_task(self._produce()))
        for gateway in range(len(self.urls())):
            for runtime in self.shape.runtimes:
                for _ in range(self.shape.workers_per_runtime):
                    self._tasks.append(asyncio.create_task(self._work(gateway, runtime)))

    async def stop_producing(self) -> None:
        self._producing.clear()
        await asyncio.wait_for(self._tasks[0], self.shape.request_seconds + 5)

    async def stop(self) -> None:
        """Workers finish what they hold, then stop; bounded by one long poll."""
        self._producing.clear()
        self._working.clear()
        budget = self.shape.wait_seconds + 3 * self.shape.request_seconds + 5
        _done, pending = await asyncio.wait(self._tasks, timeout=budget)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def _post(
        self, gateway: int, path: str, body: Any, seconds: float
    ) -> tuple[int, Any] | None:
        """(status, body); (NOT_SENT, None) when no connection could be made, so the
        request surely did nothing; None for no usable answer (it may have taken effect)."""
        assert self._http is not None
        urls = self.urls()
        try:
            async with self._http.post(
                urls[gateway % len(urls)] + path,
                data=orjson.dumps(body),
                headers={"Authorization": f"Bearer {self.token}",
                         "Content-Type": "application/json"},
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
        sent = time.time()
        try:
            got = await self._post(
                n // len(busy), f"/v1/runtimes/{runtime}/tasks", body,
                self.shape.request_seconds,
            )  # fmt: skip
            if got is not None and got[0] == 201:
                self.history.enqueues.append(Enqueue(got[1]["id"], runtime, time.time()))
            elif got is None:
                self.history.unknown.append(Unknown("enqueue", runtime, sent, time.time()))
        finally:
            room.release()

    async def _work(self, gateway: int, runtime: str) -> None:
        shape = self.shape
        body = {
            "worker_id": f"w{gateway}-{runtime}",
            "max_tasks": shape.max_tasks,
            "wait_seconds": shape.wait_seconds,
            "lease_seconds": shape.lease_seconds,
        }
        while self._working.is_set():
            sent = time.time()
            got = await self._post(
                gateway, f"/v1/runtimes/{runtime}/claim", body,
                shape.wait_seconds + shape.request_seconds,
            )  # fmt: skip
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
                if self._producing.is_set() and next(self._handed) % shape.abandon_every == 0:
                    continue
                await self._complete(gateway, runtime, task)

    async def _complete(self, gateway: int, runtime: str, task: dict[str, Any]) -> None:
        """Complete, repeating it (same lease: idempotent) while the answer is unknown
        and the lease may still be honoured."""
        give_up = time.time() + self.shape.lease_seconds
        path = f"/v1/tasks/{task['id']}/complete"
        while True:
            sent = time.time()
            got = await self._post(
                gateway, path, {"lease_id": task["lease_id"]}, self.shape.request_seconds
            )
            if got is None:
                self.history.unknown.append(Unknown("complete", runtime, sent, time.time()))
            elif got[0] != NOT_SENT:
                if got[0] == 200:
                    self.history.completes.append(
                        Complete(task["id"], task["lease_id"], sent, time.time())
                    )
                return  # 409: the lease was lost and the task handed on; not ours now
            if time.time() > give_up:
                return
            gateway += 1  # the other instance, in case this one is down
            await asyncio.sleep(RETRY_PAUSE_SECONDS)
