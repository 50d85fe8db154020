"""The waiters of the claim path (gateway/claim/claimer.py): one parked claim request
(`Waiter`), the signal that its client left (`Departure`, which a wait for a task's
result uses too), the shared timers that end parked waits (`Deadlines`), and what the
process holds per runtime (`RuntimeState`: its waiters, its pump, its near-cache and
the verdict it renews). The `Claimer` owns them all; it and the runtimes' pumps
(gateway/claim/pump.py) decide what they hold.

Memory per parked poll matters here (up to GATEWAY_MAX_PARKED_POLLS of them): a parked
poll waits on one future at a time, hears of its client leaving through a callback,
and shares its deadline's timer with the others in its slot.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..admission import Caller
from ..api.requests import ClaimRequest
from ..errors import GatewayError, StoreUnavailable
from ..flag import Flag
from ..rows import CarriedCompletes, ItemResult, Leased

# Parked waiters whose deadlines fall in the same slot of this length share one timer.
DEADLINE_SLOT_SECONDS = 0.05


class Departure:
    """Set once, when a poll's client disconnects. A parked poll hears of it at once,
    through a callback: no task or future of its own waits for it."""

    __slots__ = ("_callbacks", "_gone")

    def __init__(self) -> None:
        self._gone = False
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._gone

    def set(self) -> None:
        if not self._gone:
            self._gone = True
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def on_set(self, callback: Callable[[], None]) -> None:
        """Call `callback` when set (at once if it already is)."""
        if self._gone:
            callback()
        else:
            self._callbacks.append(callback)


def wake_signal(signal: asyncio.Future[None] | None) -> None:
    """Resolve a parked request's signal, if it has one still pending: what ends its
    wait, for a claim (Waiter) as for a wait for a result (results.py). Idempotent."""
    if signal is not None and not signal.done():
        signal.set_result(None)


@dataclass(eq=False, slots=True)
class Carried:
    """The completes one claim carries (its `complete` field), applied by the statement
    its pump runs for it (Store.claim_acked), so that they commit with the claim in one
    round trip. `runtimes`: its caller's runtime patterns (None: every runtime).
    `settle`, given by the request, turns the outcomes into what its answer holds (a
    parked poll then keeps that, not the outcomes); `answer` is it, once applied: None
    while the completes are not applied."""

    task_ids: list[uuid.UUID]
    lease_ids: list[uuid.UUID]
    results: list[str | None]
    runtimes: tuple[str, ...] | None
    settle: Callable[[list[ItemResult]], object]
    answer: object = None

    def settled(self, outcomes: list[ItemResult]) -> None:
        self.answer = self.settle(outcomes)


@dataclass(eq=False, slots=True)
class Waiter:
    """One claim request parked in this process. Memory per parked poll matters (up to
    GATEWAY_MAX_PARKED_POLLS of them): it waits on one future at a time, made when it
    sleeps, rather than on an Event and a task per wait."""

    req: ClaimRequest
    deadline: float  # loop time
    rows: list[Leased] | None = None
    error: GatewayError | None = None
    checked: bool = False  # a full verdict check or claim ran since it arrived
    in_flight: bool = False  # has slots in the Postgres claim running now
    gone: bool = False  # its client disconnected, or its wait ended: it must receive nothing
    signal: asyncio.Future[None] | None = None  # resolved to wake its request
    slot: int = 0  # its deadline's slot in Deadlines
    matched: bool = False  # an enqueue is writing a task leased to it (sync match)
    carried: Carried | None = None  # completes to apply with its first claim
    # Its client's connection, told by the HTTP protocol when it is lost (no Departure
    # watches a claim without a wait: this is checked as its statement is about to run).
    caller: Caller | None = None
    # Its request's server span while tracing is on (gateway/tracing), for the spans of
    # the calls made for it; None while it is off.
    trace: Any = None

    @property
    def owes_completes(self) -> bool:
        """It carries completes that are not applied yet."""
        return self.carried is not None and self.carried.answer is None

    @property
    def lease(self) -> tuple[str, float]:
        """Its worker and lease length, for a task leased to it (sync match)."""
        return self.req.worker_id, float(self.req.lease_seconds)

    def poke(self) -> None:
        """Wake the request to look at its state again."""
        wake_signal(self.signal)

    def leave(self) -> None:
        """Its client disconnected (Departure's callback)."""
        self.gone = True
        self.poke()

    def finish(self, rows: list[Leased] | None = None, error: GatewayError | None = None) -> None:
        if rows is not None:
            self.rows = rows
        if error is not None:
            self.error = error
        self.poke()


class Deadlines:
    """Wakes parked waiters when their wait runs out: one timer per slot of
    DEADLINE_SLOT_SECONDS, shared by every waiter whose deadline falls in it, rather than
    one timer per waiter (memory per parked poll). A wait ends at most one slot late."""

    def __init__(self) -> None:
        self._slots: dict[int, dict[Waiter, None]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def add(self, waiter: Waiter) -> None:
        key = waiter.slot = math.ceil(waiter.deadline / DEADLINE_SLOT_SECONDS)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = {}
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_at(key * DEADLINE_SLOT_SECONDS, self._expire, key)
        slot[waiter] = None

    def discard(self, waiter: Waiter) -> None:
        slot = self._slots.get(waiter.slot)
        if slot is not None and slot.pop(waiter, 0) is None and not slot:
            del self._slots[waiter.slot]
            self._timers.pop(waiter.slot).cancel()

    def _expire(self, key: int) -> None:
        self._timers.pop(key, None)
        now = asyncio.get_running_loop().time()
        for waiter in self._slots.pop(key, {}):
            # A timer may fire a little early: the wait counts as run out all the same.
            waiter.deadline = min(waiter.deadline, now)
            waiter.poke()


@dataclass(eq=False)
class RuntimeState:
    """What this process holds for one runtime while polls park for it (and for
    LINGER_SECONDS after the last has left, gateway/claim/claimer.py)."""

    runtime_id: str
    channel: str
    waiters: list[Waiter] = field(default_factory=list)
    wake: Flag = field(default_factory=Flag)
    pump: asyncio.Task[None] | None = None
    linger: asyncio.TimerHandle | None = None
    # A wake-up (pub/sub, or a bump here) arrived since the pump's last cycle began;
    # a new poll's arrival also sets `wake`, but is not a wake-up.
    woken: bool = False
    # The near-cache: the version of a verdict hit kept in this process, and until when
    # (loop time, never past the verdict's life in Redis). Trusted only while the
    # runtime's subscription is confirmed and Redis healthy, since then a bump anywhere
    # reaches this process as a wake-up, which drops it.
    near_version: str | None = None
    near_until: float = 0.0
    # Counts drops of the near-cache: a verdict read before a drop is not kept after it.
    near_drops: int = 0
    # An empty verdict this process wrote: while polls are parked, it is renewed in Redis
    # shortly before its life ends, instead of a Postgres scan, as long as no bump made
    # it stale, and never past the next delayed task's due time (I4). Its version, when
    # to renew it, and that due time (loop times; None: nothing delayed).
    renew_version: str | None = None
    renew_at: float = 0.0
    renew_due_at: float | None = None
    # The version a bump by this process returned, not yet used by the pump: the next
    # cycle claims under it without reading the verdict (a sure miss).
    bumped: str | None = None
    # Runtime controls: a limit cut the last claim short; until this loop time the pump
    # claims again only after a wake-up (a freed slot, a change of the controls).
    held_until: float = 0.0
    # Claim statements of this runtime that hold a claim slot (GATEWAY_MAX_CONCURRENT_CLAIMS),
    # and the helpers running: a helper claims for polls that arrive while every running
    # coroutine's statement runs (gateway/claim/pump.py, STATEMENTS_PER_RUNTIME), never
    # beside one still waiting for a slot.
    running: int = 0
    helpers: set[asyncio.Task[None]] = field(default_factory=set)


def unsettled(waiters: list[Waiter]) -> list[Waiter]:
    """Those of `waiters` whose carried completes are not applied yet."""
    return [w for w in waiters if w.owes_completes]


def idle(state: RuntimeState) -> list[Waiter]:
    """Unserved waiters that a new claim statement may serve: none runs for them, and
    they are not leaving (checked, with their wait over: their request answers them
    with nothing as soon as it runs, which another statement would only delay)."""
    now = asyncio.get_running_loop().time()
    return [w for w in unserved(state) if not w.in_flight and not (w.checked and w.deadline <= now)]


def unserved(state: RuntimeState) -> list[Waiter]:
    """Waiters still wanting tasks: present, not answered, not failed, not promised
    an enqueue's task (sync match)."""
    return [
        w
        for w in state.waiters
        if not w.gone and w.rows is None and w.error is None and not w.matched
    ]


def still_wanted(waiters: list[Waiter]) -> tuple[list[Waiter], int]:
    """Those of `waiters` (in flight, waiting for a claim slot) that a claim statement
    should still serve, and how many of them left: a claim whose client left (`gone`,
    or its connection lost) is not claimed for, and is let go (no longer in flight,
    woken, so that its request ends) unless it carries completes still to apply, which
    the statement applies though its client left."""
    kept: list[Waiter] = []
    left = 0
    for waiter in waiters:
        if waiter.caller is not None and waiter.caller.gone:
            waiter.gone = True
        if waiter.gone:
            left += 1
            if not waiter.owes_completes:
                waiter.in_flight = False
                waiter.poke()
                continue
        kept.append(waiter)
    return kept, left


# Carried completes one claim statement applies at most, from the claims it serves: a
# claim whose completes would pass it (unless it is the first) waits for the next one.
CARRIED_MAX = 1000


def fit_statement(waiters: list[Waiter]) -> tuple[list[Waiter], list[Waiter]]:
    """`waiters` split into those one statement serves and those left for the next: a
    claim whose carried completes name a task that an earlier one's do (a replay sent
    while the first was in flight: one statement would apply the task once, for either),
    or that would take the statement past CARRIED_MAX, waits."""
    taken: list[Waiter] = []
    later: list[Waiter] = []
    named: set[object] = set()
    for waiter in waiters:
        carried = waiter.carried
        if carried is not None and carried.answer is None:
            ids = carried.task_ids
            if (named and len(named) + len(ids) > CARRIED_MAX) or not named.isdisjoint(ids):
                later.append(waiter)
                continue
            named.update(ids)
        taken.append(waiter)
    return taken, later


def merged(carried: list[Waiter]) -> CarriedCompletes:
    """The completes of `carried`, one claim after another, each item with its claim's
    runtime patterns."""
    task_ids, lease_ids, results, runtimes = [], [], [], []
    for waiter in carried:
        c = waiter.carried
        assert c is not None
        task_ids += c.task_ids
        lease_ids += c.lease_ids
        results += c.results
        runtimes += [c.runtimes] * len(c.task_ids)
    return CarriedCompletes(task_ids, lease_ids, results, runtimes)


def share(carried: list[Waiter], outcomes: list[ItemResult]) -> None:
    """Each claim of `carried` gets its own items' outcomes (in _merged's order)."""
    start = 0
    for waiter in carried:
        c = waiter.carried
        assert c is not None
        end = start + len(c.task_ids)
        c.settled(outcomes[start:end])
        start = end


def failed(waiters: list[Waiter]) -> None:
    """Answer `waiters` with an internal error: a bug, not the database, ended their claim."""
    for waiter in waiters:
        waiter.in_flight = False
        waiter.finish(error=StoreUnavailable("internal error in the claim path"))
