"""In-memory stand-ins for Postgres, Redis and the pub/sub subscriber, on the running
loop's (virtual) clock, with the failures the claim path must survive.

FakeRedis sits *under* the real VerdictCache, so the verdict decision code (epochs,
PTTL handling, the bump script's logic, the breaker) is the code under test too.
"""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.errors import LeaseLost, NotFound, StoreUnavailable
from gateway.redis.keys import runtime_of_channel
from gateway.redis.verdict import BUMP_AND_PUBLISH_SCRIPT, PUBLISH_ALL_SCRIPT, RENEW_SCRIPT
from gateway.rows import CarriedCompletes, ItemResult, Leased, TaskRow

T = TypeVar("T")


def now() -> float:
    return asyncio.get_running_loop().time()


# -- Postgres --------------------------------------------------------------------


@dataclass(eq=False)
class FakeTask:
    id: uuid.UUID
    runtime_id: str
    priority: int
    seq: int  # created_at order
    run_at: float
    status: str = "queued"  # queued | claimed | completed
    lease_id: uuid.UUID | None = None
    lease_expires_at: float = 0.0
    attempts: int = 0
    claimable_since: float = 0.0  # when it last became queued and due (for the checks)

    def row(self) -> TaskRow:
        """As the store hands it up; virtual seconds become times after the epoch."""
        at = [datetime.fromtimestamp(x, UTC) for x in (self.run_at, self.lease_expires_at)]
        return TaskRow(
            self.id, self.runtime_id, self.status, self.priority, None, self.attempts, 3,
            at[0], None, at[0], at[0], self.lease_id, at[1], "w", False, None, None,
        )  # fmt: skip


