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
- **A line that stands gets short.** The budget lets a burst wait its turn; but under
  a flood that does not stop, a line kept at the budget's length makes every request
  let in wait the whole budget. So the line is judged as CoDel judges a queue: once
  every request of work granted a connection for STANDING_INTERVAL_SECONDS has waited
  longer than a tenth of the budget (STANDING_SHARE), the line is standing, and work
  is let in only for an expected wait within that tenth. It stands until the line has
  no work left waiting (or a request finds a connection free with nobody waiting),
  once STANDING_CALM_SECONDS have passed since that judgement last found it standing.
  A burst that is served within the interval never sees it.
- **Priorities.** Releases (completes, fails, heartbeats, releases, batch acknowledgements,
  and the gateway's own work: the janitor, giving back undelivered leases, loading a
  token) free work and keep leases alive, and an operator's controls, the probes and the
  metrics must work when they are needed most: they go before any waiting work, and are
  refused only when no connection comes free within GATEWAY_DB_ACQUIRE_TIMEOUT_MS.
  One exception bounds the wait of work that was let in: once the oldest waiting
  request of work has waited a tenth of its budget, it is served next, and so every
  other slot while releases wait too.
- **Work whose client has left is not started.** The HTTP layer hands each request of
  work its connection's `Caller` (`caller`, a context variable), which the HTTP
  protocol tells when the connection is lost. Such work waiting in line leaves it at
  once, and work whose client is gone by the time it would be granted a connection is
  not granted one: it is refused with ClientGone, nothing sent to Postgres, counted as
  `gateway_shed_total{reason="client_gone"}`. Releases are applied whatever their
  client does: a complete that was sent frees work (its worker did the task), and a
  heartbeat or a fail costs one statement.
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
from typing import NamedTuple

from .errors import ClientGone, DatabaseBusy
from .metrics import Metrics
from .refusals import Refusals

# Weight of the newest hold in the mean hold time.
HOLD_WEIGHT = 0.2
# A line stands once the work it granted waited past STANDING_SHARE of the budget for
# this long; it then lets work in for that share only (CoDel's interval and target:
# Nichols and Jacobson, "Controlling Queue Delay", 2012). A tenth: under a flood of
# enqueues the requests let in waited 42 to 47 ms at p50 against 70 to 76 at a fifth,
# for the same work done (bench/README.md, 2026-11-29).
STANDING_INTERVAL_SECONDS = 0.1
STANDING_SHARE = 0.1
# A line that stood stands on through a moment without work waiting, until this long
# after the judgement last found it standing. A flood does not keep the line full: the
# clients it refused are held about a second (gateway/http/shedding.py) and come back
# together, so the line emptied every second or two, stood no more, and let the next
# wave in for the whole budget, which waited up to 250 ms until the line stood again:
# the p99 of the work let in under the flood was 210 to 250 ms where its p50 was 50
# (bench/README.md, 2026-11-29). A second bridges those gaps. Counted from the last
# wait past STANDING_SHARE instead, a line beside 2,000 parked polls stood on after
# the flood ended (such a wait now and then was enough) and refused its clients.
STANDING_CALM_SECONDS = 1.0
# How early the acquire timeout's timer may fire and still end the waits due then.
TIMER_SLACK_SECONDS = 0.001


class Priority(IntEnum):
    """Who goes first for a database connection: the higher, the sooner."""

    WORK = 0  # enqueues, claims, reads: refused past the queue budget
    RELEASE = 1  # completes, fails, heartbeats, releases, background work


priority: contextvars.ContextVar[Priority] = contextvars.ContextVar(
    "gateway_db_priority", default=Priority.RELEASE
)


class Caller:
    """Whether a request's client is still connected, as the line needs to know: one per
    HTTP connection, made by the HTTP protocol (gateway/http/server.py), which calls
    `leave()` once the connection is lost. Requests of work waiting in line with it are
    told at once (their wait ends: Admission.acquire)."""

    __slots__ = ("_waiting", "gone")

    def __init__(self) -> None:
        self.gone = False
        # Waits in line for a connection by this caller's requests (made only when one
        # waits: most connections never do).
        self._waiting: list[asyncio.Future[bool]] | None = None

    def leave(self) -> None:
        """The connection is lost: every wait of its requests ends, not granted."""
        self.gone = True
        waiting, self._waiting = self._waiting, None
        for waiter in waiting or ():
            if not waiter.done():
                waiter.set_result(False)

    def _watch(self, waiter: asyncio.Future[bool]) -> None:
        if self._waiting is None:
            self._waiting = []
        self._waiting.append(waiter)

    def _unwatch(self, waiter: asyncio.Future[bool]) -> None:
        if self._waiting is not None and waiter in self._waiting:
            self._waiting.remove(waiter)


