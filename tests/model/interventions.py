"""What the state machine does behind the gateway's back: time passing, moved into
the rows' timestamps (the gateway reads Postgres's clock), and Redis losing keys.
Each one updates the model to match.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from gateway.redis.keys import Keys, keys_for
from tests.support.gateways import Instance

from .model import LONG_AGO, Model, Task

# A lost bump's verdict outlives any example, so that only the test ends it (a bump, a
# repair, `verdicts_lapse`), never the wall clock halfway through a check.
STALE_VERDICT_TTL_MS = 600_000


@dataclass
class Env:
    """What every example shares: the loop, the gateway, and side doors to its stores."""

    loop: asyncio.AbstractEventLoop
    inst: Instance
    conn: asyncpg.Connection
    redis: aioredis.Redis

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def keys(self, runtime: str) -> Keys:
        return keys_for(self.inst.gateway.settings.redis_prefix, runtime)

    async def set_past(self, column: str, task: Task) -> None:
        """Time passes beyond the task's `column` (run_at, lease_expires_at, expires_at)."""
        await self.conn.execute(
            f"UPDATE tasks SET {column} = now() - interval '10 seconds' WHERE id = $1",
            uuid.UUID(task.id),
        )


# -- time ------------------------------------------------------------------------


async def come_due(env: Env, model: Model, task: Task) -> None:
    """A delayed or backing-off task comes due. The runtime's verdict lapses before
    that: its life never outlives the next due task (I4)."""
    await env.set_past("run_at", task)
    await env.redis.delete(env.keys(task.runtime).empty)
    task.due, task.due_since = True, LONG_AGO
    model.stale[task.runtime] = False


async def lease_lapses(env: Env, model: Model, task: Task) -> None:
    await env.set_past("lease_expires_at", task)
    task.lapsed = True


async def ttl_passes(env: Env, model: Model, task: Task) -> None:
    await env.set_past("expires_at", task)
    task.ttl_passed = True


# Which tasks each move applies to, and the move.
TASK_MOVES: dict[str, tuple[Callable[[Task], bool], Any]] = {
    "come due": (lambda t: t.status == "queued" and not t.due, come_due),
    "lease lapses": (lambda t: t.status == "claimed" and not t.lapsed, lease_lapses),
    "ttl passes": (
        lambda t: t.has_ttl and not t.ttl_passed and t.status in ("queued", "claimed"),
        ttl_passes,
    ),
}


async def verdicts_lapse(env: Env, model: Model) -> None:
    """Time passes beyond every verdict's life, and no further."""
    for runtime in model.runtimes:
        await env.redis.delete(env.keys(runtime).empty)
        model.stale[runtime] = False


async def janitor_interval(env: Env, model: Model) -> None:
    """The few seconds between janitor passes go by for the tasks due now (the rest
    are far from any deadline): each has been due for longer than the repair's 1 s."""
    await env.conn.execute(
        "UPDATE tasks SET run_at = run_at - interval '2 seconds' "
        "WHERE runtime_id = ANY($1::text[]) AND status = 'queued' AND run_at <= now()",
        model.runtimes,
    )
    for task in model.where(lambda t: t.status == "queued" and t.due):
        task.due_since = LONG_AGO


async def postpone(env: Env, task_id: str, seconds: float) -> None:
    """A backoff of a few seconds put out of the test's reach, as the model says."""
    await env.conn.execute(
        "UPDATE tasks SET run_at = clock_timestamp() + make_interval(secs => $2) WHERE id = $1",
        uuid.UUID(task_id),
        seconds,
    )


# -- Redis faults ------------------------------------------------------------------


async def lost_bump(env: Env, model: Model, runtime: str) -> None:
    """Leave the verdict matching the version, as a bump lost after a change would:
    what that change made claimable stays hidden until a repair or the verdict lapses."""
    keys = env.keys(runtime)
    version = await env.redis.get(keys.version)
    if version is not None:
        await env.redis.set(keys.empty, version, px=STALE_VERDICT_TTL_MS)
        model.stale[runtime] = True


async def lost_version(env: Env, model: Model, runtime: str) -> None:
    """The version key lost (evicted, or a restart from an old snapshot) while a verdict
    from its epoch's early life survives. The next read or bump starts a new epoch, so
    that verdict never matches again (I3), however the counter starts over."""
    keys = env.keys(runtime)
    version = await env.redis.get(keys.version)
    await env.redis.delete(keys.version)
    if version is not None:
        epoch = version.rpartition(":")[0]
        await env.redis.set(keys.empty, f"{epoch}:1", px=STALE_VERDICT_TTL_MS)
    model.stale[runtime] = False


async def flush(env: Env, model: Model, runtime: str) -> None:
    """Every key of this gateway gone, as after a restart without persistence."""
    prefix = env.inst.gateway.settings.redis_prefix
    # COUNT 1000: a shared Redis may hold many other keys, and SCAN's default of 10
    # would take a round trip per 10 of them.
    doomed = [k async for k in env.redis.scan_iter(match=prefix + ":*", count=1000)]
    if doomed:
        await env.redis.delete(*doomed)
    for each in model.runtimes:
        model.stale[each] = False


async def forget(env: Env, model: Model) -> None:
    """An example's teardown: its tasks and keys gone, so the next starts empty."""
    await env.conn.execute("DELETE FROM tasks WHERE runtime_id = ANY($1::text[])", model.runtimes)
    for runtime in model.runtimes:
        keys = env.keys(runtime)
        await env.redis.delete(keys.version, keys.empty)
