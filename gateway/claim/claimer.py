"""The claim path's public face (design section 3): a claim registers a waiter for
its runtime and parks until it is served, its wait runs out or its client leaves; also
wake-ups, sync match (an enqueue hands its task to a parked poll), drain and the bound
on long waits.

Waiters register (and the process subscribes to the runtime's wake channel) before
the runtime's pump reads the verdict (I8). The pump, one coroutine per runtime that
checks the verdict and claims for every waiter (I9), is in gateway/claim/pump.py; the
waiters, and what the process holds per runtime, in gateway/claim/waiters.py; the rules of
the near-cache (verdict hits kept in the process) in gateway/claim/near_cache.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any

from .. import tracing
from ..admission import Caller
from ..api.requests import ClaimRequest
from ..errors import Draining, Overloaded
from ..metrics import Metrics
from ..rows import ItemResult, Leased, TaskRow
from ..settings import Settings
from .activity import ClaimActivity
from .announcements import Announcements
from .controls import REFRESH_SECONDS, ClaimControls
from .give_backs import GiveBacks
from .near_cache import NearCache, drop_near
from .ports import ClaimCache, ClaimStore, WakeChannels
from .pump import Pumps
from .waiters import Carried, Deadlines, Departure, RuntimeState, Waiter, unserved

log = logging.getLogger("gateway.claim")

LINGER_SECONDS = 30.0  # keep an idle runtime's subscription this long, for the next poll
# A resume reaches every process within this long (its copy of the controls is reloaded
# this often when the announcement is lost): the longest a paused runtime's claim is
# told to wait before it asks again.
PAUSED_RECHECK_SECONDS = REFRESH_SECONDS


class Claimer:
    """Serves claims for every runtime in this process. Owned by the app."""

    def __init__(
        self,
        store: ClaimStore,
        cache: ClaimCache,
        subscriber: WakeChannels,
        settings: Settings,
        metrics: Metrics,
        rng: random.Random | None = None,
        controls: ClaimControls | None = None,
        settled: Callable[[list[ItemResult]], Awaitable[None]] | None = None,
    ) -> None:
        """`settled`: called after the commit of completes that claims carried (with
        their outcomes), to wake what a complete wakes."""
        self._store = store
        self._controls = controls
        self._cache = cache
        self._subscriber = subscriber
        self._settings = settings
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._states: dict[str, RuntimeState] = {}
        self._near = NearCache(
            cache, subscriber, settings.cache_enabled and settings.near_cache_enabled
        )
        self._long_polls = 0  # claims here with a wait: GATEWAY_MAX_PARKED_POLLS bounds them
        self._deadlines = Deadlines()
        self.draining = False
        self._drain_hooks: list[Callable[[], None]] = []
        self.activity = ClaimActivity()  # tasks handed out here, for the runtimes listing
        self._give_backs = GiveBacks(store.unclaim, self.announce_many)
        self._announcements = Announcements(cache, self.wake)
        self._pumps = Pumps(
            store,
            cache,
            subscriber,
            settings,
            metrics,
            self._rng,
            controls,
            self._near,
            self.activity,
            give_back=self._give_backs.queue,
            draining=lambda: self.draining,
            settled=settled or _nothing_to_wake,
        )

    # -- wake-ups ------------------------------------------------------------

    def wake(self, runtime_id: str, bumped: str | None = None) -> None:
        """Make the runtime's pump re-check now (a bump was seen, here or via pub/sub).
        `bumped`: the version a bump made by this process returned."""
        state = self._states.get(runtime_id)
        if state is not None:
            drop_near(state)
            if bumped is not None:
                state.bumped = bumped
            state.woken = True
            state.wake.set()

    def wake_all(self) -> None:
        """Every runtime re-checks: the pub/sub connection was replaced or restored, and
        wake-ups may have been lost meanwhile (I8); the near-cache is dropped too."""
        for state in self._states.values():
            drop_near(state)
            state.wake.set()

    def redis_trouble(self) -> None:
        """Redis failed a call after working. Bumps may be getting lost now, here and on
        other instances, and a pump parked on an empty verdict would trust it for the
        rest of its life (up to GATEWAY_EMPTY_TTL_SECONDS). Make every pump re-check
        within one degraded poll interval, spread over it so that they do not all claim
        at once; while Redis stays unhealthy they then poll Postgres (I5)."""
        loop = asyncio.get_running_loop()
        spread = self._settings.degraded_poll_seconds
        for state in self._states.values():
            drop_near(state)
            if state.waiters:
                loop.call_later(self._rng.uniform(0.0, spread), state.wake.set)

    async def watch_redis(self) -> None:
        """Runs for the process's life (the lifespan owns it). While polls are parked
        and Redis is thought healthy, ping it once per degraded poll interval, so that
        a failure of the command path alone is noticed (and redis_trouble runs) even by
        an instance whose pumps all sleep on verdicts. While it is unhealthy, the
        pumps' own calls probe it. The pub/sub connection has its own PING."""
        while True:
            await asyncio.sleep(self._settings.degraded_poll_seconds)
            if self._long_polls and self._cache.healthy:
                await self._cache.ping()

    async def announce(self, runtime_id: str) -> None:
        """Call after a commit that made tasks claimable (I1): bump, publish, wake locally;
        bumps announced together share a round trip (gateway/claim/announcements.py).

        A failed bump is logged and counted; the janitor's repair pass finds it (I6).
        """
        await self._announcements.announce(runtime_id)

    async def announce_many(self, runtime_ids: Sequence[str]) -> None:
        """`announce` for each runtime, their bumps in one Redis round trip: for a
        commit that made tasks in many runtimes (a tick pass's batch)."""
        await self._announcements.bump_now(runtime_ids)

    def parked(self, runtime_id: str) -> int:
        state = self._states.get(runtime_id)
        return len(state.waiters) if state else 0

    def parked_counts(self) -> dict[str, int]:
        """Parked claims per runtime on this instance (gateway/redis/parked.py reports them)."""
        return {rt: len(state.waiters) for rt, state in self._states.items() if state.waiters}

    # -- the claim -----------------------------------------------------------

    def claim(
        self,
        runtime_id: str,
        req: ClaimRequest,
        disconnected: Departure | None = None,
        carried: Carried | None = None,
        caller: Caller | None = None,
    ) -> Coroutine[Any, Any, list[Leased]]:
        """Up to req.max_tasks leased rows, waiting up to req.wait_seconds for them.
        `carried`: completes the claim carries, applied by the first statement that
        claims for it, before it parks (its `answer` is set then); left unapplied when
        the claim is refused before that (an error raised with `answer` still None).
        `caller`: the client's connection, which the HTTP protocol tells when it is
        lost: a claim whose client left while it waited for a claim slot is not
        claimed for (`disconnected` tells a long poll sooner).

        Returns the coroutine that serves the claim. A long poll's is the one that parks
        (`_claim`), so that each parked poll holds one coroutine frame here, not two."""
        if (
            req.wait_seconds
            and not self.draining
            and self._long_polls < self._settings.max_parked_polls
        ):
            return self._claim(runtime_id, req, disconnected, carried, caller)
        return self._claim_at_once(runtime_id, req, disconnected, carried, caller)

    async def _claim_at_once(
        self,
        runtime_id: str,
        req: ClaimRequest,
        disconnected: Departure | None,
        carried: Carried | None = None,
        caller: Caller | None = None,
    ) -> list[Leased]:
        """A claim without a wait, or one refused or cut to no wait (draining, full)."""
        if self.draining:
            raise Draining("this instance is shutting down; retry on another")
        if not req.wait_seconds and self._near.enabled and carried is None:
            state = self._states.get(runtime_id)
            if state is not None and self._near.hit(state) is not None:
                # A verdict hit this process holds: no waiter, no pump, no round trip.
                self._metrics.near_hits.inc()
                return []
        if req.wait_seconds:
            # Full: still hand out work that is there, but park no one more.
            rows = await self._claim_at_once(
                runtime_id, dataclasses.replace(req, wait_seconds=0.0), None, carried, caller
            )
            if not rows:
                self._metrics.claims_rejected.labels("parked_polls").inc()
                raise Overloaded(
                    f"{self._settings.max_parked_polls} polls are already waiting on this "
                    "instance (GATEWAY_MAX_PARKED_POLLS); retry shortly",
                    retry_after_seconds=2,
                )
            return rows
        return await self._claim(runtime_id, req, disconnected, carried, caller)

    async def _claim(
        self,
        runtime_id: str,
        req: ClaimRequest,
        disconnected: Departure | None,
        carried: Carried | None = None,
        caller: Caller | None = None,
    ) -> list[Leased]:
        loop = asyncio.get_running_loop()
        if self.draining:  # began draining after claim() was called
            raise Draining("this instance is shutting down; retry on another")
        waiting = req.wait_seconds > 0
        if waiting:
            self._long_polls += 1
        arrived = loop.time()
        state = self._state(runtime_id)
        waiter = Waiter(
            req=req, deadline=arrived + req.wait_seconds, carried=carried, caller=caller
        )
        spans = tracing.active
        if spans is not None:
            waiter.trace = spans.current_span()
        try:
            # Subscribe before the verdict is read (I8).
            await self._subscriber.subscribe(state.channel)
            state.waiters.append(waiter)
            self._metrics.parked_polls.inc()
            state.wake.set()
            self._pumps.ensure(state)
            if disconnected is not None:
                disconnected.on_set(waiter.leave)
            if waiting:
                self._deadlines.add(waiter)
            try:
                while waiter.rows is None and waiter.error is None:
                    if waiter.deadline <= loop.time() and waiter.checked and not waiter.in_flight:
                        break
                    if waiter.gone and not waiter.in_flight:
                        break
                    # Nothing awaited since the checks above: a poke cannot fall in
                    # between. The deadline's poke comes from self._deadlines.
                    signal = waiter.signal = loop.create_future()
                    try:
                        await signal
                    finally:
                        waiter.signal = None
            finally:
                if waiting:
                    self._deadlines.discard(waiter)
                # Whatever ends its wait (a cancelled request too): a claim or sync match
                # still running for it gives its tasks back instead of handing them out.
                waiter.gone = True
                self._leave(state, waiter)
        finally:
            if waiting:
                self._long_polls -= 1
                self._metrics.long_poll_wait.observe(loop.time() - arrived)
        if waiter.error is not None:
            raise waiter.error
        return waiter.rows or []

    async def give_back(self, runtime_id: str, tasks: list[TaskRow]) -> None:
        """Return leases that never reached their poll (it left) to the queue, not as an
        attempt, and wake the runtime's other polls. Each task goes back only while its
        lease still holds it. On a database error the leases lapse instead and the
        janitor takes them back."""
        await self._give_backs.give_back(runtime_id, tasks)

    async def close(self) -> None:
        """Wait for the leases being given back (called before the pool closes), and the
        bumps announced so far (before the Redis client closes)."""
        await self._give_backs.close()
        await self._announcements.close()

    def held_seconds(self, runtime_id: str) -> float | None:
        """Seconds after which a claim of the runtime may find it no longer held back,
        when its claims hand out nothing now for a reason other than a lack of work:
        paused (until its end, and at most PAUSED_RECHECK_SECONDS, the longest a resume
        takes to reach this process), or held at a limit by its pump. None otherwise."""
        if self._controls is not None and self._controls.paused(runtime_id):
            until = self._controls.get(runtime_id).paused_until
            left = PAUSED_RECHECK_SECONDS
            if until is not None:
                left = min(left, (until - datetime.now(UTC)).total_seconds())
            return max(left, 0.0)
        state = self._states.get(runtime_id)
        if state is not None:
            left = state.held_until - asyncio.get_running_loop().time()
            if left > 0:
                return left
        return None

    # -- sync match: an enqueue hands its task to a parked poll -----------------

    def match(self, runtime_id: str) -> Waiter | None:
        """The oldest poll parked here for the runtime that an enqueue may write its
        task leased to, reserved for it until `matched()`; None on any doubt, and the
        enqueue then takes the usual path (bump, wake, claim).

        Doubt: the setting is off; draining; runtime controls apply (a limit or a pause
        decides who gets work, and the claim counts it); a wake-up is pending (another
        enqueue's task may be waiting, older or more urgent than this one); every
        database connection is busy (the reserved poll would wait with the enqueue for
        one, past its wait_seconds); or no poll is parked (checked since it arrived,
        not leaving, no claim in flight for it)."""
        if not self._settings.sync_match_enabled or self.draining:
            return None
        if not self._store.connection_free():
            return None
        state = self._states.get(runtime_id)
        if state is None or state.woken or state.bumped is not None:
            return None
        if self._controls is not None and (
            self._controls.limited(runtime_id) or self._controls.paused(runtime_id)
        ):
            return None
        if state.held_until > asyncio.get_running_loop().time():
            return None
        for waiter in state.waiters:
            if (
                waiter.checked
                and not waiter.in_flight
                and not waiter.gone
                and not waiter.matched
                and waiter.rows is None
                and waiter.error is None
            ):
                waiter.matched = waiter.in_flight = True  # it stays for the outcome
                return waiter
        return None

    async def matched(self, runtime_id: str, waiter: Waiter, task: TaskRow | None) -> None:
        """The enqueue that `match()` reserved `waiter` for is over: `task` is the row
        it wrote leased to the waiter, or None (not written so, or the enqueue failed).
        A waiter whose poll has left meanwhile gets nothing: the task goes back to the
        queue (give_back), for the other polls."""
        waiter.matched = waiter.in_flight = False
        state = self._states.get(runtime_id)
        if task is None:
            waiter.poke()  # it may have run out of time meanwhile
            if state is not None and unserved(state):
                self._pumps.ensure(state)
            return
        if waiter.gone:
            self._metrics.sync_matches.labels("given_back").inc()
            waiter.poke()
            await self.give_back(runtime_id, [task])
            return
        self._metrics.sync_matches.labels("handed").inc()
        self._metrics.observe_claim_delay(task, waiter.req.lease_seconds)
        self.activity.add(runtime_id, 1)
        if waiter.trace is not None and tracing.active is not None:
            tracing.active.woken(waiter.trace, 1, matched=True)
        waiter.finish(rows=[Leased(1, task)])

    def drain(self) -> None:
        """Answer every parked poll with what it has (usually nothing) and take no new
        claims. Claims already in flight finish and are delivered (I10)."""
        self.draining = True
        for hook in self._drain_hooks:
            hook()
        for state in self._states.values():
            for waiter in state.waiters:
                waiter.deadline = 0.0
                waiter.checked = True
                waiter.poke()
            state.wake.set()

    # -- other long waits (gateway/claim/results.py) --------------------------------

    @property
    def long_polls(self) -> int:
        """Claims with a wait, and result waits, in this process now."""
        return self._long_polls

    def admit_long_wait(self) -> None:
        """Count a long wait that is not a claim (a wait for a task's result) against
        GATEWAY_MAX_PARKED_POLLS, which bounds every waiting request of the process, or
        raise Overloaded (429) when full. Each admitted wait calls end_long_wait once."""
        if self._long_polls >= self._settings.max_parked_polls:
            raise Overloaded(
                f"{self._settings.max_parked_polls} requests are already waiting on this "
                "instance (GATEWAY_MAX_PARKED_POLLS); retry shortly",
                retry_after_seconds=2,
            )
        self._long_polls += 1

    def end_long_wait(self) -> None:
        self._long_polls -= 1

    def on_drain(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the process drains (SIGTERM), as the parked claims are answered."""
        self._drain_hooks.append(hook)

    # -- internals -----------------------------------------------------------

    def _state(self, runtime_id: str) -> RuntimeState:
        state = self._states.get(runtime_id)
        if state is None:
            channel = self._cache.keys(runtime_id).wake
            state = self._states[runtime_id] = RuntimeState(runtime_id, channel)
        if state.linger is not None:
            state.linger.cancel()
            state.linger = None
        return state

    def _leave(self, state: RuntimeState, waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):
            state.waiters.remove(waiter)
            self._metrics.parked_polls.dec()
        if not state.waiters:
            # The pump serves no one now: wake it to stop, rather than let it sleep out
            # a verdict's life, beyond the drain's reach once the runtime is forgotten.
            state.wake.set()
            if state.linger is None:
                loop = asyncio.get_running_loop()
                state.linger = loop.call_later(LINGER_SECONDS, self._forget, state)

    def _forget(self, state: RuntimeState) -> None:
        if state.waiters or self._states.get(state.runtime_id) is not state:
            return
        del self._states[state.runtime_id]
        self._subscriber.unsubscribe(state.channel)


async def _nothing_to_wake(outcomes: list[ItemResult]) -> None:
    """The default `settled`: nothing waits on completes (a claimer without a gateway)."""
