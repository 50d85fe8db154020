"""The versioned empty verdict in Redis (design section 3).

Keys per runtime, hash-tagged so that one runtime's keys share a cluster slot:
`<prefix>:{<rt>}:version` = "<epoch>:<counter>", `<prefix>:{<rt>}:empty` = the version
under which a Postgres scan last found nothing. A hit is `empty == version`.

Redis only ever saves work. Every call has a short budget and at most one retry, a
circuit breaker skips Redis after repeated errors, and every failure surfaces as
CacheUnavailable, which callers treat as a miss (I5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MaxConnectionsError, NoScriptError

from ..errors import CacheUnavailable
from ..metrics import Metrics
from ..settings import DEFAULT_REDIS_MAX_CONNECTIONS
from .breaker import CircuitBreaker
from .clients import REDIS_ERRORS
from .keys import CLAIMS_FIELD, Keys, keys_for, new_epoch, parked_key
from .slots import CallSlots, PoolBusy

log = logging.getLogger("gateway.cache")
T = TypeVar("T")

# The bump (KEYS[1], the version) and its wake-up (ARGV[3] channel, ARGV[4] message) in
# one script call. The counter goes up, keeping the epoch; a missing or unreadable key
# starts a new epoch (ARGV[1]), so a verdict written under the old one can never match
# again (I3). One call, not the two commands pipelined: half the client's CPU and
# round-trip time (measured: 110-120 against 245-250 us of CPU per bump); in a cluster
# it also runs on the runtime's own node (a cluster pipeline refuses PUBLISH), and
# PUBLISH there reaches every node.
#
# A Redis that refuses writes (out of memory under noeviction, a failed save, too few
# replicas) refuses the SET. The bump is then lost, and the refusal is the answer, so
# the caller counts and logs it (the janitor repairs it, I6). Two things still happen:
# the wake-up goes out (PUBLISH is not refused), and the runtime's empty verdict
# (KEYS[2]) is deleted, which out of memory is still allowed. Without that delete the
# verdict, under a version the failed bump could not change, would go on hiding the new
# task for the rest of its life (up to GATEWAY_EMPTY_TTL_SECONDS). Deleted, polls
# scan Postgres, and the verdicts they try to write are refused too.
BUMP_AND_PUBLISH_SCRIPT = """
local v = redis.call('GET', KEYS[1])
local epoch, n = nil, 0
if v then
  local e, c = string.match(v, '^(.+):(%d+)$')
  if e then epoch = e; n = tonumber(c) end
