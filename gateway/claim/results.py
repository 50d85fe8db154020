"""Waiting for a task's result: `GET /v1/tasks/{id}?wait_seconds=N` (design section 3,
"Waiting for a result").

A task that finishes (completed, dead, expired, cancelled) wakes the requests waiting
for it through the same pub/sub connection that wakes parked claims (I5, I8): the
request that finished it publishes the task's id on the task's result channel,
`<prefix>:done:<task id>`, after the commit. A waiting request subscribes to that
channel (confirmed by Redis) before it reads the task, so a finish committed after
that read always reaches it; it reads the task again only when woken, and once when
its wait ends. Nothing polls Postgres while it waits, except as a fallback: while its
subscription is not confirmed or Redis is failing, it reads the task once per
GATEWAY_DEGRADED_POLL_SECONDS, as parked claims poll then.

A finish publishes whether or not anybody waits (asking Redis whether anybody does would
cost the same round trip), but never makes its request wait for Redis: publishes go out
in the background, those made during one round trip together in the next. Awaited in
each complete, the publish cost 28% of the completion rate (0.72x in one run of
`python -m bench.measure results`); sent in the background, 1.18x and 0.89x in two runs:
within this shared machine's noise.

Expiry publishes nothing: a waiter sleeps at most until the task's expires_at, when a
read shows it expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from ..errors import CacheUnavailable
from ..metrics import Metrics
from ..rows import DELETED, TaskRow
from ..settings import Settings
from .ports import WakeChannels
from .waiters import Departure, wake_signal

log = logging.getLogger("gateway.results")

# The statuses a task never leaves by itself: a wait for its result ends there.
FINISHED = frozenset({"completed", "dead", "expired", "cancelled"})


def done_channel(prefix: str, task_id: uuid.UUID) -> str:
    """The task's result channel. It never looks like a runtime's wake channel
    (`<prefix>:{<rt>}:wake`), so the Subscriber hands its messages to Results."""
    return f"{prefix}:done:{task_id}"


class TaskReader(Protocol):
    """What a wait reads from Postgres (Store)."""

    async def get(self, task_id: uuid.UUID) -> TaskRow:
        """The task, or NotFound."""
        ...


class ResultPublisher(Protocol):
    """What a finish publishes through, and how a wait knows wake-ups can reach it
    (VerdictCache)."""

    @property
    def healthy(self) -> bool: ...

    async def publish(self, messages: list[tuple[str, str]]) -> None:
        """Publish each (channel, message); CacheUnavailable on failure."""
        ...


class WaitAdmission(Protocol):
    """The process's bound on waiting requests (Claimer: GATEWAY_MAX_PARKED_POLLS)."""

    def admit_long_wait(self) -> None: ...

    def end_long_wait(self) -> None: ...


@dataclass(eq=False, slots=True)
class _Wait:
    """One request waiting for a task to finish; woken through its future."""

    signal: asyncio.Future[None] | None = None
    gone: bool = False  # its client left: nobody receives the answer
    # Poked since its last read began. A wake-up that arrives during a read must not be
    # lost: the read may have begun before the finish it announces was committed.
    woken: bool = False

    def poke(self) -> None:
        self.woken = True
        wake_signal(self.signal)

    def leave(self) -> None:
        self.gone = True
        self.poke()