# The connection of the request being served, for work (set by the HTTP layer); None for
# releases, background work and a task serving many requests (`detach`).
caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "gateway_db_caller", default=None
)


def detach() -> None:
    """Forget the current request's client: for a task started while serving one
    request that works for others too (the claim pump), whose statements must not be
    dropped when that one client leaves."""
    caller.set(None)


@contextlib.contextmanager
def releasing() -> Iterator[None]:
    """Within it, statements take a connection as releases do: for the completes and
    fails a claim carries, which free work though they come with a claim."""
    token = priority.set(Priority.RELEASE)
    try:
        yield
    finally:
        priority.reset(token)


class LineLoad(NamedTuple):
    """The line for a database connection as it is now (Admission.load), for the
    console (GET /v1/instance/load)."""

    connections: int  # GATEWAY_DB_POOL_MAX
    held: int  # connections in use now
    waiting_work: int  # enqueues, claims, reads waiting for one
    waiting_releases: int  # completes, fails, heartbeats, background work waiting
    limit: float | None  # work that may wait (gateway_db_queue_limit); None: not yet known
    hold_ms: float  # the mean time a connection is held; 0 until one was given back
    budget_ms: float  # GATEWAY_DB_QUEUE_BUDGET_MS
    standing: bool  # the line has stood: work is let in for STANDING_SHARE of the budget