end
if not epoch then epoch = ARGV[1] end
local nv = epoch .. ':' .. string.format('%d', n + 1)
local set = redis.pcall('SET', KEYS[1], nv, 'EX', tonumber(ARGV[2]))
local refused = type(set) == 'table' and set.err
if refused then redis.pcall('DEL', KEYS[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[4])
if refused then return set end
return nv
"""

# Several publishes (ARGV = channel, message, ...) in one script call, on any node:
# the result wake-ups of a batch of finished tasks, the janitor's wake-ups. For 10
# messages it costs the client half the CPU of 10 pipelined PUBLISHes (120 against
# 205-240 us, measured).
PUBLISH_ALL_SCRIPT = """
for i = 1, #ARGV, 2 do redis.call('PUBLISH', ARGV[i], ARGV[i + 1]) end
return #ARGV / 2
"""


# Writes the empty verdict (KEYS[2]) again, for ARGV[2] ms, while the version (KEYS[1])
# still holds ARGV[1], the version it was first written under: no bump since, so the
# scan's answer still stands (I2), even if the key itself lapsed a moment ago (a late
# renewal on a busy process). A SET, not a PEXPIRE: a Redis that refuses writes (out
# of memory under noeviction, CLIENT PAUSE WRITE) refuses this too, so the verdict then
# lapses as before and the claim goes to Postgres.
RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
return 0
"""

# Bumps in flight at once where a pipeline cannot carry them (a cluster's refuses the
# script). One after another, a tick pass's bumps took about 0.4 s per 500 runtimes
# (8 s for 10,000 schedules ticking together), and the pass waits for them before the
# next; 16 at a time leave most of the connections (GATEWAY_REDIS_MAX_CONNECTIONS, 64)
# to claims.
CLUSTER_BUMPS_AT_ONCE = 16


@dataclass(frozen=True)
class Verdict:
    """What one read found: the runtime's version and whether its verdict says empty."""

    version: str
    hit: bool
    ttl_seconds: float | None  # remaining life of the empty verdict (> 0) on a hit, else None


class VerdictCache:
    """Versions, verdicts and wake-up publishes for every runtime. Owns its client.

    With `cluster=True` the client is a RedisCluster: its pipelines refuse MGET and
    PUBLISH, so those become per-key GETs (one runtime's keys share a node) and scripts.
    """

    def __init__(
        self,
        client: aioredis.Redis | RedisCluster,
        prefix: str,
        metrics: Metrics,
        *,
        timeout_seconds: float,
        version_ttl_seconds: int,
        breaker: CircuitBreaker,
        on_trouble: Callable[[], None] | None = None,
        cluster: bool = False,
        max_connections: int = DEFAULT_REDIS_MAX_CONNECTIONS,
    ) -> None:
        """`on_trouble` is called when a call fails after the last one succeeded.
        `max_connections`: calls in flight at once, the bound of the client's pool."""
        self._client = client
        self.prefix = prefix
        self._metrics = metrics
        self._timeout = timeout_seconds
        self._version_ttl = version_ttl_seconds
        self.breaker = breaker
        self._on_trouble = on_trouble
        self._cluster = cluster
        self.slots = CallSlots(max_connections)
        self._bump_and_publish = client.register_script(BUMP_AND_PUBLISH_SCRIPT)
        self._publish_all = client.register_script(PUBLISH_ALL_SCRIPT)
        self._renew = client.register_script(RENEW_SCRIPT)

    async def close(self) -> None:
        await self._client.aclose()

    @property
    def healthy(self) -> bool:
        """False after a failed call, until one succeeds: bumps (and their wake-ups)
        may be getting lost meanwhile."""
        return self.breaker.consecutive_failures == 0

    def keys(self, runtime_id: str) -> Keys:
        return keys_for(self.prefix, runtime_id)

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        if not self.breaker.allow():
            self._metrics.breaker_open.set(1)
            raise CacheUnavailable(f"Redis skipped for {what}: circuit breaker open")
        try:
            # Hard bound on top of the socket timeouts: two attempts plus a reconnect,
            # and any wait for a connection, which gets at most one attempt's budget.
            async with asyncio.timeout(self._timeout * 3):
                await self.slots.acquire(self._timeout)
                try:
                    result = await fn()
                finally:
                    self.slots.release()
        except (PoolBusy, MaxConnectionsError) as exc:
            # Every connection busy: a miss like any failure (I5), but not one for the
            # breaker nor for `healthy`. A burst on a sound Redis fills the pool, and
            # opening the breaker then would send every claim to Postgres for nothing;
            # a sick Redis still opens it, through the calls that hold the connections.
            self._metrics.redis_pool_timeouts.inc()
            raise CacheUnavailable(f"Redis {what} not sent: {exc!r}") from exc
        except REDIS_ERRORS as exc:
            was_healthy = self.healthy
            self.breaker.record_failure()
            self._metrics.redis_errors.inc()
            self._metrics.breaker_open.set(1 if self.breaker.is_open else 0)
            if was_healthy and self._on_trouble is not None:
                self._on_trouble()
            raise CacheUnavailable(f"Redis {what} failed: {exc!r}") from exc
        self.breaker.record_success()
        self._metrics.breaker_open.set(0)
        return result

    async def read(self, runtime_id: str) -> Verdict:
        """One round trip: MGET version empty (+ the verdict's remaining TTL).

        A missing version key is created with a fresh epoch and counts as a miss.
        """
        k = self.keys(runtime_id)

        async def go() -> Verdict:
            async with self._client.pipeline(transaction=False) as pipe:
                if self._cluster:
                    # Not one atomic read, but version first: a hit then means the
                    # verdict matched a version we read after subscribing (I8), and a
                    # later bump's wake-up reaches us.
                    pipe.get(k.version)
                    pipe.get(k.empty)
                    pipe.pttl(k.empty)
                    version, empty, pttl = await pipe.execute()
                else:
                    pipe.mget(k.version, k.empty)
                    pipe.pttl(k.empty)
                    (version, empty), pttl = await pipe.execute()
            if version is None:
                await self._client.set(k.version, f"{new_epoch()}:0", nx=True, ex=self._version_ttl)
                created = await self._client.get(k.version)
                return Verdict(version=str(created), hit=False, ttl_seconds=None)
            # A verdict whose life is spent (PTTL 0: it lapses within the millisecond)
            # or unknown (-1: no expiry, -2: gone since the MGET) is no hit: a poll
            # parks for the verdict's life, and must not sleep past a task coming due
            # on a guess (I4).
            hit = empty == version and isinstance(pttl, int) and pttl > 0
            return Verdict(version=version, hit=hit, ttl_seconds=pttl / 1000.0 if hit else None)

        verdict = await self._call("verdict read", go)
        self._metrics.verdict_checks.labels("hit" if verdict.hit else "miss").inc()
        return verdict

    async def write_empty(self, runtime_id: str, version: str, ttl_seconds: float) -> None:
        """Record that a scan begun under `version` found nothing (I2: the version
        must be the one read before the scan). A later bump makes it stale."""
        ttl_ms = max(1, int(ttl_seconds * 1000))
        key = self.keys(runtime_id).empty
        await self._call("verdict write", lambda: self._client.set(key, version, px=ttl_ms))

    async def renew_empty(self, runtime_id: str, version: str, ttl_seconds: float) -> bool:
        """Give the verdict written under `version` a new life of `ttl_seconds`, if the
        runtime's version still is `version` (no bump since); one round trip. False when
        it is not: the caller must then check Postgres."""
        k = self.keys(runtime_id)
        ttl_ms = max(1, int(ttl_seconds * 1000))

        async def go() -> bool:
            return bool(await self._renew(keys=[k.version, k.empty], args=[version, ttl_ms]))

        renewed = await self._call("verdict renewal", go)
        self._metrics.verdict_renewals.labels("renewed" if renewed else "stale").inc()
        return renewed

    async def bump(self, runtime_id: str) -> str:
        """Invalidate the runtime's verdict and publish a wake-up. Call after commit (I1)."""
        k = self.keys(runtime_id)

        async def go() -> str:
            args: list[str | int] = [new_epoch(), self._version_ttl, k.wake, runtime_id]
            return str(await self._bump_and_publish(keys=[k.version, k.empty], args=args))

        try:
            version = await self._call("version bump", go)
        except CacheUnavailable:
            self._metrics.bumps.labels("error").inc()
            raise
        self._metrics.bumps.labels("ok").inc()
        return version

    async def bump_many(self, runtime_ids: Sequence[str]) -> list[str | None]:
        """`bump` for each runtime, in one round trip (a pipeline of the bump script):
        each one's new version, or None where its bump was lost (counted, as a lost
        `bump` is; the janitor repairs it, I6). Call after commit (I1). A cluster sends
        the bumps a call each, CLUSTER_BUMPS_AT_ONCE at a time: its pipelines do not
        load scripts."""
        if not runtime_ids:
            return []
        if self._cluster:
            gate = asyncio.Semaphore(CLUSTER_BUMPS_AT_ONCE)

            async def one(runtime_id: str) -> str | None:
                async with gate:
                    return await self._bump_or_none(runtime_id)

            return list(await asyncio.gather(*(one(rt) for rt in runtime_ids)))

        sha = self._bump_and_publish.sha

        async def send(ids: Sequence[str]) -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for runtime_id in ids:
                    k = self.keys(runtime_id)
                    # EVALSHA itself, not the script object: a pipeline of script calls
                    # asks SCRIPT EXISTS first, a round trip more on every pipeline. A
                    # script not loaded is answered NOSCRIPT, and sent again below.
                    pipe.evalsha(
                        sha, 2, k.version, k.empty, new_epoch(), self._version_ttl, k.wake,
                        runtime_id,
                    )  # fmt: skip
                return list(await pipe.execute(raise_on_error=False))

        async def go() -> list[Any]:
            answers = await send(runtime_ids)
            # EVALSHA of a script the server does not hold (a Redis just started or
            # restarted, or after SCRIPT FLUSH) is answered NOSCRIPT. Those calls are
            # sent once more, after loading the script.
            again = [i for i, a in enumerate(answers) if isinstance(a, NoScriptError)]
            if again:
                await self._client.script_load(BUMP_AND_PUBLISH_SCRIPT)
                retried = await send([runtime_ids[i] for i in again])
                for i, answer in zip(again, retried, strict=True):
                    answers[i] = answer
            return answers

        try:
            answers = await self._call("version bumps", go)
        except CacheUnavailable:
            self._metrics.bumps.labels("error").inc(len(runtime_ids))
            raise
        versions = [None if isinstance(a, BaseException) else str(a) for a in answers]
        lost = sum(1 for v in versions if v is None)
        self._metrics.bumps.labels("ok").inc(len(versions) - lost)
        self._metrics.bumps.labels("error").inc(lost)
        return versions

    async def _bump_or_none(self, runtime_id: str) -> str | None:
        try:
            return await self.bump(runtime_id)
        except CacheUnavailable:
            return None

    async def wake(self, runtime_ids: list[str]) -> None:
        """Publish a wake-up to each runtime's pollers, without a bump; one round trip.
        For the janitor's repair pass: a publish can be lost while the bump landed."""

        async def go() -> None:
            args = [a for rt in runtime_ids for a in (self.keys(rt).wake, rt)]
            await self._publish_all(keys=[], args=args)

        if runtime_ids:
            await self._call("wake-up publish", go)

    async def publish(self, messages: list[tuple[str, str]]) -> None:
        """Publish each (channel, message) in one round trip: the wake-ups of requests
        waiting for a task's result (results.py), a change of runtime controls
        (controls.py); no version is bumped."""

        async def go() -> None:
            await self._publish_all(keys=[], args=[part for m in messages for part in m])

        if messages:
            await self._call("publish", go)

    async def write_parked(
        self,
        instance: str,
        counts: Mapping[str, int],
        ttl_seconds: float,
        claims: Mapping[str, int] | None = None,
    ) -> None:
        """This instance's parked claims per runtime, and the tasks it handed out in the
        last minute (gateway/redis/parked.py): one hash per runtime, `<prefix>:{<rt>}:parked`,
        field `instance` for the parked claims and `instance` + CLAIMS_FIELD for the
        tasks; a zero removes the field. One round trip."""
        expires_ms = int((time.time() + ttl_seconds) * 1000)
        claims = claims or {}

        async def go() -> None:
            async with self._client.pipeline(transaction=False) as pipe:
                for runtime_id in counts.keys() | claims.keys():
                    key = parked_key(self.prefix, runtime_id)
                    n, tasks = counts.get(runtime_id), claims.get(runtime_id)
                    if n is not None:
                        if n > 0:
                            pipe.hset(key, instance, f"{n} {expires_ms}")
                        else:
                            pipe.hdel(key, instance)
                    if tasks is not None:
                        # No space in this value: readers that predate the field skip
                        # it rather than add it to the parked claims.
                        if tasks > 0:
                            pipe.hset(key, instance + CLAIMS_FIELD, f"{tasks},{expires_ms}")
                        else:
                            pipe.hdel(key, instance + CLAIMS_FIELD)
                    if (n or 0) > 0 or (tasks or 0) > 0:
                        pipe.pexpire(key, int(ttl_seconds * 1000))
                await pipe.execute()

        if counts or claims:
            await self._call("parked pollers report", go)

    async def read_parked(
        self, runtime_ids: Sequence[str], exclude: str
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Parked claims, and tasks handed out in the last minute, per runtime, as
        reported by instances other than `exclude` and not yet expired
        (gateway/redis/parked.py); one round trip."""

        async def go() -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for runtime_id in runtime_ids:
                    pipe.hgetall(parked_key(self.prefix, runtime_id))
                return list(await pipe.execute())

        if not runtime_ids:
            return {}, {}
        answers = await self._call("parked pollers read", go)
        now_ms = time.time() * 1000
        parked: dict[str, int] = {}
        claims: dict[str, int] = {}
        for runtime_id, fields in zip(runtime_ids, answers, strict=True):
            parked[runtime_id] = claims[runtime_id] = 0
            for field, value in (fields or {}).items():
                name = field.decode() if isinstance(field, bytes) else str(field)
                text = value.decode() if isinstance(value, bytes) else str(value)
                is_claims = name.endswith(CLAIMS_FIELD)
                count, _, expires = text.partition("," if is_claims else " ")
                if name.removesuffix(CLAIMS_FIELD) == exclude or not expires:
                    continue
                if float(expires) > now_ms:
                    (claims if is_claims else parked)[runtime_id] += int(count)
        return parked, claims

    async def publish_control(self, message: str) -> None:
        """Publish `message` on the process-wide control channel, which every instance's
        Subscriber reads (a change of a runtime's controls, gateway/claim/controls.py)."""
        await self.publish([(self.prefix + ":__gateway__", message)])  # CONTROL_CHANNEL_SUFFIX

    async def says_empty(self, runtime_ids: list[str]) -> list[str]:
        """Of these runtimes, those whose verdict is a hit (empty == version); one round
        trip. For the janitor's repair pass (I6)."""

        async def go() -> list[str]:
            async with self._client.pipeline(transaction=False) as pipe:
                for runtime_id in runtime_ids:
                    k = self.keys(runtime_id)
                    if self._cluster:  # grouped by node by the cluster pipeline
                        pipe.get(k.version)
                        pipe.get(k.empty)
                    else:
                        pipe.mget(k.version, k.empty)
                answers = await pipe.execute()
            if self._cluster:
                answers = list(zip(answers[::2], answers[1::2], strict=True))
            return [
                rt
                for rt, (version, empty) in zip(runtime_ids, answers, strict=True)
                if version is not None and version == empty
            ]

        if not runtime_ids:
            return []
        return await self._call("verdict scan", go)

    async def ping(self) -> bool:
        try:
            await self._call("ping", self._client.ping)
        except CacheUnavailable:
            return False
        return True
