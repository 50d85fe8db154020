"""Admission control on the database path: how much work a process lets queue for its
Postgres connections, and who goes first.

Every statement the gateway sends runs on one of GATEWAY_DB_POOL_MAX pooled
connections (gateway/store/base.py). Under overload, requests used to wait in line for
one until their client gave up, and the gateway then did their work anyway; once the
overload ended, the line was still there. Here a request that would wait longer than
its share is refused at once, before anything is sent (`503 database_busy`, or `429
overloaded` for a claim, with Retry-After), so the line stays short and the requests
that are let in are served at the unloaded pace.

- **The share.** A request's expected wait is its place in line divided by the
  connections, times how long a connection is held: the exponentially weighted mean
  of the holds that ended, or, when Postgres has just slowed down and even the newest
  of the current holds is older than that, its age. Work (enqueues, claims, reads) is
  refused when that exceeds GATEWAY_DB_QUEUE_BUDGET_MS; the line it may join is
  shown as `gateway_db_queue_limit`.
- **Priorities.** Releases (completes, fails, heartbeats, releases, batch acknowledgements,
  and the gateway's own work: the janitor, giving back undelivered leases, loading a
  token) free work and keep leases alive, and an operator's controls, the probes and the
  metrics must work when they are needed most: they go before any waiting work, and are
  refused only when no connection comes free within GATEWAY_DB_ACQUIRE_TIMEOUT_MS.
- What a request is, the HTTP layer says (`priority`, a context variable, set per
  endpoint); a task started by a request inherits it. Outside a request (background
  work) it is RELEASE.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Iterator
from enum import IntEnum

from .errors import DatabaseBusy
from .metrics import Metrics

# Weight of the newest hold in the mean hold time.
HOLD_WEIGHT = 0.2


class Priority(IntEnum):
    """Who goes first for a database connection: the higher, the sooner."""

    WORK = 0  # enqueues, claims, reads: refused past the queue budget
    RELEASE = 1  # completes, fails, heartbeats, releases, background work


priority: contextvars.ContextVar[Priority] = contextvars.ContextVar(
    "gateway_db_priority", default=Priority.RELEASE
)


@contextlib.contextmanager
def releasing() -> Iterator[None]:
    """Within it, statements take a connection as releases do: for the completes and
    fails a claim carries, which free work though they come with a claim."""
    token = priority.set(Priority.RELEASE)
    try:
        yield
    finally:
        priority.reset(token)


class Admission:
    """The connections' line for one process (owned by the Store). `slots` is the pool's
    size: at most that many hold a connection at once, so the pool itself never makes
    anyone wait; the line is here, where its order and its length are decided."""

    def __init__(self, slots: int, budget_ms: float, timeout_ms: float, metrics: Metrics) -> None:
        self._slots = slots
        self._budget_ms = budget_ms
        self._timeout_ms = timeout_ms
        self._metrics = metrics
        self._held = 0
        self._started: dict[int, float] = {}  # loop time each current hold began, by grant
        self._grants = 0
        self._lines: dict[Priority, deque[asyncio.Future[None]]] = {p: deque() for p in Priority}
        self.hold_ms = 0.0  # the mean hold, 0 until one ended
        metrics.db_queue_limit.set_function(self.queue_limit)

    def queue_limit(self) -> float:
        """How many requests of work may wait in line now, by the budget and the hold
        (without a measured hold yet: no limit below the acquire timeout's)."""
        hold_ms = self._hold_ms()
        if hold_ms <= 0:
            return float("inf")
        return self._budget_ms / hold_ms * self._slots

    def _hold_ms(self) -> float:
        """How long a connection is held, in ms: the mean of the holds that ended, or the
        age of the newest current one when every connection is held and even that one
        is older (Postgres slowed down since the mean was made)."""
        if self._held < self._slots or not self._started:
            return self.hold_ms
        newest = max(self._started.values())
        return max(self.hold_ms, (asyncio.get_running_loop().time() - newest) * 1000)

    def _ahead(self, wanted: Priority) -> int:
        """Waiters that would be served before a newcomer of priority `wanted`."""
        return sum(len(line) for p, line in self._lines.items() if p >= wanted)

    def expected_wait_ms(self, wanted: Priority) -> float:
        """The wait a newcomer of priority `wanted` can expect for a connection, in ms."""
        if self._held < self._slots:
            return 0.0
        return (self._ahead(wanted) + 1) / self._slots * self._hold_ms()

    def crowded(self) -> bool:
        """True when work arriving now would wait past its budget: `acquire` would
        refuse it."""
        return self.expected_wait_ms(Priority.WORK) > self._budget_ms

    def refusal(self) -> DatabaseBusy:
        """What work refused for the line's length is answered."""
        return DatabaseBusy(
            f"the database queue is longer than {self._budget_ms:g} ms of work "
            "(GATEWAY_DB_QUEUE_BUDGET_MS); retry"
        )

    async def acquire(self) -> int:
        """Wait for a connection slot, in priority order (arrival order within one);
        returns the grant, for `release`. Raises DatabaseBusy at once when work would
        wait past its budget, or when no slot came free within the acquire timeout."""
        wanted = priority.get()
        loop = asyncio.get_running_loop()
        if self._held < self._slots and not self._ahead(Priority.WORK):
            self._held += 1
            return self._grant(loop.time())
        if wanted is Priority.WORK and self.expected_wait_ms(wanted) > self._budget_ms:
            self._metrics.shed.labels("database_queue").inc()
            raise self.refusal()
        waiter: asyncio.Future[None] = loop.create_future()
        line = self._lines[wanted]
        line.append(waiter)
        try:
            async with asyncio.timeout(self._timeout_ms / 1000):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # granted as its wait ended: the slot goes on
            elif waiter in line:
                line.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise self.timed_out() from None
            raise
        return self._grant(loop.time())

    def timed_out(self) -> DatabaseBusy:
        """Counted, what a request that got no connection within the acquire timeout
        is answered: from the line, or from the pool while Postgres is slow to accept a
        new connection (gateway/store/base.py)."""
        self._metrics.db_acquire_timeouts.inc()
        return DatabaseBusy(
            f"no database connection came free within {self._timeout_ms:g} ms "
            "(GATEWAY_DB_ACQUIRE_TIMEOUT_MS); retry"
        )

    def _grant(self, now: float) -> int:
        self._grants += 1
        self._started[self._grants] = now
        return self._grants

    def release(self, grant: int) -> None:
        """A slot given back; `grant` is what `acquire` returned."""
        started = self._started.pop(grant)
        held_ms = (asyncio.get_running_loop().time() - started) * 1000
        self.hold_ms = (
            held_ms if not self.hold_ms else (self.hold_ms + HOLD_WEIGHT * (held_ms - self.hold_ms))
        )
        self._hand_on()

    def _hand_on(self) -> None:
        """The slot goes to the first waiter of the highest priority, else back."""
        for wanted in sorted(self._lines, reverse=True):
            line = self._lines[wanted]
            while line:
                waiter = line.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._held -= 1