class Admission:
    """The connections' line for one process (owned by the Store). `slots` is the pool's
    size: at most that many hold a connection at once, so the pool itself never makes
    anyone wait; the line is here, where its order and its length are decided."""

    def __init__(self, slots: int, budget_ms: float, timeout_ms: float, metrics: Metrics) -> None:
        self._slots = slots
        self._budget_ms = budget_ms
        self._standing_ms = budget_ms * STANDING_SHARE
        self._timeout_ms = timeout_ms
        self._metrics = metrics
        self._held = 0
        self._started: dict[int, float] = {}  # loop time each current hold began, by grant
        self._grants = 0
        # Each waiter's result: True granted a slot, False its client left (Caller).
        self._lines: dict[Priority, deque[asyncio.Future[bool]]] = {p: deque() for p in Priority}
        # For each priority, the lines served before it (its own and those above).
        self._lines_ahead = {p: [self._lines[q] for q in Priority if q >= p] for p in Priority}
        # The loop time each waiting request joined the line (for _hand_on, and each
        # wait's acquire timeout).
        self._joined: dict[asyncio.Future[bool], float] = {}
        # One timer ends every wait that reaches the acquire timeout (`_time_out`), not
        # an asyncio.timeout each: under a flood a timer per wait, armed and cancelled
        # thousands of times a second, cost about 4% of the process's CPU.
        self._timer: asyncio.TimerHandle | None = None
        # CoDel's judgement: since when every grant of work waited past _standing_ms
        # (None: the last did not), and whether that has lasted an interval.
        self._above_since: float | None = None
        self._standing = False
        # The loop time the judgement last found the line standing.
        self._stood_at = float("-inf")
        self._aged_last = False  # the last slot went to work for its age (_hand_on)
        self.hold_ms = 0.0  # the mean hold, 0 until one ended
        self.refusals = Refusals()
        metrics.db_queue_limit.set_function(self.queue_limit)

    def queue_limit(self) -> float:
        """How many requests of work may wait in line now, by the budget (its standing
        share while the line stands) and the hold (without a measured hold yet: no
        limit below the acquire timeout's)."""
        hold_ms = self._hold_ms()
        if hold_ms <= 0:
            return float("inf")
        return self._limit_ms() / hold_ms * self._slots

    @property
    def standing(self) -> bool:
        """Whether the line stands: work is let in for STANDING_SHARE of the budget."""
        if (self._above_since is not None or self._standing) and not self._work_waiting():
            # The line emptied without a grant (its waiters left, or timed out): an
            # earlier slow grant does not count towards a later episode, and once
            # calm, it stands no more.
            self._above_since = None
            self._standing = self._standing and not self._calm(asyncio.get_running_loop().time())
        return self._standing

    def _calm(self, now: float) -> bool:
        """Whether STANDING_CALM_SECONDS have passed since the line was last found
        standing."""
        return now - self._stood_at >= STANDING_CALM_SECONDS

    def _limit_ms(self) -> float:
        """The longest wait work is let in for now, in ms."""
        return self._standing_ms if self.standing else self._budget_ms

    def _work_waiting(self) -> bool:
        """Whether any request of work still waits in line (the first then does: waits
        already ended are dropped from the head)."""
        work = self._lines[Priority.WORK]
        while work and work[0].done():
            work.popleft()
        return bool(work)

    def _waited(self, waited_ms: float, now: float, *, drained: bool) -> None:
        """Work was granted a connection after `waited_ms` in line (0: one was free and
        nobody waited), leaving the line without work if `drained`: CoDel's judgement
        of whether the line stands. Only a drained line that has not been found
        standing for STANDING_CALM_SECONDS stops standing: were a short wait enough, or
        a moment without work waiting, a flood would refill the line to the whole
        budget the moment it stood no more."""
        if waited_ms > self._standing_ms:
            if self._above_since is None:
                self._above_since = now
            elif now - self._above_since >= STANDING_INTERVAL_SECONDS:
                self._standing = True
                self._stood_at = now
        elif not self._standing:
            self._above_since = None
        if drained:
            self._above_since = None
            if self._standing and self._calm(now):
                self._standing = False

    def load(self) -> LineLoad:
        """How full the line is now."""
        waiting = {p: sum(not w.done() for w in line) for p, line in self._lines.items()}
        limit = self.queue_limit()
        return LineLoad(
            connections=self._slots,
            held=self._held,
            waiting_work=waiting[Priority.WORK],
            waiting_releases=waiting[Priority.RELEASE],
            limit=None if limit == float("inf") else limit,
            hold_ms=self.hold_ms,
            budget_ms=self._budget_ms,
            standing=self.standing,
        )

    def _hold_ms(self) -> float:
        """How long a connection is held, in ms: the mean of the holds that ended, or the
        age of the newest current one when every connection is held and even that one
        is older (Postgres slowed down since the mean was made)."""
        if self._held < self._slots or not self._started:
            return self.hold_ms
        # Grants are kept in the order made, and each began no earlier than the one
        # before: the newest current hold is the last (read in O(1), as the door asks
        # this of every request while the line is full).
        newest = next(reversed(self._started.values()))
        return max(self.hold_ms, (asyncio.get_running_loop().time() - newest) * 1000)

    def _ahead(self, wanted: Priority) -> int:
        """Waiters that would be served before a newcomer of priority `wanted` (the
        door asks this of every request while the line is full)."""
        return sum(map(len, self._lines_ahead[wanted]))

    def expected_wait_ms(self, wanted: Priority) -> float:
        """The wait a newcomer of priority `wanted` can expect for a connection, in ms."""
        if self._held < self._slots:
            return 0.0
        return (self._ahead(wanted) + 1) / self._slots * self._hold_ms()

    def crowded(self) -> bool:
        """True when work arriving now would wait past its budget (its standing share
        while the line stands): `acquire` would refuse it. Asked of every request."""
        if self._held < self._slots:
            return False  # a connection is free: no wait (and no need to judge the line)
        return self.expected_wait_ms(Priority.WORK) > self._limit_ms()

    def refusal(self) -> DatabaseBusy:
        """What work refused for the line's length is answered (the same words whether
        the line stands or not: the door makes its answer once)."""
        return DatabaseBusy(
            f"the database queue is longer than {self._budget_ms:g} ms of work "
            f"(GATEWAY_DB_QUEUE_BUDGET_MS), or than {self._standing_ms:g} ms once it has "
            f"stood for {STANDING_INTERVAL_SECONDS * 1000:g} ms; retry"
        )

    def shed(self, reason: str, count: int = 1) -> None:
        """Count `count` requests refused before any work, by `reason` (a label of
        gateway_shed_total: database_queue, busy, client_gone)."""
        self._metrics.shed.labels(reason).inc(count)
        self.refusals.add(reason, count)

    async def acquire(self) -> int:
        """Wait for a connection slot, in priority order (arrival order within one);
        returns the grant, for `release`. Raises DatabaseBusy at once when work would
        wait past its budget, or when no slot came free within the acquire timeout;
        ClientGone when work's client left (`caller`) before it was granted one."""
        wanted = priority.get()
        # Only work is dropped for its client: a release that was sent is applied.
        who = caller.get() if wanted is Priority.WORK else None
        if who is not None and who.gone:
            raise self._left()
        loop = asyncio.get_running_loop()
        if self._held < self._slots and not self._ahead(Priority.WORK):
            self._held += 1
            now = loop.time()
            self._waited(0.0, now, drained=True)  # a connection free, nobody waiting
            return self._grant(now)
        if wanted is Priority.WORK and self.expected_wait_ms(wanted) > self._limit_ms():
            self.shed("database_queue")
            raise self.refusal()
        waiter: asyncio.Future[bool] = loop.create_future()
        line = self._lines[wanted]
        line.append(waiter)
        self._joined[waiter] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(self._timeout_ms / 1000, self._time_out)
        if who is not None:
            who._watch(waiter)
        try:
            granted = await waiter
        except BaseException as exc:
            if _granted(waiter):
                self._hand_on()  # granted as its wait ended: the slot goes on
            elif waiter in line:
                line.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise self.timed_out() from None
            raise
        finally:
            self._joined.pop(waiter, None)
            if who is not None:
                who._unwatch(waiter)
        if not granted:  # its client left while it waited (Caller.leave)
            if waiter in line:
                line.remove(waiter)
            raise self._left()
        if who is not None and who.gone:  # left as its turn came: the slot goes on
            self._hand_on()
            raise self._left()
        return self._grant(loop.time())

    def _time_out(self) -> None:
        """End, with TimeoutError, the waits that reached the acquire timeout; then arm
        the timer for the oldest wait left, if any. Each line is in the order its
        waiters joined, so only its oldest waits are looked at."""
        self._timer = None
        loop = asyncio.get_running_loop()
        timeout = self._timeout_ms / 1000
        # A timer may fire a hair early (the loop's clock resolution).
        due = loop.time() + TIMER_SLACK_SECONDS
        oldest: float | None = None
        for line in self._lines.values():
            for waiter in line:
                if waiter.done():
                    continue
                joined = self._joined[waiter]
                if joined + timeout > due:
                    oldest = joined if oldest is None else min(oldest, joined)
                    break
                waiter.set_exception(TimeoutError())
        if oldest is not None:
            self._timer = loop.call_at(oldest + timeout, self._time_out)

    def check_caller(self) -> None:
        """Raise ClientGone, counted, when the current request is work whose client has
        left: for a connection granted that took time to open."""
        if priority.get() is Priority.WORK:
            who = caller.get()
            if who is not None and who.gone:
                raise self._left()

    def _left(self) -> ClientGone:
        """Counted, what work whose client left before it got a connection raises."""
        self.shed("client_gone")
        return ClientGone(
            "the client closed its connection before its request got a database "
            "connection; the request was not started"
        )

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
        """The slot goes to the first waiter of the highest priority, else back; but
        to the oldest request of work once it has waited a tenth of its budget
        (STANDING_SHARE), every other slot while releases wait too. A wait already
        ended (its client left, its timeout) is passed over.

        Why the exception: releases are never refused, so under a flood of completes
        they would keep arriving ahead of work that was let in, and an enqueue admitted
        for a wait within its budget waited many times that. Why every other slot: the
        next request of work has usually waited as long, and releases (completes,
        heartbeats, the probes) would otherwise wait behind the whole line of it."""
        work = self._lines[Priority.WORK]
        now = asyncio.get_running_loop().time()
        joined = self._joined.get(work[0]) if self._work_waiting() else None
        if (
            joined is not None
            and not self._aged_last
            and (now - joined) * 1000 >= self._standing_ms
        ):
            self._aged_last = True
            self._grant_work(now)
            return
        self._aged_last = False
        for wanted in sorted(self._lines, reverse=True):
            line = self._lines[wanted]
            while line:
                if wanted is Priority.WORK and not line[0].done():
                    self._grant_work(now)
                    return
                waiter = line.popleft()
                if not waiter.done():
                    waiter.set_result(True)
                    return
        self._held -= 1

    def _grant_work(self, now: float) -> None:
        """The slot to the first request of work in line (one waits, not done)."""
        waiter = self._lines[Priority.WORK].popleft()
        waiter.set_result(True)
        waited_ms = (now - self._joined[waiter]) * 1000
        self._waited(waited_ms, now, drained=not self._work_waiting())


def _granted(waiter: asyncio.Future[bool]) -> bool:
    """Whether a wait ended in a grant (not cancelled, timed out, or left)."""
    return (
        waiter.done() and not waiter.cancelled() and waiter.exception() is None and waiter.result()
    )