class FakeStore:
    """Tasks in memory. claim() scans at one instant (the statement's snapshot) and
    returns after a random latency, so commits can land while a claim is running."""

    def __init__(self, rng: random.Random, max_latency: float = 0.02) -> None:
        self._rng = rng
        self._max_latency = max_latency
        self.tasks: dict[uuid.UUID, FakeTask] = {}
        self._seq = 0
        self.claims = 0
        # Injected failures of claim statements, one per claim: "before" fails with no
        # effect, "after" commits and then loses the answer (the leases hold nobody).
        self.faults: list[str] = []
        self.last_fault_at = -1e9

    def _latency(self) -> float:
        return self._rng.uniform(0.0, self._max_latency)

    def _uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    def enqueue(self, runtime_id: str, delay: float, priority: int) -> FakeTask:
        self._seq += 1
        t = now()
        task = FakeTask(self._uuid(), runtime_id, priority, self._seq, t + delay)
        task.claimable_since = task.run_at
        self.tasks[task.id] = task
        return task

    def claimable(self, runtime_id: str | None = None) -> list[FakeTask]:
        t = now()
        return [
            x
            for x in self.tasks.values()
            if x.status == "queued"
            and x.run_at <= t
            and (runtime_id is None or x.runtime_id == runtime_id)
        ]

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> tuple[list[Leased], float | None]:
        self.claims += 1
        await asyncio.sleep(self._latency())
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            self.last_fault_at = now()
        if fault == "before":
            raise StoreUnavailable("injected: the claim failed")
        t = now()
        picked = sorted(self.claimable(runtime_id), key=lambda x: (-x.priority, x.seq))
        rows: list[Leased] = []
        for slot, task in enumerate(picked[: len(worker_ids)], start=1):
            task.status = "claimed"
            task.attempts += 1
            task.lease_id = self._uuid()
            task.lease_expires_at = t + lease_seconds[slot - 1]
            rows.append(Leased(slot, task.row()))
        due_in = None
        if len(rows) < len(worker_ids):
            later = [
                x.run_at
                for x in self.tasks.values()
                if x.runtime_id == runtime_id and x.status == "queued" and x.run_at > t
            ]
            due_in = min(later) - t if later else None
        await asyncio.sleep(self._latency())  # commit and answer: time passes
        if fault == "after":
            raise StoreUnavailable("injected: the connection died after the commit")
        return rows, due_in

    async def claim_acked(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        completes: CarriedCompletes,
    ) -> tuple[list[Leased], float | None, list[ItemResult]]:
        """claim, after completing each carried task its lease holds, in one step (the
        real statement's one commit): a fault fails both. Runtime patterns are not
        modelled (the simulation's claims carry no completes of foreign runtimes)."""
        if self.faults and self.faults[0] == "before":
            await self.claim(runtime_id, worker_ids, lease_seconds)  # fails: nothing applied
        outcomes = []
        for task_id, lease_id in zip(completes.task_ids, completes.lease_ids, strict=True):
            task = self.tasks.get(task_id)
            if task is None:
                outcomes.append(ItemResult(task_id, None, None, NotFound(f"no task {task_id}")))
            elif self.finish(task_id, lease_id, None):
                outcomes.append(ItemResult(task_id, task.runtime_id, "completed"))
            else:
                lost = LeaseLost(
                    f"lease {lease_id} does not hold {task_id}", task_status=task.status
                )
                outcomes.append(ItemResult(task_id, task.runtime_id, task.status, lost))
        rows, due_in = await self.claim(runtime_id, worker_ids, lease_seconds)
        return rows, due_in, outcomes

    def connection_free(self) -> bool:
        return True  # no pool: a statement never waits for a connection

    def client_gone(self, claims: int) -> None:
        self.gone_claims = getattr(self, "gone_claims", 0) + claims

    def crowded(self) -> bool:
        return False  # no line for connections: nothing is shed for it

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        await asyncio.sleep(self._latency())
        out: list[uuid.UUID] = []
        for task_id, lease_id in zip(task_ids, lease_ids, strict=True):
            task = self.tasks[task_id]
            if task.status == "claimed" and task.lease_id == lease_id:
                task.status, task.lease_id = "queued", None
                task.attempts = max(task.attempts - 1, 0)
                task.claimable_since = max(now(), task.run_at)
                out.append(task.id)
        return out

    def finish(self, task_id: uuid.UUID, lease_id: uuid.UUID, retry_in: float | None) -> bool:
        """complete (retry_in None) or fail with backoff; False if the lease is not held."""
        task = self.tasks[task_id]
        if task.status != "claimed" or task.lease_id != lease_id:
            return False
        task.lease_id = None
        if retry_in is None:
            task.status = "completed"
        else:
            task.status, task.run_at = "queued", now() + retry_in
            task.claimable_since = task.run_at
        return True

    def reclaim_leases(self) -> list[str]:
        """The janitor's lease reclaim: expired leases go back to the queue."""
        t = now()
        runtimes = []
        for task in self.tasks.values():
            if task.status == "claimed" and task.lease_expires_at <= t:
                task.status, task.lease_id, task.claimable_since = "queued", None, t
                task.run_at = min(task.run_at, t)
                runtimes.append(task.runtime_id)
        return sorted(set(runtimes))


# -- Redis -----------------------------------------------------------------------

_VERSION = re.compile(r"^(.+):(\d+)$")


