"""The claim pump (design section 3): per runtime, one coroutine serves every poll
parked in this process. It reads the empty verdict and, on a miss, runs one Postgres
claim for all the waiters, handing rows out oldest waiter first (I9); a scan that
leaves slots empty writes the verdict under the version read before it (I2, I4), and
while polls stay parked the pump renews that verdict rather than scan again. Polls
that arrive while its statement runs are claimed for by a helper, in a statement of
their own, up to STATEMENTS_PER_RUNTIME statements at a time. The Claimer
(gateway/claim/claimer.py) registers the waiters and starts the pump (`Pumps.ensure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

from .. import admission, logs, tracing
from ..admission import releasing
from ..errors import CacheUnavailable, DatabaseBusy, GatewayError, Overloaded
from ..metrics import Metrics
from ..rows import ItemResult, Leased, TaskRow
from ..settings import Settings
from .activity import ClaimActivity
from .controls import ClaimControls
from .near_cache import NearCache
from .ports import ClaimCache, ClaimStore, WakeChannels
from .slots import ClaimSlots
from .waiters import (
    RuntimeState,
    Waiter,
    failed,
    fit_statement,
    idle,
    merged,
    share,
    still_wanted,
    unserved,
    unsettled,
)

# The claim path's logger, as before the pump had a module of its own.
log = logging.getLogger("gateway.claim")

# A verdict this process wrote is renewed this long before its life ends (at most; a
# quarter of a short life), so that a renewal lands before the key lapses.
RENEW_LEAD_SECONDS = 1.0
# And earlier by a random share of up to this much of its life: verdicts written
# together (a fleet's polls parking after a restart) are then not all renewed in one
# burst, which on a busy process runs Redis calls past their timeout and sends every
# parked runtime to Postgres (degraded polling).
RENEW_SPREAD = 0.2
# Claim statements one runtime may have in flight in this process (I9): the pump's, and
# those of helpers started for polls that arrive while every statement runs. With one,
# a statement's commit (its WAL flush, about 2 ms on a plain disk) bounded a busy
# runtime's claims to a few hundred statements a second, however many workers
# polled; two overlap one commit with the next statement, and the database groups
# their flushes. The claims a process runs at once stay bounded by
# GATEWAY_MAX_CONCURRENT_CLAIMS.
STATEMENTS_PER_RUNTIME = 2


def renew_after(ttl: float, rng: random.Random) -> float:
    """Seconds after writing a verdict of `ttl` seconds to renew it: RENEW_LEAD_SECONDS
    before its end (at most a quarter of a short life), and up to RENEW_SPREAD of its
    life earlier still, at random."""
    return ttl - min(RENEW_LEAD_SECONDS, ttl / 4) - rng.uniform(0.0, ttl * RENEW_SPREAD)


class Pumps:
    """The claim pumps of this process, one per runtime with polls parked here, and the
    global bound on Postgres claims in flight that they share (I9). Owned by the
    Claimer: `give_back` returns leases whose poll left, `draining` says the process
    drains (a pump then stops)."""

    def __init__(
        self,
        store: ClaimStore,
        cache: ClaimCache,
        subscriber: WakeChannels,
        settings: Settings,
        metrics: Metrics,
        rng: random.Random,
        controls: ClaimControls | None,
        near: NearCache,
        activity: ClaimActivity,
        give_back: Callable[[str, list[TaskRow]], object],
        draining: Callable[[], bool],
        settled: Callable[[list[ItemResult]], Awaitable[None]],
    ) -> None:
        self._store = store
        self._controls = controls
        self._cache = cache
        self._subscriber = subscriber
        self._settings = settings
        self._metrics = metrics
        self._rng = rng
        self._near = near
        self._activity = activity
        self._give_back = give_back
        self._draining = draining
        self._settled = settled
        self._slots = ClaimSlots(settings, metrics)

    def ensure(self, state: RuntimeState) -> None:
        """Start the runtime's pump, unless it runs; or, when the pump and its helpers
        all wait on claim statements and fewer than STATEMENTS_PER_RUNTIME run, a
        helper for the polls that no statement serves."""
        if state.pump is None:
            # A bump seen while no pump ran is old news: other claims may have written a
            # verdict under its version since, so the new pump reads the verdict first.
            state.bumped = None
            state.pump = asyncio.create_task(self._run(state), name=f"pump:{state.runtime_id}")
        elif (
            state.running > len(state.helpers)
            and 1 + len(state.helpers) < STATEMENTS_PER_RUNTIME
            and idle(state)
            and not self._draining()
        ):
            helper = asyncio.create_task(
                self._assist(state), name=f"pump helper:{state.runtime_id}"
            )
            state.helpers.add(helper)
            helper.add_done_callback(state.helpers.discard)

    async def _run(self, state: RuntimeState) -> None:
        logs.detach()  # started by one poll's request, it serves them all
        admission.detach()  # (or by an enqueue's, whose client may leave)
        try:
            while unserved(state) and not self._draining():
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
            self._died(state, "claim pump")
        finally:
            state.pump = None

    async def _assist(self, state: RuntimeState) -> None:
        """A helper (in `state.helpers` from `ensure` until it ends): cycles for the polls that
        arrived while the runtime's statements ran, until none is left unchecked or a
        cycle finds nothing to claim. It never parks: the pump keeps the parked polls."""
        logs.detach()
        admission.detach()  # started by one request, it serves others too
        try:
            while not self._draining() and any(not w.checked for w in idle(state)):
                if await self._cycle(state) is not None:
                    break
        except Exception:
            self._died(state, "claim pump helper")
        finally:
            state.wake.set()  # the pump takes over what is left

    def _died(self, state: RuntimeState, what: str) -> None:
        """A pump or helper died of a bug: the polls no statement serves fail (a
        statement's own were failed by the coroutine that ran it, and another
        coroutine's answers its own)."""
        log.exception("%s for runtime %s died", what, state.runtime_id)
        failed([w for w in state.waiters if not w.in_flight])

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
        if not idle(state):
            # Every poll is in a helper's statement: park until it ends (it wakes us).
            return self._settings.empty_ttl_seconds
        runtime_id = state.runtime_id
        version: str | None = None
        loop = asyncio.get_running_loop()
        held = self._held(state, woken)
        if held is not None:
            # No claim runs: the completes that claims carry are applied alone, before
            # their claims count as checked (one without a wait then answers).
            await self._settle_alone(state)
            for waiter in state.waiters:
                waiter.checked = True
                waiter.poke()
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
            elif not unsettled(idle(state)):
                # (With completes to apply, a statement runs whatever the verdict says.)
                arrived = idle(state)
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
                    with tracing.client("redis", "MGET", None, arrived):
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
        waiters, later = fit_statement(idle(state))
        waiters = self._slots.refuse_hurried(waiters)
        if not waiters:
            return None
        for waiter in waiters:
            waiter.in_flight = True
        outcomes: list[ItemResult] = []
        hold: float | None = None
        try:
            async with self._slots.hold(state, len(waiters)):
                # Under overload the wait for a claim slot can be long: claims whose
                # client left meanwhile are not claimed for (their tasks would only be
                # leased and given back, ahead of the claims of clients still there),
                # though the completes they carry are applied.
                waiters, left = still_wanted(waiters)
                if left:
                    self._store.client_gone(left)
                owners = [w for w in waiters if not w.gone for _ in range(w.req.max_tasks)]
                carried = unsettled(waiters)
                # The statement's span: it leases up to len(owners) rows of the tasks table.
                with tracing.client("postgresql", "UPDATE", "tasks", waiters) as span:
                    worker_ids = [w.req.worker_id for w in owners]
                    lease_seconds = [float(w.req.lease_seconds) for w in owners]
                    if not owners:  # only the completes of claims that left: no claim
                        outcomes, rows, due_in = await self._apply(runtime_id, carried), [], None
                    elif self._controls is not None and self._controls.limited(runtime_id):
                        outcomes = await self._apply(runtime_id, carried)
                        limited = await self._controls.claim(runtime_id, worker_ids, lease_seconds)
                        rows, due_in, hold = limited.rows, limited.due_in, limited.held
                    elif carried and self._store.crowded():
                        # The database's line is full: the completes go in as completes do,
                        # and the claim waits, or is shed, as claims are; never one
                        # lifted past the line by the other.
                        outcomes = await self._apply(runtime_id, carried)
                        rows, due_in = await self._store.claim(
                            runtime_id, worker_ids, lease_seconds
                        )
                    elif carried:
                        # The completes it carries free work: the statement queues as they would.
                        with releasing():
                            rows, due_in, outcomes = await self._store.claim_acked(
                                runtime_id, worker_ids, lease_seconds, merged(carried)
                            )
                    else:
                        rows, due_in = await self._store.claim(
                            runtime_id, worker_ids, lease_seconds
                        )
                    if span is not None:
                        span.set_attribute("claim_gateway.slots", len(owners))
                        span.set_attribute("db.response.returned_rows", len(rows))
        except Exception as exc:
            if not isinstance(exc, GatewayError):
                failed(waiters)
                raise
            if isinstance(exc, DatabaseBusy):
                # The database's line is full (gateway/admission.py): for a claim, that
                # is overload, answered as the claims' own line answers it.
                exc = Overloaded(exc.detail, exc.retry_after_seconds)
            if outcomes:  # applied alone before the claim failed
                share(carried, outcomes)
            for waiter in waiters:
                waiter.in_flight = False
                waiter.finish(error=exc)
            if outcomes:
                await self._settled(outcomes)
            return self._settings.degraded_poll_seconds
        if outcomes:
            share(carried, outcomes)
        await self._hand_out(runtime_id, waiters, owners, rows, woken)
        if outcomes:
            await self._settled(outcomes)
        if later or not owners:
            return None  # claims whose completes wait for the next statement, or no claim ran
        if len(rows) == len(owners):
            return None  # every slot filled: there may be more work for newer waiters
        if hold is not None:
            # A limit, not a lack of work, left slots empty: no empty verdict.
            state.held_until = loop.time() + hold
            return hold
        sampled = (drops, read_at, trusted)
        return await self._record_empty(state, version, due_in, sampled, waiters)

    async def _apply(self, runtime_id: str, carried: list[Waiter]) -> list[ItemResult]:
        """Apply the completes of `carried` (distinct tasks, within waiters.CARRIED_MAX) in a
        statement of their own, which claims nothing: their outcomes in order. Raises
        what the statement raises (nothing applied)."""
        if not carried:
            return []
        with releasing():
            _, _, outcomes = await self._store.claim_acked(runtime_id, [], [], merged(carried))
        return outcomes

    async def _settle_alone(self, state: RuntimeState) -> None:
        """Apply the completes that the runtime's waiting claims carry, without a claim:
        each claim's are answered, or it fails with the statement's error (nothing of
        its applied). Its waiters stay in flight meanwhile, so that none leaves thinking
        its wait checked before its completes are in."""
        while pending := unsettled(idle(state)):
            carried, _ = fit_statement(pending)
            for waiter in carried:
                waiter.in_flight = True
            try:
                async with self._slots.hold(state, len(carried)):
                    outcomes = await self._apply(state.runtime_id, carried)
            except GatewayError as exc:
                for waiter in carried:
                    waiter.in_flight = False
                    waiter.finish(error=exc)
                continue
            except Exception:
                failed(carried)
                raise
            share(carried, outcomes)
            for waiter in carried:
                waiter.in_flight = False
                waiter.poke()
            await self._settled(outcomes)

    def _held(self, state: RuntimeState, woken: bool) -> float | None:
        """Runtime controls (gateway/claim/controls.py), from this process's copy: how long to
        park without a claim, or None to go on. A paused runtime, or one a limit held
        back with no wake-up since, costs no Postgres statement for claims however many
        polls park; its polls without a wait are answered at once."""
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
            if parked and woken and waiter.trace is not None and tracing.active is not None:
                tracing.active.woken(waiter.trace, len(mine or ()))
            waiter.finish(rows=mine)  # wakes it: served, or checked and still waiting
        self._activity.add(runtime_id, len(rows) - len(undelivered))
        if undelivered:
            # Their polls left while the claim ran: give the tasks back and wake the others,
            # in the background (give-backs share statements: one slow statement must not
            # hold up this runtime's next claim).
            self._give_back(runtime_id, undelivered)

    async def _record_empty(
        self,
        state: RuntimeState,
        version: str | None,
        due_in: float | None,
        sampled: tuple[int, float, bool] = (-1, 0.0, False),
        made_for: list[Waiter] | None = None,
    ) -> float:
        """The scan found fewer tasks than wanted: write the verdict under the version
        read before the scan (I2), never outliving the next due task (I4). `sampled`:
        the near-cache drop count, loop time and trust taken before that read;
        `made_for`: the polls of that scan (the verdict's span names them)."""
        ttl = self._settings.empty_ttl_seconds
        if due_in is not None:
            ttl = min(ttl, due_in)
        if version is not None:
            try:
                with tracing.client("redis", "SET", None, made_for or ()):
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
