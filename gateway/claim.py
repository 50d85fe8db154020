"""The claim path (design section 3): verdict check, single-flight Postgres claim,
long polling, wake-ups.

Per runtime, one *pump* coroutine works for every local waiter: it reads the
verdict, and on a miss runs one Postgres claim for all of them, handing rows out
oldest waiter first (I9). A hit parks everyone until a wake-up, the verdict's TTL
or their deadline. Waiters register (and the process subscribes to the runtime's
wake channel) before the pump reads the verdict (I8). The waiters themselves, and what
the process holds per runtime, are in gateway/waiters.py; the rules of the near-cache
(verdict hits kept in the process) in gateway/near_cache.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from . import logs
from .activity import ClaimActivity
from .controls import ClaimControls
from .errors import CacheUnavailable, Draining, GatewayError, Overloaded, StoreUnavailable
from .metrics import Metrics
from .models import ClaimRequest
from .near_cache import NearCache, drop_near
from .ports import ClaimCache, ClaimStore, WakeChannels
from .rows import Leased, TaskRow
from .settings import Settings
from .waiters import Deadlines, Departure, RuntimeState, Waiter, unserved

log = logging.getLogger("gateway.claim")

LINGER_SECONDS = 30.0  # keep an idle runtime's subscription this long, for the next poll
# A verdict this process wrote is renewed this long before its life ends (at most; a
# quarter of a short life), so that a renewal lands before the key lapses.
RENEW_LEAD_SECONDS = 1.0
# And earlier by a random share of up to this much of its life: verdicts written
# together (a fleet's polls parking after a restart) are then not all renewed in one
# burst, which on a busy process runs Redis calls past their timeout and sends every
# parked runtime to Postgres (degraded polling).
RENEW_SPREAD = 0.2


def renew_after(ttl: float, rng: random.Random) -> float:
    """Seconds after writing a verdict of `ttl` seconds to renew it: RENEW_LEAD_SECONDS
    before its end (at most a quarter of a short life), and up to RENEW_SPREAD of its
    life earlier still, at random."""
    return ttl - min(RENEW_LEAD_SECONDS, ttl / 4) - rng.uniform(0.0, ttl * RENEW_SPREAD)


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
    ) -> None:
        self._store = store
        self._controls = controls
        self._cache = cache
        self._subscriber = subscriber
        self._settings = settings
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._states: dict[str, RuntimeState] = {}
        self._claim_slots = asyncio.Semaphore(settings.max_concurrent_claims)
        self._claims_queued = 0
        self._near = NearCache(
            cache, subscriber, settings.cache_enabled and settings.near_cache_enabled
        )
        self._long_polls = 0  # claims here with a wait: GATEWAY_MAX_PARKED_POLLS bounds them
        self._deadlines = Deadlines()
        self.draining = False
        self._drain_hooks: list[Callable[[], None]] = []
        self.activity = ClaimActivity()  # tasks handed out here, for the runtimes listing

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
        """Call after a commit that made tasks claimable (I1): bump, publish, wake locally.

        A failed bump is logged and counted; the janitor's repair pass finds it (I6).
        """
        try:
            version: str | None = await self._cache.bump(runtime_id)
        except CacheUnavailable as exc:
            log.warning("version bump for runtime %s lost: %s", runtime_id, exc.detail)
            version = None
        self.wake(runtime_id, version)

    def parked(self, runtime_id: str) -> int:
        state = self._states.get(runtime_id)
        return len(state.waiters) if state else 0

    def parked_counts(self) -> dict[str, int]:
        """Parked claims per runtime on this instance (gateway/parked.py reports them)."""
        return {rt: len(state.waiters) for rt, state in self._states.items() if state.waiters}

    # -- the claim -----------------------------------------------------------

    def claim(
        self, runtime_id: str, req: ClaimRequest, disconnected: Departure | None = None
    ) -> Coroutine[Any, Any, list[Leased]]:
        """Up to req.max_tasks leased rows, waiting up to req.wait_seconds for them.

        Returns the coroutine that serves the claim. A long poll's is the one that parks
        (`_claim`), so that each parked poll holds one coroutine frame here, not two."""
        if (
            req.wait_seconds
            and not self.draining
            and self._long_polls < self._settings.max_parked_polls
        ):
            return self._claim(runtime_id, req, disconnected)
        return self._claim_at_once(runtime_id, req, disconnected)

    async def _claim_at_once(
        self, runtime_id: str, req: ClaimRequest, disconnected: Departure | None
    ) -> list[Leased]:
        """A claim without a wait, or one refused or cut to no wait (draining, full)."""
        if self.draining:
            raise Draining("this instance is shutting down; retry on another")
        if not req.wait_seconds and self._near.enabled:
            state = self._states.get(runtime_id)
            if state is not None and self._near.hit(state) is not None:
                # A verdict hit this process holds: no waiter, no pump, no round trip.
                self._metrics.near_hits.inc()
                return []
        if req.wait_seconds:
            # Full: still hand out work that is there, but park no one more.
            rows = await self._claim_at_once(
                runtime_id, dataclasses.replace(req, wait_seconds=0.0), None
            )
            if not rows:
                self._metrics.claims_rejected.labels("parked_polls").inc()
                raise Overloaded(
                    f"{self._settings.max_parked_polls} polls are already waiting on this "
                    "instance (GATEWAY_MAX_PARKED_POLLS); retry shortly",
                    retry_after_seconds=2,
                )
            return rows
        return await self._claim(runtime_id, req, disconnected)

    async def _claim(
        self, runtime_id: str, req: ClaimRequest, disconnected: Departure | None
    ) -> list[Leased]:
        loop = asyncio.get_running_loop()
        if self.draining:  # began draining after claim() was called
            raise Draining("this instance is shutting down; retry on another")
        waiting = req.wait_seconds > 0
        if waiting:
            self._long_polls += 1
        arrived = loop.time()
        state = self._state(runtime_id)
        waiter = Waiter(req=req, deadline=arrived + req.wait_seconds)
        try:
            # Subscribe before the verdict is read (I8).
            await self._subscriber.subscribe(state.channel)
            state.waiters.append(waiter)
            self._metrics.parked_polls.inc()
            state.wake.set()
            self._ensure_pump(state)
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

    def _ensure_pump(self, state: RuntimeState) -> None:
        if state.pump is None:
            # A bump seen while no pump ran is old news: other claims may have written a
            # verdict under its version since, so the new pump reads the verdict first.
            state.bumped = None
            state.pump = asyncio.create_task(self._pump(state), name=f"pump:{state.runtime_id}")

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
                self._ensure_pump(state)
            return
        if waiter.gone:
            self._metrics.sync_matches.labels("given_back").inc()
            waiter.poke()
            await self.give_back(runtime_id, [task])
            return
        self._metrics.sync_matches.labels("handed").inc()
        self._metrics.observe_claim_delay(task, waiter.req.lease_seconds)
        self.activity.add(runtime_id, 1)
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

    # -- other long waits (gateway/results.py) --------------------------------

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

    async def _pump(self, state: RuntimeState) -> None:
        logs.detach()  # started by one poll's request, it serves them all
        try:
            while unserved(state) and not self.draining:
                state.wake.clear()
                woken, state.woken = state.woken, False
                park = await self._cycle(state, woken)
                if park is None:
                    # Run again at once, but first let served waiters leave: a cycle
                    # need not await anything (cache off, breaker open).
                    await asyncio.sleep(0)
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(park):
                        await state.wake.wait()
        except Exception:
            log.exception("claim pump for runtime %s died", state.runtime_id)
            for waiter in state.waiters:
                waiter.finish(error=StoreUnavailable("internal error in the claim path"))
        finally:
            state.pump = None

    def _park_seconds(self, state: RuntimeState, verdict_ttl: float | None) -> float:
        """How long the pump sleeps without a wake-up. Wake-ups may be lost when this
        runtime's subscription is not confirmed, or when Redis is failing (other
        instances' bumps and publishes fail too): then it polls Postgres instead (I5)."""
        park = verdict_ttl if verdict_ttl is not None else self._settings.empty_ttl_seconds
        if not (self._subscriber.confirmed(state.channel) and self._cache.healthy):
            park = min(park, self._settings.degraded_poll_seconds)
        if state.renew_version is not None:
            park = min(park, state.renew_at - asyncio.get_running_loop().time())
        return max(park, 0.001)

    async def _cycle(self, state: RuntimeState, woken: bool = False) -> float | None:
        """One verdict check and, on a miss, one claim. Returns how long to park, or
        None to run again at once. `woken`: a wake-up started this cycle."""
        runtime_id = state.runtime_id
        version: str | None = None
        loop = asyncio.get_running_loop()
        held = self._held(state, woken)
        if held is not None:
            return held
        drops, read_at = state.near_drops, loop.time()
        trusted = self._near.trusted(state)
        if self._settings.cache_enabled:
            if state.bumped is not None:
                # This process just bumped the runtime: the version the bump returned is
                # a sample taken before the scan below (I2), and a miss for sure, so no
                # read is needed. A later bump elsewhere only makes the verdict stale.
                version, state.bumped = state.bumped, None
                state.renew_version = None
            else:
                arrived = list(state.waiters)
                if state.renew_version is not None and read_at >= state.renew_at:
                    renewed = await self._renew(state)
                    if renewed is not None:
                        for waiter in arrived:
                            waiter.checked = True
                            waiter.poke()
                        return self._park_seconds(state, renewed)
                    drops, read_at, trusted = (
                        state.near_drops,
                        loop.time(),
                        self._near.trusted(state),
                    )
                near = self._near.hit(state)
                if near is not None:
                    self._metrics.near_hits.inc()
                    for waiter in arrived:
                        waiter.checked = True
                        waiter.poke()
                    return self._park_seconds(state, near)
                try:
                    verdict = await self._cache.read(runtime_id)
                except CacheUnavailable:
                    self._metrics.verdict_checks.labels("error").inc()
                else:
                    if verdict.version != state.renew_version:
                        state.renew_version = None  # a bump made what we wrote stale
                    if verdict.hit:
                        assert verdict.ttl_seconds is not None  # a hit knows its life (I4)
                        if trusted:
                            self._near.keep(
                                state, verdict.version, drops, read_at, verdict.ttl_seconds
                            )
                        # Only waiters that were here before the read count as checked.
                        for waiter in arrived:
                            waiter.checked = True
                            waiter.poke()
                        return self._park_seconds(state, verdict.ttl_seconds)
                    version = verdict.version
        waiters = unserved(state)
        if not waiters:
            return None
        owners: list[Waiter] = []
        for waiter in waiters:
            owners.extend([waiter] * waiter.req.max_tasks)
            waiter.in_flight = True
        hold: float | None = None
        try:
            async with self._admission():
                worker_ids = [w.req.worker_id for w in owners]
                lease_seconds = [float(w.req.lease_seconds) for w in owners]
                if self._controls is not None and self._controls.limited(runtime_id):
                    limited = await self._controls.claim(runtime_id, worker_ids, lease_seconds)
                    rows, due_in, hold = limited.rows, limited.due_in, limited.held
                else:
                    rows, due_in = await self._store.claim(runtime_id, worker_ids, lease_seconds)
        except GatewayError as exc:
            for waiter in waiters:
                waiter.in_flight = False
                waiter.finish(error=exc)
            return self._settings.degraded_poll_seconds
        await self._hand_out(runtime_id, waiters, owners, rows, woken)
        if len(rows) == len(owners):
            return None  # every slot filled: there may be more work for newer waiters
        if hold is not None:
            # A limit, not a lack of work, left slots empty: no empty verdict.
            state.held_until = loop.time() + hold
            return hold
        return await self._record_empty(state, version, due_in, (drops, read_at, trusted))

    def _held(self, state: RuntimeState, woken: bool) -> float | None:
        """Runtime controls (gateway/controls.py), from this process's copy: how long to
        park without a claim, or None to go on. A paused runtime, or one a limit held
        back with no wake-up since, costs no Postgres statement however many polls
        park; its polls without a wait are answered at once."""
        if self._controls is None:
            return None
        now = asyncio.get_running_loop().time()
        if self._controls.paused(state.runtime_id):
            park = self._settings.empty_ttl_seconds  # a resume wakes it
        elif state.held_until > now and not woken:
            park = state.held_until - now
        else:
            state.held_until = 0.0
            return None
        for waiter in state.waiters:
            waiter.checked = True
            waiter.poke()
        return park

    async def _hand_out(
        self,
        runtime_id: str,
        waiters: list[Waiter],
        owners: list[Waiter],
        rows: list[Leased],
        woken: bool = False,
    ) -> None:
        got: dict[Waiter, list[Leased]] = {}
        for row in rows:
            owner = owners[row.slot - 1]
            got.setdefault(owner, []).append(row)
            self._metrics.observe_claim_delay(row.task, owner.req.lease_seconds)
        undelivered: list[TaskRow] = []
        for waiter in waiters:
            waiter.in_flight = False
            parked, waiter.checked = waiter.checked, True
            mine = got.get(waiter)
            if mine and waiter.gone:
                undelivered.extend(r.task for r in mine)
                mine = None
            if mine and parked and woken:
                self._metrics.wakeups_delivered.inc()
            waiter.finish(rows=mine)  # wakes it: served, or checked and still waiting
        self.activity.add(runtime_id, len(rows) - len(undelivered))
        if undelivered:
            # Their polls left while the claim ran: give the tasks back and wake the others.
            await self.give_back(runtime_id, undelivered)

    async def give_back(self, runtime_id: str, tasks: list[TaskRow]) -> None:
        """Return leases that never reached their poll (it left) to the queue, not as an
        attempt, and wake the runtime's other polls. Each task goes back only while its
        lease still holds it. On a database error the leases lapse instead and the
        janitor takes them back."""
        try:
            held = [(t.id, t.lease_id) for t in tasks if t.lease_id is not None]
            await self._store.unclaim([i for i, _ in held], [lease for _, lease in held])
        except StoreUnavailable:
            log.warning("could not give back %d undelivered leases", len(tasks))
        else:
            await self.announce(runtime_id)

    async def _record_empty(
        self,
        state: RuntimeState,
        version: str | None,
        due_in: float | None,
        sampled: tuple[int, float, bool] = (-1, 0.0, False),
    ) -> float:
        """The scan found fewer tasks than wanted: write the verdict under the version
        read before the scan (I2), never outliving the next due task (I4). `sampled`:
        the near-cache drop count, loop time and trust taken before that read."""
        ttl = self._settings.empty_ttl_seconds
        if due_in is not None:
            ttl = min(ttl, due_in)
        if version is not None:
            try:
                await self._cache.write_empty(state.runtime_id, version, ttl)
            except CacheUnavailable:
                pass
            else:
                now = asyncio.get_running_loop().time()
                due_at = None if due_in is None else now + due_in
                self._schedule_renewal(state, version, now, ttl, due_at)
                drops, read_at, trusted = sampled
                if trusted:
                    # A bump since the read (the scan's I2 race) dropped it: not kept.
                    self._near.keep(state, version, drops, read_at, ttl)
        return self._park_seconds(state, ttl)

    def _schedule_renewal(
        self, state: RuntimeState, version: str, now: float, ttl: float, due_at: float | None
    ) -> None:
        state.renew_version = version
        state.renew_at = now + renew_after(ttl, self._rng)
        state.renew_due_at = due_at

    async def _renew(self, state: RuntimeState) -> float | None:
        """Renew the verdict this process wrote, instead of scanning Postgres again: its
        new life in seconds, or None when that cannot be (a bump made it stale, a task
        comes due first, Redis fails or refuses writes): then check as usual.

        Safe because every change that makes a task claimable, or delays one, bumps the
        version (I1), which makes the renewal fail; a bump lost to a Redis fault is the
        janitor's repair's to find (I6), as for any verdict."""
        version, due_at = state.renew_version, state.renew_due_at
        state.renew_version = None
        assert version is not None
        now = asyncio.get_running_loop().time()
        ttl = self._settings.empty_ttl_seconds
        if due_at is not None:
            ttl = min(ttl, due_at - now)
        # Near a due time, let the verdict lapse: the scan then finds the task (I4).
        if ttl < min(0.5, self._settings.empty_ttl_seconds / 2) or not self._cache.healthy:
            return None
        drops, trusted = state.near_drops, self._near.trusted(state)
        try:
            if not await self._cache.renew_empty(state.runtime_id, version, ttl):
                return None
        except CacheUnavailable:
            return None
        self._schedule_renewal(state, version, now, ttl, due_at)
        if trusted:
            self._near.keep(state, version, drops, now, ttl)
        return ttl

    @contextlib.asynccontextmanager
    async def _admission(self) -> AsyncIterator[None]:
        """A global bound on Postgres claims in flight; beyond the queue limit, 429 (I9)."""
        if self._claim_slots.locked() and self._claims_queued >= self._settings.max_queued_claims:
            self._metrics.claims_rejected.labels("database_queue").inc()
            raise Overloaded("too many claims are waiting for the database; retry shortly")
        self._claims_queued += 1
        try:
            await self._claim_slots.acquire()
        finally:
            self._claims_queued -= 1
        try:
            yield
        finally:
            self._claim_slots.release()