class FakeRedis:
    """Just the commands VerdictCache uses, with millisecond TTLs on the virtual clock.

    `faults` is a queue of injected failures, one per round trip: "before" fails
    without effect, "after" takes effect and then fails (a reply lost to a timeout).
    """

    def __init__(self, rng: random.Random, publish: Callable[[str, str], int]) -> None:
        self._rng = rng
        self._publish = publish
        self.data: dict[str, tuple[str, float | None]] = {}  # key -> (value, expires at)
        self.faults: list[str] = []
        self.last_fault_at = -1e9  # when an injected failure last happened
        # A sustained outage of the command path (pub/sub unaffected): every round trip
        # until then fails, and the queued faults wait.
        self.down_until = -1e9

    # state

    def _get(self, key: str) -> str | None:
        item = self.data.get(key)
        if item is None:
            return None
        value, expires = item
        if expires is not None and now() >= expires:
            del self.data[key]
            return None
        return value

    def _pttl(self, key: str) -> int:
        if self._get(key) is None:
            return -2
        expires = self.data[key][1]
        if expires is None:
            return -1
        # Whole milliseconds, rounded down like Redis: 0 while under 1 ms is left.
        return int((expires - now()) * 1000)

    def _set(
        self,
        key: str,
        value: str,
        *,
        nx: bool = False,
        ex: float | None = None,
        px: int | None = None,
    ) -> bool | None:
        if nx and self._get(key) is not None:
            return None
        life = ex if ex is not None else (px / 1000.0 if px is not None else None)
        self.data[key] = (value, None if life is None else now() + life)
        return True

    def _bump(self, key: str, fresh_epoch: str, ttl: int) -> str:
        """BUMP_AND_PUBLISH_SCRIPT's bump, step for step."""
        current = self._get(key)
        epoch, n = None, 0
        if current is not None:
            m = _VERSION.match(current)
            if m:
                epoch, n = m.group(1), int(m.group(2))
        nv = f"{epoch or fresh_epoch}:{n + 1}"
        self._set(key, nv, ex=ttl)
        return nv

    def flushall(self) -> None:
        self.data.clear()

    def evict(self, key: str) -> None:
        self.data.pop(key, None)

    # transport

    async def round_trip(self, effect: Callable[[], T]) -> T:
        await asyncio.sleep(self._rng.uniform(0.0, 0.002))
        if now() < self.down_until:
            raise RedisConnectionError("injected: Redis is down")
        fault = self.faults.pop(0) if self.faults else None
        if fault is not None:
            self.last_fault_at = now()
        if fault == "before":
            raise RedisConnectionError("injected: failed before taking effect")
        result = effect()
        if fault == "after":
            raise RedisConnectionError("injected: reply lost after taking effect")
        return result

    # the client API VerdictCache uses

    def register_script(self, script: str) -> _BumpScript | _PublishAllScript | _RenewScript:
        if script == RENEW_SCRIPT:
            return _RenewScript(self)
        if script == PUBLISH_ALL_SCRIPT:
            return _PublishAllScript(self)
        assert script == BUMP_AND_PUBLISH_SCRIPT, "a script the fake does not know"
        return _BumpScript(self)

    def _renew(self, version_key: str, empty_key: str, version: str, ttl_ms: int) -> int:
        """RENEW_SCRIPT, step for step."""
        if self._get(version_key) == version:
            self._set(empty_key, version, px=ttl_ms)
            return 1
        return 0

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        return _Pipeline(self)

    async def set(
        self, key: str, value: str, nx: bool = False, ex: float | None = None, px: int | None = None
    ) -> bool | None:
        return await self.round_trip(lambda: self._set(key, value, nx=nx, ex=ex, px=px))

    async def get(self, key: str) -> str | None:
        return await self.round_trip(lambda: self._get(key))

    async def ping(self) -> bool:
        return await self.round_trip(lambda: True)

    async def aclose(self) -> None:
        return None


class _Pipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis
        self._ops: list[Callable[[], Any]] = []

    async def __aenter__(self) -> _Pipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._ops.clear()

    def mget(self, *keys: str) -> _Pipeline:
        self._ops.append(lambda: [self._redis._get(k) for k in keys])
        return self

    def pttl(self, key: str) -> _Pipeline:
        self._ops.append(lambda: self._redis._pttl(key))
        return self

    def publish(self, channel: str, message: str) -> _Pipeline:
        self._ops.append(lambda: self._redis._publish(channel, message))
        return self

    async def execute(self) -> list[Any]:
        ops, self._ops = self._ops, []
        return await self._redis.round_trip(lambda: [op() for op in ops])


class _BumpScript:
    """BUMP_AND_PUBLISH_SCRIPT: the bump, then its wake-up, in one round trip."""

    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis

    async def __call__(self, keys: list[str], args: list[Any]) -> str:
        r = self._redis

        def effect() -> str:
            version = r._bump(keys[0], str(args[0]), int(args[1]))
            r._publish(str(args[2]), str(args[3]))
            return version

        return await r.round_trip(effect)


