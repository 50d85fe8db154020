"""One row's servers: a private redis-server (or a Redis master, its replica and three
sentinels, which the gateways reach in sentinel mode), a fresh migrated database (on a
shared Postgres, on a private cluster the row may restart, or on a Patroni-managed pair
the row may fail over, reached through a multi-host URL or through HAProxy), optionally
a blackhole proxy in front of Redis for the second gateway, and two `gateway serve`
processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from gateway.janitor import REPAIR_PAGES_PER_PASS
from tests.faults.haproxy import HAProxy
from tests.faults.patroni import PatroniCluster
from tests.faults.servers import GatewayProcess, PrivatePostgres
from tests.faults.ticks import KEYLESS_GATEWAY, drop_tick_key
from tests.support.databases import create_database, drop_database, migrate
from tests.support.proxy import BlackholeProxy
from tests.support.redis_servers import LocalSentinel, RedisServer

# Short enough that a fault's leftovers (a lease nobody will complete, a lost bump)
# are repaired within a row of a few seconds. The empty verdict keeps its default life
# (30 s), so that a repair that failed to come would show as a stale-empty answer.
JANITOR_INTERVAL_SECONDS = 0.5
BREAKER_OPEN_SECONDS = 5.0  # the gateway's default (Settings.breaker_open_seconds)
DEGRADED_POLL_SECONDS = 1.0  # the gateway's default (Settings.degraded_poll_seconds)
JANITOR_BATCH_SIZE = 1000  # the gateway's default (Settings.janitor_batch_size)


def repair_bound_seconds(runtimes: int) -> float:
    """RELIABILITY.md's bound for a claimable task hidden from a poll after a lost bump,
    with `runtimes` runtimes holding queued tasks: a round of the repair walk (it visits
    REPAIR_PAGES_PER_PASS * janitor_batch_size runtimes per pass, docs/design.md I6)
    plus one pass, the breaker and one degraded poll, plus 1 s. Up to 2,000 runtimes a
    round is one pass: two passes in all, 8 s with this rig's settings. Every row is held
    to it, also those with Redis command failures, where the simulation allows the
    verdict's whole life."""
    rounds = -(-max(runtimes, 1) // (REPAIR_PAGES_PER_PASS * JANITOR_BATCH_SIZE))
    passes = rounds + 1
    return passes * JANITOR_INTERVAL_SECONDS + BREAKER_OPEN_SECONDS + DEGRADED_POLL_SECONDS + 1


REPAIR_BOUND_SECONDS = repair_bound_seconds(1)
SENTINELS = 3  # a majority (2) must agree that the master is down
SENTINEL_MASTER = "faults"
# How soon the sentinels try a stalled failover again; short, so that a row that needs
# a second attempt still ends within a minute.
SENTINEL_FAILOVER_TIMEOUT_MS = 5000


@dataclass
class Rig:
    workdir: Path
    redis: RedisServer
    admin_url: str
    database_url: str
    token: str
    gateways: list[GatewayProcess] = field(default_factory=list)
    proxy: BlackholeProxy | None = None
    postgres: PrivatePostgres | None = None
    ha: PatroniCluster | None = None
    haproxy: HAProxy | None = None  # in front of `ha`'s nodes, for a row reached through it
    # Per Patroni node: proxies on its paths to etcd and to its replica, which a fault
    # may blackhole (`partition`).
    cuts: dict[str, list[BlackholeProxy]] = field(default_factory=dict)
    sentinel: LocalSentinel | None = None  # the Redis master, replica and sentinels, if any
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # what a fault's inject tells its heal
    # When (time.time()) the old primary was started again and when it was back as a
    # replica of the new primary; set by a row that checks the rejoin.
    rejoin: tuple[float, float] | None = None

    def urls(self) -> list[str]:
        return [g.url for g in self.gateways]

    async def sql(self, query: str, *args: Any, direct: bool = False) -> list[asyncpg.Record]:
        """One query on the row's own database, on a connection of its own. `direct`:
        on a Patroni cluster, to the node Patroni names the leader rather than through
        the multi-host URL (which a node answering with an error, not a refusal, stops:
        the driver passes over network errors only)."""
        url = self.database_url
        if direct and self.ha is not None:
            leader = await asyncio.to_thread(self.ha.leader)
            name = self.database_url.split("?", 1)[0].rsplit("/", 1)[1]
            url = f"postgresql://postgres@127.0.0.1:{leader.pg_port}/{name}"
        conn = await asyncpg.connect(url, timeout=10)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()


def _gateway_env(rig: Rig, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(
        DATABASE_URL=rig.database_url,
        REDIS_URL=redis_url,
        GATEWAY_ADMIN_TOKEN=rig.token,
        GATEWAY_REDIS_PREFIX="faults",
        GATEWAY_JANITOR_INTERVAL_SECONDS=str(JANITOR_INTERVAL_SECONDS),
        GATEWAY_SHUTDOWN_GRACE_SECONDS="2",
        GATEWAY_DB_POOL_MAX="10",
    )
    if rig.sentinel is not None:
        env.update(GATEWAY_REDIS_MODE="sentinel", GATEWAY_REDIS_SENTINEL_MASTER=SENTINEL_MASTER)
    return env


@contextlib.asynccontextmanager
async def rig(
    admin_url: str | None,
    *,
    private_postgres: bool = False,
    proxy: bool = False,
    replication: str | None = None,
    partition: bool = False,
    sentinel: bool = False,
    haproxy: bool = False,
    tick_key: bool = True,
) -> AsyncIterator[Rig]:
    """Everything a row needs, torn down afterwards by pid. `admin_url` is a Postgres
    where a database may be created; None (or `private_postgres`) starts a cluster.
    `replication` ("synchronous" or "asynchronous") starts a Patroni-managed pair
    instead, which the gateways reach through one multi-host URL (their pool and the
    janitor's lock connection alike, as GATEWAY_DIRECT_DATABASE_URL is unset); with
    `haproxy`, through one HAProxy in front of the nodes instead (`Rig.haproxy`, which
    follows Patroni's /primary check), a one-host URL that the database is also made
    and migrated through.
    `partition`: each node's Patroni reaches etcd, and its replica reaches it, through
    proxies (`Rig.cuts`); the gateways reach every node directly. `sentinel`: instead
    of one redis-server, a master, its replica and SENTINELS sentinels (`Rig.sentinel`),
    which the gateways ask for the master (`Rig.redis` is the first master). Without
    `tick_key`, the schedules' tick record has no key and the gateways' statement
    names none (tests/faults/ticks.py): the broken variant of the schedules class."""
    workdir = Path(tempfile.mkdtemp(prefix="gateway-faults-"))
    pgdir = Path(tempfile.mkdtemp(prefix="gateway-faults-pg-"))
    sentinels: LocalSentinel | None = None
    if sentinel:
        sentinels = LocalSentinel(
            workdir / "sentinel", SENTINEL_MASTER, count=SENTINELS,
            failover_timeout_ms=SENTINEL_FAILOVER_TIMEOUT_MS,
        )  # fmt: skip
    redis = sentinels.master if sentinels is not None else RedisServer(workdir)
    postgres: PrivatePostgres | None = None
    ha: PatroniCluster | None = None
    balancer: HAProxy | None = None
    cuts: dict[str, list[BlackholeProxy]] = {}
    database_url: str | None = None
    made: Rig | None = None
    try:
        if sentinels is not None:
            await asyncio.to_thread(sentinels.start)
        else:
            redis.start()
        if replication is not None:
            ha = PatroniCluster(synchronous=replication == "synchronous")
            if partition:
                for node in ha.nodes:
                    to_etcd, to_node = BlackholeProxy(ha.etcd_port), BlackholeProxy(node.pg_port)
                    cuts[node.name] = [to_etcd, to_node]
                    await to_etcd.start()
                    await to_node.start()
                    node.etcd_via, node.advertised_port = to_etcd.port, to_node.port
            await asyncio.to_thread(ha.start)
            admin_url = ha.url()
            if haproxy:
                balancer = HAProxy(ha.nodes, workdir / "haproxy")
                leader = await asyncio.to_thread(ha.leader)
                await asyncio.to_thread(balancer.start, leader.name)
                admin_url = balancer.url()
        elif private_postgres or not admin_url:
            postgres = PrivatePostgres(pgdir)
            await asyncio.to_thread(postgres.init)
            admin_url = postgres.url
        database_url = await create_database(admin_url, "faults_")
        await migrate(database_url)
        if not tick_key:
            await drop_tick_key(database_url)
        made = Rig(
            workdir, redis, admin_url, database_url, secrets.token_urlsafe(32),
            postgres=postgres, ha=ha, haproxy=balancer, cuts=cuts, sentinel=sentinels,
        )  # fmt: skip
        redis_url = sentinels.url if sentinels is not None else redis.url
        redis_urls = [redis_url, redis_url]
        if proxy:
            made.proxy = BlackholeProxy(redis.port)
            await made.proxy.start()
            redis_urls[1] = made.proxy.url
        module = "gateway.cli" if tick_key else KEYLESS_GATEWAY
        made.gateways = [
            GatewayProcess(_gateway_env(made, u), workdir / f"gateway{i}.log", module=module)
            for i, u in enumerate(redis_urls)
        ]
        await asyncio.gather(*(g.start() for g in made.gateways))
        yield made
    finally:
        if made is not None:
            for task in made.background:
                task.cancel()
            await asyncio.gather(*made.background, return_exceptions=True)
            await asyncio.gather(*(g.kill() for g in made.gateways))
            if made.proxy is not None:
                await made.proxy.close()
        redis.kill()
        if sentinels is not None:
            await asyncio.to_thread(sentinels.stop)
        if balancer is not None:
            await asyncio.to_thread(balancer.stop)
        if ha is not None:
            for proxy in [p for pair in cuts.values() for p in pair]:
                proxy.heal()  # Patroni's stop must not wait on a blackholed etcd
            await asyncio.to_thread(ha.stop)
            for proxy in [p for pair in cuts.values() for p in pair]:
                await proxy.close()
        elif postgres is not None:
            await asyncio.to_thread(postgres.stop, "immediate")
        elif admin_url and database_url:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await drop_database(admin_url, database_url)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(pgdir, ignore_errors=True)
