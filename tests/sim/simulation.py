"""A seeded random schedule of operations, run through the real Claimer and the real
VerdictCache over the fakes on virtual time, with the design's invariants checked
after every step. `run_seed(seed)` is deterministic: a failing seed replays."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.api.requests import ClaimRequest
from gateway.claim.claimer import Claimer
from gateway.claim.waiters import Carried, Departure
from gateway.errors import CacheUnavailable, GatewayError, Overloaded, StoreUnavailable
from gateway.metrics import Metrics
from gateway.redis.breaker import CircuitBreaker
from gateway.redis.verdict import VerdictCache
from gateway.settings import Settings

from . import vloop
from .fakes import FakeRedis, FakeStore, FakeWakeChannels, now

RUNTIMES = ("rt-a", "rt-b", "rt-c")
SETTINGS = Settings()  # the defaults: 30 s verdicts, 1 s degraded polls, janitor every 5 s
STORE_LATENCY = 0.02  # per statement, at most
# A poll is answered by its deadline plus one claim in flight.
ANSWER_MARGIN = 3 * STORE_LATENCY + 0.05
# Undisturbed (no Redis or pub/sub failure lately), a claimable task reaches a parked
# poll within a few claims: a bump's wake-up, a claim already running, the next one,
# and the verdict's millisecond rounding.
TIGHT_BOUND = 0.25
# After a pub/sub outage, FLUSHALL or eviction (Redis answering), the janitor's repair
# pass (I6) and degraded polling are the backstops: the next pass or the one after,
# plus an open breaker and a degraded poll.
LOOSE_BOUND = (
    2 * SETTINGS.janitor_interval_seconds
    + SETTINGS.breaker_open_seconds
    + SETTINGS.degraded_poll_seconds
    + 1.0
)

# During a pub/sub outage: once it is noticed, every waiter re-checks and then polls.
PUBSUB_BOUND = SETTINGS.degraded_poll_seconds + TIGHT_BOUND

# While Redis fails, bumps are lost and the repair pass cannot run either; a pump that
# sees a failure re-checks within a degraded poll and then polls Postgres. Once Redis
# answers again, the repair pass finds what is left within LOOSE_BOUND, counted from the
# last failure (or lost publish). A poll may stay parked on a verdict whose life does not
# know of a delayed task enqueued then (I4 needs the wake-up), so this holds for tasks
# coming due within a verdict's life after the loss.
AFTER_LOSS = SETTINGS.empty_ttl_seconds + LOOSE_BOUND

# During a sustained outage of Redis commands (pub/sub still up), once every pump has
# noticed it (the watch's ping, then a spread re-check), polls find tasks by polling
# Postgres: a degraded poll interval, plus one claim.
DOWN_SETTLE = 3 * SETTINGS.degraded_poll_seconds + SETTINGS.redis_timeout_seconds * 3
DOWN_BOUND = SETTINGS.degraded_poll_seconds + 3 * STORE_LATENCY + 0.05

_METRICS = Metrics()  # counters only; shared so that thousands of runs stay cheap


def generate(seed: int, steps: int = 40) -> list[tuple[Any, ...]]:
    """The schedule: a list of operations, each a tuple, from the seed alone."""
    rng = random.Random(seed)
    # Some schedules are calm (no failures at all), so the tight bound gets checked a lot.
    profile = rng.random()
    calm = profile < 0.4
    # Others see their runtimes' commits happen on other instances, with pub/sub
    # outages instead of Redis failures: wake-ups then arrive only through pub/sub.
    remote = profile > 0.8
    ops: list[tuple[Any, ...]] = []
    # Some run with room for one Postgres claim and one queued (I9): others are refused.
    if rng.random() < 0.15:
        ops.append(("crowded",))
    for _ in range(steps):
        rt = rng.choice(RUNTIMES)
        roll = rng.random()
        if calm and 0.55 <= roll < 0.73:
            roll = rng.random() * 0.55
        elif remote and 0.55 <= roll < 0.69:
            roll = rng.choice((0.70, 0.72))  # a lost publish or a pub/sub outage
        if roll < 0.22:
            delay = 0.0 if rng.random() < 0.5 else round(rng.uniform(0.0, 40.0), 4)
            via = "other" if remote else rng.choice(("here", "other"))
            ops.append(("enqueue", rt, delay, rng.choice((0, 0, 1)), via))
        elif roll < 0.45:
            wait = 0.0 if rng.random() < 0.15 else round(rng.uniform(0.5, 60.0), 3)
            gone = round(rng.uniform(0.0, 5.0), 3) if rng.random() < 0.1 else None
            carry = rng.choice((0, 0, 0, 1, 2))  # held tasks whose completes it carries
            ops.append(
                ("poll", rt, rng.choice((1, 1, 2, 3)), wait, rng.choice((5, 60)), gone, carry)
            )
        elif roll < 0.55:
            retry_in = rng.choice((None, 0.0, 2.5, 12.0))
            via = "other" if remote else rng.choice(("here", "other"))
            ops.append(("finish", rng.randrange(1000), retry_in, via))
        elif roll < 0.585:
            ops.append(("pg_fault", rng.choice(("before", "after")), rng.choice((1, 1, 3))))
        elif roll < 0.60:
            ops.append(("redis_fault", rng.choice(("before", "after")), rng.choice((1, 1, 2, 4))))
        elif roll < 0.62:
            ops.append(("redis_down", round(rng.uniform(1.0, 40.0), 3)))
        elif roll < 0.65:
            ops.append(("flushall",))
        elif roll < 0.69:
            ops.append(("evict", rt, rng.choice(("version", "empty"))))
        elif roll < 0.71:
            ops.append(("lose_publishes", rng.choice((1, 1, 2, 5))))
        elif roll < 0.73:
            ops.append(
                ("pubsub_outage", round(rng.uniform(0.0, 3.0), 3), round(rng.uniform(0.05, 5.0), 3))
            )
        else:
            ops.append(
                ("sleep", round(rng.expovariate(1.0) * (10.0 if rng.random() < 0.1 else 1.0), 4))
            )
    return ops


@dataclass
class Poll:
    runtime_id: str
    start: float
    deadline: float
    done: float | None = None
    rows: list[Any] = field(default_factory=list)


@dataclass
class Held:
    task_id: uuid.UUID
    lease_id: uuid.UUID
    expires_at: float
    done: bool = False


class World:
    def __init__(self, seed: int, crowded: bool = False) -> None:
        self.rng = random.Random(seed ^ 0x5EED)
        self.settings = SETTINGS
        self.crowded = crowded
        if crowded:
            self.settings = replace(SETTINGS, max_concurrent_claims=1, max_queued_claims=1)
        self.store = FakeStore(self.rng, STORE_LATENCY)
        self.channels = FakeWakeChannels(self.settings.redis_prefix)
        self.redis = FakeRedis(self.rng, self.channels.publish)
        # This instance's cache, and the other instances' (their own breaker, the same
        # Redis): their producers' bumps and the janitor's leader go through that one.
        self.cache = self._cache(on_trouble=lambda: self.claimer.redis_trouble())
        self.others = self._cache()
        self.claimer = Claimer(
            self.store, self.cache, self.channels, self.settings, _METRICS, random.Random(seed)
        )
        self.channels.on_wake = self.claimer.wake
        self.channels.on_reset = self.claimer.wake_all
        self.polls: list[Poll] = []
        self.held: list[Held] = []
        self.violations: list[str] = []
        self.disturbed_at = -1e9  # last FLUSHALL or eviction
        self.outages: list[tuple[float, float, float]] = []  # pub/sub: begun, noticed, back
        self.down = (-1e9, -1e9)  # the last sustained Redis outage: (start, end)
        self.tasks: set[asyncio.Task[None]] = set()

    def _cache(self, on_trouble: Callable[[], None] | None = None) -> VerdictCache:
        return VerdictCache(
            self.redis,  # type: ignore[arg-type]
            self.settings.redis_prefix,
            _METRICS,
            timeout_seconds=self.settings.redis_timeout_seconds,
            version_ttl_seconds=self.settings.version_ttl_seconds,
            breaker=CircuitBreaker(
                self.settings.breaker_failures,
                self.settings.breaker_open_seconds,
                asyncio.get_running_loop().time,
            ),
            on_trouble=on_trouble,
        )

    # -- what the app does around the Claimer --------------------------------

    async def announce(self, runtime_id: str, via: str = "here") -> None:
        """After a commit (I1). Via "other": the commit happened on another instance,
        whose bump reaches this one only through Redis (no local wake)."""
        if via == "here":
            await self.claimer.announce(runtime_id)
        else:
            with contextlib.suppress(CacheUnavailable):
                await self.others.bump(runtime_id)

    async def janitor(self) -> None:
        """Lease reclaim and verdict repair, as gateway/janitor.py does them."""
        while True:
            await asyncio.sleep(self.settings.janitor_interval_seconds)
            # The janitor's leader is usually another instance.
            for runtime_id in self.store.reclaim_leases():
                await self.announce(runtime_id, "other")
            claimable = sorted({t.runtime_id for t in self.store.claimable()})
            try:
                stale = await self.others.says_empty(claimable)
            except CacheUnavailable:
                continue
            for runtime_id in stale:
                await self.announce(runtime_id, "other")
            with contextlib.suppress(CacheUnavailable):
                await self.others.wake([r for r in claimable if r not in stale])

    async def poll(
        self,
        rt: str,
        max_tasks: int,
        wait: float,
        lease: int,
        gone: float | None,
        carry: int = 0,
    ) -> None:
        p = Poll(rt, now(), now() + wait)
        self.polls.append(p)
        disconnected = Departure() if gone is not None else None
        if disconnected is not None:
            asyncio.get_running_loop().call_later(gone or 0.0, disconnected.set)
        req = ClaimRequest(
            worker_id="w", max_tasks=max_tasks, wait_seconds=wait, lease_seconds=lease
        )
        carried = self.carry(carry)
        failed = True
        try:
            rows = await self.claimer.claim(rt, req, disconnected, carried)
            failed = False
        except (StoreUnavailable, Overloaded) as exc:
            # Answered with an error (503, 429): allowed only for what was put in.
            expected = (
                self.store.last_fault_at >= p.start
                if isinstance(exc, StoreUnavailable)
                else self.crowded
            )
            if not expected:
                self.violations.append(f"poll on {rt} failed: {exc!r}")
            rows = []
        except GatewayError as exc:
            self.violations.append(f"poll on {rt} failed: {exc!r}")
            rows = []
        self.check(when="answer")
        if carried is not None:
            self.check_carried(carried, failed or bool(disconnected and disconnected.is_set()))
        p.done = now()
        if disconnected is not None and disconnected.is_set() and rows:
            await self.claimer.give_back(rt, [r.task for r in rows])  # as daemon_routes.py does
            return
        p.rows = rows
        for row in rows:
            task = self.store.tasks[row.task.id]
            self.held.append(Held(task.id, row.task.lease_id, task.lease_expires_at))
        self.check(when="delivery")

    def carry(self, n: int) -> Carried | None:
        """The completes of up to `n` held tasks, for a poll to carry (as a worker's
        next claim carries the tasks it finished); they are no longer held."""
        live = [h for h in self.held if not h.done][:n]
        if not live:
            return None
        for h in live:
            h.done = True
        ids = [h.task_id for h in live]
        return Carried(ids, [h.lease_id for h in live], [None] * len(ids), None, list)

    def check_carried(self, carried: Carried, failed_or_left: bool) -> None:
        """A poll answered without an error has its carried completes applied (their
        outcomes in its answer), each completed one completed in the store."""
        outcomes = carried.answer
        if outcomes is None:
            if not failed_or_left:
                self.violations.append(
                    f"t={now():.4f} a poll answered with its completes unapplied"
                )
            return
        assert isinstance(outcomes, list)
        for outcome in outcomes:
            if outcome.error is None and self.store.tasks[outcome.task_id].status != "completed":
                self.violations.append(
                    f"t={now():.4f} task {outcome.task_id} answered completed, but is "
                    f"{self.store.tasks[outcome.task_id].status}"
                )

    def spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- the schedule --------------------------------------------------------

    async def step(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "enqueue":
            _, rt, delay, priority, via = op
            self.store.enqueue(rt, delay, priority)
            await self.announce(rt, via)
        elif kind == "poll":
            self.spawn(self.poll(*op[1:]))
            await asyncio.sleep(0)
        elif kind == "finish":
            _, k, retry_in, via = op
            live = [h for h in self.held if not h.done]
            if live:
                h = live[k % len(live)]
                h.done = True
                if self.store.finish(h.task_id, h.lease_id, retry_in) and retry_in is not None:
                    await self.announce(self.store.tasks[h.task_id].runtime_id, via)
        elif kind == "redis_fault":
            _, when, n = op
            self.redis.faults.extend([when] * n)
        elif kind == "crowded":
            pass  # read by World's constructor
        elif kind == "pg_fault":
            _, when, n = op
            self.store.faults.extend([when] * n)
        elif kind == "redis_down":
            self.redis.down_until = now() + op[1]
            self.down = (now(), now() + op[1])
        elif kind == "flushall":
            self.redis.flushall()
            self.disturbed_at = now()
        elif kind == "evict":
            _, rt, which = op
            self.redis.evict(getattr(self.cache.keys(rt), which))
            self.disturbed_at = now()
        elif kind == "lose_publishes":
            self.channels.lose += op[1]
        elif kind == "pubsub_outage":
            _, notice_after, down_for = op
            t = now()
            if self.channels.outage(notice_after, down_for):
                self.outages.append((t, t + notice_after, t + notice_after + down_for))
        elif kind == "sleep":
            await asyncio.sleep(op[1])
        else:
            raise AssertionError(op)

    # -- invariants ----------------------------------------------------------

    def check(self, when: str) -> None:
        t = now()
        # Queued faults may wait long for a round trip (the breaker skips Redis): a
        # Redis failure counts from when one actually happened.
        # The breaker keeps skipping Redis for a while after an outage, so its end
        # counts as a failure too, and so does a publish lost on a live connection.
        failed_at = max(self.redis.last_fault_at, min(t, self.down[1]), self.channels.lost_at)
        # I7: a task is held by at most one live lease.
        holders: dict[uuid.UUID, int] = {}
        for h in self.held:
            if not h.done and t < h.expires_at:
                holders[h.task_id] = holders.get(h.task_id, 0) + 1
        for task_id, n in holders.items():
            if n > 1:
                self.violations.append(f"t={t:.4f} task {task_id} held by {n} live leases")
        # A lease nobody holds (its answer was lost) lapses and the janitor takes the
        # task back: none stays claimed past its lease and a janitor interval.
        for task in self.store.tasks.values():
            stranded = t - task.lease_expires_at - self.settings.janitor_interval_seconds
            if task.status == "claimed" and stranded > ANSWER_MARGIN:
                self.violations.append(f"t={t:.4f} task {task.id} stranded {stranded:.4f}s")
        for p in self.polls:
            if p.done is not None:
                continue
            # Every parked poll is answered by its deadline (plus a claim in flight).
            if t > p.deadline + ANSWER_MARGIN:
                self.violations.append(
                    f"t={t:.4f} poll on {p.runtime_id} (started {p.start:.4f}) unanswered "
                    f"{t - p.deadline:.4f}s past its deadline"
                )
            # No claimable task hidden from a parked poll beyond the bound.
            for task in self.store.claimable(p.runtime_id):
                since = max(task.claimable_since, p.start)
                down_from, down_to = self.down
                if down_from + DOWN_SETTLE <= since < down_to:
                    bound = DOWN_BOUND  # Postgres polling must find it, Redis or not
                elif since <= failed_at + AFTER_LOSS:
                    since, bound = max(since, failed_at), LOOSE_BOUND
                elif since <= self.disturbed_at + LOOSE_BOUND:
                    bound = LOOSE_BOUND
                elif outage := next((o for o in self.outages if o[0] <= since < o[2]), None):
                    # Wake-ups published before the loss was noticed are gone; noticing
                    # wakes every waiter (I8), and until the connection is back they poll.
                    since, bound = max(since, outage[1]), PUBSUB_BOUND
                else:
                    bound = TIGHT_BOUND
                if t - since > bound and min(t, p.deadline) - since > bound:
                    self.violations.append(
                        f"t={t:.4f} ({when}) task {task.id} on {p.runtime_id} claimable since "
                        f"{task.claimable_since:.4f} hidden from a poll parked since "
                        f"{p.start:.4f} for {t - since:.4f}s (bound {bound}s)"
                    )
        # The first few, once each: one bug makes many.
        self.violations[:] = list(dict.fromkeys(self.violations))[:5]


@dataclass
class Outcome:
    seed: int
    ops: list[tuple[Any, ...]]
    violations: list[str]
    claims: int
    delivered: int
    virtual_seconds: float

    def replay(self) -> str:
        lines = [f"seed {self.seed}: replay with SIM_SEED={self.seed}", *self.violations, "ops:"]
        lines += [f"  {i:3d} {op!r}" for i, op in enumerate(self.ops)]
        return "\n".join(lines)


async def _run(seed: int, ops: list[tuple[Any, ...]]) -> Outcome:
    world = World(seed, crowded=bool(ops) and ops[0] == ("crowded",))
    janitor = asyncio.ensure_future(world.janitor())
    watch = asyncio.ensure_future(world.claimer.watch_redis())
    for op in ops:
        await world.step(op)
        world.check(when=op[0])
        if world.violations:
            break
    # Let every poll reach its deadline, checking along the way.
    while not world.violations and any(p.done is None for p in world.polls):
        await asyncio.sleep(0.5)
        world.check(when="drain")
        if now() > max(p.deadline for p in world.polls) + 60:
            world.violations.append(f"t={now():.4f} polls still unanswered a minute late")
    for background in (janitor, watch):
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
    world.claimer.drain()
    return Outcome(
        seed,
        ops,
        world.violations,
        world.store.claims,
        sum(len(p.rows) for p in world.polls),
        now(),
    )


def run_seed(seed: int, steps: int = 40) -> Outcome:
    ops = generate(seed, steps)
    outcome: Outcome = vloop.run(_run(seed, ops))
    return outcome


__all__ = ["Outcome", "generate", "run_seed"]