class _PublishAllScript:
    """PUBLISH_ALL_SCRIPT: every (channel, message) pair of ARGV, in one round trip."""

    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis

    async def __call__(self, keys: list[str], args: list[Any]) -> int:
        r = self._redis

        def effect() -> int:
            for channel, message in zip(args[::2], args[1::2], strict=True):
                r._publish(str(channel), str(message))
            return len(args) // 2

        return await r.round_trip(effect)


class _RenewScript:
    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis

    async def __call__(self, keys: list[str], args: list[Any]) -> int:
        r = self._redis
        return await r.round_trip(lambda: r._renew(keys[0], keys[1], str(args[0]), int(args[1])))


# -- pub/sub ---------------------------------------------------------------------


class NoCache:
    """The claim path's cache when it is switched off (GATEWAY_CACHE=off): never read,
    only bumped and pinged, for unit tests of the Claimer."""

    healthy = True

    def keys(self, runtime_id: str) -> Any:
        return SimpleNamespace(wake=f"wake:{runtime_id}")

    async def bump(self, runtime_id: str) -> str:
        return "1"

    async def bump_many(self, runtime_ids: Sequence[str]) -> list[str | None]:
        return ["1" for _ in runtime_ids]

    async def ping(self) -> bool:
        return True


class FakeWakeChannels:
    """The Subscriber's contract: subscribe/confirmed/unsubscribe, wake-ups through
    on_wake, and on_reset both when a dead connection is noticed and once its
    replacement is confirmed, as gateway/redis/wakeups.py does.

    An outage has a silent phase (publishes are lost, subscriptions still look
    confirmed: the PING has not failed yet), then a noticed phase (nothing confirmed).
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self.on_wake: Callable[[str], None] = lambda runtime_id: None
        self.on_reset: Callable[[], None] = lambda: None
        self.wanted: dict[str, bool] = {}  # channel -> confirmed on the live connection
        self.alive = True  # the connection works
        self.up = True  # we believe it does
        self.outage_until = 0.0
        self.lose = 0  # publishes still to lose on the live connection (Redis says sent)
        self.lost_at = -1e9  # when one was last lost that way

    async def subscribe(self, channel: str) -> bool:
        if self.wanted.get(channel):
            return True
        self.wanted.setdefault(channel, False)
        if not self.up:
            return False
        await asyncio.sleep(0)  # the SUBSCRIBE round trip
        if self.up and channel in self.wanted:
            self.wanted[channel] = True
            return True
        return False

    def unsubscribe(self, channel: str) -> None:
        self.wanted.pop(channel, None)

    def confirmed(self, channel: str) -> bool:
        return self.up and self.wanted.get(channel, False)

    def publish(self, channel: str, message: str) -> int:
        if not self.alive or not self.wanted.get(channel):
            return 0
        if self.lose:
            self.lose -= 1
            self.lost_at = now()
            return 1
        runtime_id = runtime_of_channel(self._prefix, channel)
        if runtime_id is not None:
            asyncio.get_running_loop().call_soon(self.on_wake, runtime_id)
        return 1

    def outage(self, notice_after: float, down_for: float) -> bool:
        """The connection dies now, is noticed later, and is replaced after that. False
        (and nothing happens) while one is under way."""
        if not self.alive:
            return False
        loop = asyncio.get_running_loop()
        self.alive = False
        self.outage_until = now() + notice_after + down_for
        loop.call_later(notice_after, self._noticed)
        loop.call_later(notice_after + down_for, self._restored)
        return True

    def _noticed(self) -> None:
        self.up = False
        for channel in self.wanted:
            self.wanted[channel] = False
        self.on_reset()

    def _restored(self) -> None:
        self.alive = self.up = True
        for channel in self.wanted:
            self.wanted[channel] = True
        self.on_reset()