class Results:
    """Serves the waits for task results in this process, and publishes the wake-ups
    of finished tasks. Owned by the Gateway; the Subscriber calls `message`,
    `wake_all`, and the Gateway `redis_trouble` and `drain`."""

    def __init__(
        self,
        store: TaskReader,
        cache: ResultPublisher,
        subscriber: WakeChannels,
        admission: WaitAdmission,
        settings: Settings,
        metrics: Metrics,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._subscriber = subscriber
        self._admission = admission
        self._settings = settings
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._prefix = settings.redis_prefix
        self._waits: dict[str, list[_Wait]] = {}  # result channel -> its waiting requests
        self._outbox: list[tuple[str, str]] = []  # (channel, message) not yet published
        self._sender: asyncio.Task[None] | None = None
        self.draining = False

    def waiting(self) -> int:
        """Requests waiting for a result in this process."""
        return sum(len(waits) for waits in self._waits.values())

    # -- the finishing side ---------------------------------------------------

    async def finished(self, tasks: Iterable[tuple[uuid.UUID, str]]) -> None:
        """Call after a commit that changed tasks' statuses, with each (id, status
        now, or DELETED): wakes the requests waiting for those that finished or went.
        Returns at once: the publish is sent in the background, together with the
        others made meanwhile (one round trip per batch), so a finish never waits on
        Redis."""
        for task_id, status in tasks:
            if status in FINISHED or status == DELETED:
                self._outbox.append((done_channel(self._prefix, task_id), str(task_id)))
        if self._outbox and self._sender is None:
            self._sender = asyncio.create_task(self._send(), name="result-wakeups")

    async def _send(self) -> None:
        """Publishes the outbox until it is empty; finishes that arrive during a round
        trip go in the next one. A failure is logged and counted, never raised: the
        waiters then see the finish at their next fallback read or when their wait ends."""
        try:
            while self._outbox:
                batch, self._outbox = self._outbox, []
                try:
                    await self._cache.publish(batch)
                except CacheUnavailable as exc:
                    self._metrics.result_publishes.labels("error").inc(len(batch))
                    log.warning(
                        "result wake-ups for %d finished tasks lost: %s", len(batch), exc.detail
                    )
                else:
                    self._metrics.result_publishes.labels("ok").inc(len(batch))
        finally:
            self._sender = None

    async def close(self) -> None:
        """Send what is left in the outbox (bounded by the Redis call's own budget)."""
        if self._sender is not None:
            with contextlib.suppress(Exception):
                await self._sender

    # -- wake-ups ---------------------------------------------------------------

    def message(self, channel: str) -> None:
        """A message on `channel` (Subscriber): wake the requests waiting on it."""
        for wait in self._waits.get(channel, ()):
            wait.poke()

    def wake_all(self) -> None:
        """The pub/sub connection was replaced or restored: finishes may have been
        published meanwhile (I8). Every wait reads its task again, spread over one
        degraded poll interval so that they do not all read at once."""
        self._spread_pokes()

    def redis_trouble(self) -> None:
        """Redis failed a call after working: publishes may be getting lost. Every
        wait re-checks within one degraded poll interval, then polls at that interval
        while Redis stays unhealthy (I5)."""
        self._spread_pokes()

    def _spread_pokes(self) -> None:
        loop = asyncio.get_running_loop()
        spread = self._settings.degraded_poll_seconds
        for waits in self._waits.values():
            for wait in waits:
                loop.call_later(self._rng.uniform(0.0, spread), wait.poke)

    def drain(self) -> None:
        """SIGTERM: answer every waiting request at once with the task as last read (I10)."""
        self.draining = True
        for waits in self._waits.values():
            for wait in waits:
                wait.poke()

    # -- the wait -----------------------------------------------------------------

    async def wait(
        self, task_id: uuid.UUID, wait_seconds: float, disconnected: Departure | None = None
    ) -> TaskRow:
        """The task once it is finished, or as it is when `wait_seconds` run out, the
        process drains, or the client leaves. NotFound if there is no such task;
        Overloaded when GATEWAY_MAX_PARKED_POLLS requests already wait here."""
        row = await self._store.get(task_id)
        if row.status in FINISHED or wait_seconds <= 0 or self.draining:
            return row
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        self._admission.admit_long_wait()
        channel = done_channel(self._prefix, task_id)
        wait = _Wait()
        waits = self._waits.setdefault(channel, [])
        waits.append(wait)
        self._metrics.parked_polls.inc()
        try:
            if disconnected is not None:
                disconnected.on_set(wait.leave)
            # Subscribe before the read (I8): a finish committed after it wakes us.
            await self._subscriber.subscribe(channel)
            while True:
                if wait.gone or self.draining:
                    return row
                wait.woken = False
                self._metrics.result_wait_reads.inc()
                row = await self._store.get(task_id)
                remaining = deadline - loop.time()
                if row.status in FINISHED or remaining <= 0 or wait.gone or self.draining:
                    return row
                until = _until_expiry(row, self._settings.degraded_poll_seconds)
                await self._sleep(wait, channel, min(remaining, until))
        finally:
            waits.remove(wait)
            if not waits:
                del self._waits[channel]
                self._subscriber.unsubscribe(channel)
            self._metrics.parked_polls.dec()
            self._admission.end_long_wait()

    async def _sleep(self, wait: _Wait, channel: str, seconds: float) -> None:
        """Until a wake-up, a poke or `seconds`; at most one degraded poll interval
        while wake-ups may not reach this process (I5)."""
        if wait.woken:
            return  # poked during the read: read again
        if not (self._subscriber.confirmed(channel) and self._cache.healthy):
            seconds = min(seconds, self._settings.degraded_poll_seconds)
        loop = asyncio.get_running_loop()
        signal = wait.signal = loop.create_future()
        timer = loop.call_later(max(seconds, 0.0), wake_signal, signal)
        try:
            await signal
        finally:
            wait.signal = None
            timer.cancel()


def _until_expiry(row: TaskRow, late_seconds: float) -> float:
    """Seconds until a queued task's expires_at, a little after it (a read then shows it
    expired; the janitor's expiry publishes nothing), or infinity. Past it by this
    process's clock but not yet by Postgres's (clocks differ): `late_seconds`."""
    if row.status != "queued" or row.expires_at is None:
        return float("inf")
    left = (row.expires_at - datetime.now(UTC)).total_seconds()
    return left + 0.05 if left > 0 else late_seconds
