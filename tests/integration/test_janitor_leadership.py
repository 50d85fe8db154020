"""Janitor leadership: one active instance at a time, held through a Postgres
advisory lock on a dedicated connection; another instance takes over when the
leader goes away."""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import pytest

from gateway.janitor import LOCK_KEY
from tests.support.gateways import Instance, running_gateway
from tests.support.janitor import janitor_settings
from tests.support.metrics import sample
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

INTERVAL = 0.2


def leaders(instances: list[Instance]) -> list[Instance]:
    return [i for i in instances if i.gateway.janitor.is_leader]


async def lock_holders(conn: asyncpg.Connection) -> list[int]:
    """Backends holding the janitor's advisory lock (a single bigint key is stored
    as classid = high 32 bits, objid = low 32 bits, objsubid = 1)."""
    rows = await conn.fetch(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1",
        LOCK_KEY >> 32,
        LOCK_KEY & 0xFFFFFFFF,
    )
    return [r["pid"] for r in rows]


async def test_exactly_one_leader_and_a_takeover_when_it_stops(
    own_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_interval_seconds=INTERVAL
    )
    async with contextlib.AsyncExitStack() as outer:
        stacks = [contextlib.AsyncExitStack() for _ in range(2)]
        for stack in stacks:
            await outer.enter_async_context(stack)
        instances = [await stack.enter_async_context(running_gateway(cfg)) for stack in stacks]

        await wait_until(lambda: len(leaders(instances)) == 1, 1.0, "one janitor leader")
        # ...and it stays exactly one for a few intervals.
        deadline = time.monotonic() + 5 * INTERVAL
        while time.monotonic() < deadline:
            assert len(leaders(instances)) == 1, "two leaders, or none"
            await asyncio.sleep(0.02)
        [leader] = leaders(instances)
        [other] = [i for i in instances if i is not leader]
        assert sample(leader, "gateway_janitor_leader") == 1
        assert sample(other, "gateway_janitor_leader") == 0

        stopped = time.monotonic()
        await stacks[instances.index(leader)].aclose()  # the leader instance shuts down
        took_over = await wait_until(
            lambda: other.gateway.janitor.is_leader, 2.0, "the other instance to take over"
        )
        assert took_over - stopped < 2.0
        assert sample(other, "gateway_janitor_leader") == 1


async def test_leadership_is_a_postgres_advisory_lock(
    own_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_interval_seconds=INTERVAL
    )
    conn = await asyncpg.connect(own_database_url)
    try:
        async with running_gateway(cfg) as gw:
            janitor = gw.gateway.janitor
            await wait_until(lambda: janitor.is_leader, 1.0, "the janitor to lead")
            assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY) is False
            assert len(await lock_holders(conn)) == 1
        # The instance stopped: the lock is free again.
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY) is True

        # While someone else holds it, a gateway does not lead...
        async with running_gateway(cfg) as gw:
            janitor = gw.gateway.janitor
            await asyncio.sleep(4 * INTERVAL)
            assert janitor.is_leader is False
            assert sample(gw, "gateway_janitor_leader") == 0
            # ...and it takes over within about an interval once the lock is released.
            assert await conn.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY) is True
            await wait_until(lambda: janitor.is_leader, 1.0, "the janitor to lead")
    finally:
        await conn.close()


async def test_a_leader_whose_lock_connection_dies_takes_the_lock_again(
    own_database_url: str, redis_url: str, redis_prefix: str
) -> None:
    """The lock lives as long as its connection. If Postgres drops that connection,
    the leader notices at its next interval, resigns and takes the lock again on a
    new connection: the janitor does not stop working."""
    cfg = janitor_settings(
        own_database_url, redis_url, redis_prefix, janitor_interval_seconds=INTERVAL
    )
    conn = await asyncpg.connect(own_database_url)
    try:
        async with running_gateway(cfg) as gw:
            janitor = gw.gateway.janitor
            await wait_until(lambda: janitor.is_leader, 1.0, "the janitor to lead")
            [old_pid] = await lock_holders(conn)
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", old_pid) is True

            deadline = time.monotonic() + 2.0
            while True:
                holders = await lock_holders(conn)
                if holders and holders != [old_pid] and janitor.is_leader:
                    break
                assert time.monotonic() < deadline, f"lock holders {holders}"
                await asyncio.sleep(0.05)
            assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY) is False
    finally:
        await conn.close()
