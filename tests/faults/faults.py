"""The matrix's rows: each fault is injected, held for `hold_seconds`, then healed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import psutil
import redis.asyncio as aioredis

from tests.faults.patroni import TTL_SECONDS, Node, PatroniCluster
from tests.faults.rig import JANITOR_INTERVAL_SECONDS, Rig
from tests.faults.servers import log

Step = Callable[[Rig], Awaitable[None]]
LEADER_METRIC = "gateway_janitor_leader"
BACKEND_KILL_EVERY_SECONDS = 0.3
MID_CLAIM_WATCH_SECONDS = 5.0
REDIS_ERRORS = "gateway_redis_errors_total"


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Step
    heal: Step
    hold_seconds: float = 2.0
    proxy: bool = False  # the second gateway reaches Redis through a blackhole proxy
    private_postgres: bool = False  # the row restarts Postgres
    # "synchronous" or "asynchronous": the row runs on a Patroni-managed pair and its
    # producers retry enqueues with idempotency keys (LoadShape.enqueue_retry_seconds).
    replication: str | None = None
    # Asynchronous replication may lose what a dead primary acknowledged: the row
    # reports acknowledged-lost and resurrected tasks but is not failed by them.
    loss_allowed: bool = False
    partition: bool = False  # Patroni's paths run through proxies (rig's `cuts`)
    # A gateway counter (summed over both) that must grow across the fault, so that a
    # fault that silently did nothing cannot pass as a clean row.
    proof: str | None = None


async def _nothing(_rig: Rig) -> None:
    return None


async def _redis_command(rig: Rig, *args: str) -> None:
    client = aioredis.Redis.from_url(rig.redis.url, socket_timeout=5)
    try:
        await client.execute_command(*args)
    finally:
        await client.aclose()


async def _redis_kill(rig: Rig) -> None:
    rig.redis.kill()


async def _redis_start(rig: Rig) -> None:
    await asyncio.to_thread(rig.redis.start)


async def _flushall(rig: Rig) -> None:
    await _redis_command(rig, "FLUSHALL")


async def _evict(rig: Rig) -> None:
    # Below what an empty server uses: every write evicts keys, versions included.
    await _redis_command(rig, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    await _redis_command(rig, "CONFIG", "SET", "maxmemory", "1")


async def _unevict(rig: Rig) -> None:
    await _redis_command(rig, "CONFIG", "SET", "maxmemory", "0")


async def _redis_stop(rig: Rig) -> None:
    rig.redis.signal(signal.SIGSTOP)


async def _redis_cont(rig: Rig) -> None:
    rig.redis.signal(signal.SIGCONT)


async def _kill_pubsub(rig: Rig) -> None:
    await _redis_command(rig, "CLIENT", "KILL", "TYPE", "pubsub")


async def _terminate_backends(rig: Rig) -> None:
    """Every gateway backend in the row's own database, again and again, so that some
    are cut in the middle of a claim."""

    async def loop() -> None:
        while True:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await rig.sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            await asyncio.sleep(BACKEND_KILL_EVERY_SECONDS)

    rig.background.append(asyncio.create_task(loop()))


async def _stop_background(rig: Rig) -> None:
    for task in rig.background:
        task.cancel()
    await asyncio.gather(*rig.background, return_exceptions=True)
    rig.background.clear()


async def _postgres_stop(rig: Rig) -> None:
    assert rig.postgres is not None
    await asyncio.to_thread(rig.postgres.stop, "immediate")


async def _postgres_start(rig: Rig) -> None:
    assert rig.postgres is not None
    await asyncio.to_thread(rig.postgres.start)


def _local_ports(pid: int) -> list[int]:
    """The local TCP ports of process `pid`'s connections (its Postgres backends'
    client_port)."""
    try:
        return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr]
    except psutil.Error:
        return []


async def _kill_mid_claim(rig: Rig, index: int) -> None:
    """SIGKILL gateway `index` as soon as one of its claim transactions is seen ending
    in pg_stat_activity (rows leased, the answer maybe not yet written; mostly the
    answer still wins the race); after MID_CLAIM_WATCH_SECONDS without that, anyway."""
    gateway = rig.gateways[index]
    assert gateway.process is not None
    conn = await asyncpg.connect(rig.database_url, timeout=10)
    try:
        deadline = time.monotonic() + MID_CLAIM_WATCH_SECONDS
        backend, ended = None, False
        for round_ in itertools.count():
            if time.monotonic() > deadline:
                break
            if backend is None:
                if round_ % 50 == 0:  # its pool opens connections as it needs them
                    ports = _local_ports(gateway.process.pid)
                backend = await conn.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE client_port = ANY($1::int[]) "
                    "AND state <> 'idle' AND query LIKE '%FOR UPDATE SKIP LOCKED%'",
                    ports,
                )
            elif await conn.fetchval(
                "SELECT state = 'idle' FROM pg_stat_activity WHERE pid = $1", backend
            ):
                ended = True
                break  # committed (or rolled back): the rows are leased, the answer not sent
    finally:
        await conn.close()
    await gateway.kill()
    seen = "as one of its claims ended" if ended else "without seeing a claim end"
    log(f"SIGKILLed gateway {index} {seen}")


async def _kill_first_gateway(rig: Rig) -> None:
    await _kill_mid_claim(rig, 0)


async def _restart_killed(rig: Rig) -> None:
    for gateway in rig.gateways:
        if gateway.process is None:
            await gateway.start()


async def _kill_janitor_leader(rig: Rig) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for index, gateway in enumerate(rig.gateways):
            if await gateway.metric(LEADER_METRIC) == 1.0:
                await _kill_mid_claim(rig, index)
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("no gateway reported itself the janitor's leader")


async def _takeover_then_restart(rig: Rig) -> None:
    """The surviving gateway must take the janitor's lock (within a few intervals),
    then the killed one comes back."""
    deadline = time.monotonic() + 10 * JANITOR_INTERVAL_SECONDS + 5
    survivors = [g for g in rig.gateways if g.process is not None]
    while not [g for g in survivors if await g.metric(LEADER_METRIC) == 1.0]:
        if time.monotonic() > deadline:
            raise RuntimeError("no surviving gateway took over the janitor")
        await asyncio.sleep(0.1)
    await _restart_killed(rig)


# How long a new primary may take: the dead leader's key outlives it by up to its ttl,
# then Patroni's loop (loop_wait) promotes the replica.
PROMOTION_SECONDS = 3.0 * TTL_SECONDS
REPLICA_STALL_SECONDS = 1.0


def _cluster(rig: Rig) -> PatroniCluster:
    assert rig.ha is not None
    return rig.ha


async def _switchover(rig: Rig) -> None:
    """A planned switchover to the replica, through Patroni's REST API; returns once
    Patroni reports it done."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    await asyncio.to_thread(ha.switchover, ha.others(old)[0])
    log(f"switched over from {old.name}")


async def _new_primary(rig: Rig) -> None:
    """Heals once a node other than the old primary leads, and checks that it does: a
    fault that moved nothing would prove nothing."""
    ha = _cluster(rig)
    old = rig.notes["old primary"]
    # Asked of the other nodes: the old primary, cut off from etcd, answers a stale view.
    others = ha.others(ha.node(old))
    await asyncio.to_thread(
        ha.wait_for, lambda m: ha._leader(m) not in (None, old), "new primary",
        PROMOTION_SECONDS, others,
    )  # fmt: skip
    log(f"{ha._leader(ha.members(others))} leads")


async def _crash_primary(rig: Rig) -> None:
    """The primary's node dies: Patroni and its Postgres (postmaster and backends)
    SIGKILLed. The replica is promoted once the leader key expires."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    await _note_replica_lag(rig, old)
    await asyncio.to_thread(ha.crash, old)
    log(f"SIGKILLed {old.name} (Patroni and Postgres)")


async def _note_replica_lag(rig: Rig, primary: Node) -> None:
    """How far the replica is behind `primary` (its flush position), into the notes."""
    conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{primary.pg_port}/postgres")
    try:
        row = await conn.fetchrow(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint AS behind "
            "FROM pg_stat_replication"
        )
    finally:
        await conn.close()
    if row is not None:
        rig.notes["replica behind at the kill"] = f"{row['behind']} bytes of WAL"


async def _crash_primary_replica_stalled(rig: Rig) -> None:
    """The primary's WAL sender stopped (SIGSTOP) for REPLICA_STALL_SECONDS, then the
    primary's node dies. Asynchronous: the primary acknowledged commits it never sent,
    and Patroni still promotes the replica (it is within maximum_lag_on_failover).
    Synchronous: those commits waited for the standby, unacknowledged. (Stopping the
    replica's receiver instead shows little: what was sent waits in the loopback
    socket's buffer and is read once the receiver goes on.)"""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    conn = await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{old.pg_port}/postgres")
    try:
        sender = await conn.fetchval("SELECT pid FROM pg_stat_replication LIMIT 1")
    finally:
        await conn.close()
    if sender is None:
        raise RuntimeError(f"{old.name} has no WAL sender")
    rig.notes["old primary"] = old.name
    os.kill(sender, signal.SIGSTOP)
    try:
        await asyncio.sleep(REPLICA_STALL_SECONDS)
        await _note_replica_lag(rig, old)
        await asyncio.to_thread(ha.crash, old)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the crash killed it
            os.kill(sender, signal.SIGCONT)
    log(f"SIGKILLed {old.name}, {rig.notes.get('replica behind at the kill', '')} behind")


async def _promoted_then_rejoin(rig: Rig) -> None:
    """Heals once the replica is promoted; the old primary's Patroni is then started
    again and rejoins as a replica (pg_rewind if it diverged) while the load goes on."""
    await _new_primary(rig)
    ha = _cluster(rig)
    await asyncio.to_thread(ha.start_node, ha.node(rig.notes["old primary"]))


async def _cut_primary(rig: Rig) -> None:
    """The primary's paths to etcd and to its replica blackholed; the gateways still
    reach it. Patroni demotes it once etcd has been unreachable for retry_timeout; the
    replica is promoted once the leader key expires."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    for proxy in rig.cuts[old.name]:
        proxy.blackhole()
    log(f"cut {old.name} off from etcd and its replica")


async def _promoted_then_reconnect(rig: Rig) -> None:
    """Heals once the replica is promoted: the old primary's paths open again, and it
    rejoins as a replica (through pg_rewind if it diverged) while the load goes on."""
    await _new_primary(rig)
    for proxy in rig.cuts[rig.notes["old primary"]]:
        proxy.heal()


async def _blackhole(rig: Rig) -> None:
    assert rig.proxy is not None
    rig.proxy.blackhole()


async def _unblackhole(rig: Rig) -> None:
    assert rig.proxy is not None
    rig.proxy.heal()


FAULTS = {
    f.name: f
    for f in (
        Fault("Redis SIGKILL + restart", _redis_kill, _redis_start, proof=REDIS_ERRORS),
        Fault("Redis FLUSHALL", _flushall, _nothing, hold_seconds=0.0),
        Fault(
            "version keys evicted (maxmemory 1 B, allkeys-lru)",
            _evict,
            _unevict,
            proof=REDIS_ERRORS,  # writes past maxmemory are refused (OOM)
        ),
        Fault(
            "Redis paused 2 s (SIGSTOP) > 250 ms budget",
            _redis_stop,
            _redis_cont,
            proof=REDIS_ERRORS,
        ),
        Fault(
            "pub/sub connection killed",
            _kill_pubsub,
            _nothing,
            hold_seconds=0.0,
            proof="gateway_pubsub_reconnects_total",
        ),
        Fault("Postgres backends terminated mid-claim", _terminate_backends, _stop_background),
        Fault("Postgres restarted", _postgres_stop, _postgres_start, private_postgres=True),
        Fault("one gateway SIGKILLed mid-claim", _kill_first_gateway, _restart_killed),
        Fault("janitor leader SIGKILLed", _kill_janitor_leader, _takeover_then_restart),
        Fault(
            "gateway-Redis path blackholed 3 s",
            _blackhole,
            _unblackhole,
            3.0,
            proxy=True,
            proof=REDIS_ERRORS,
        ),
        *(
            fault
            for mode in ("synchronous", "asynchronous")
            for fault in (
                Fault(
                    f"Patroni switchover ({mode})",
                    _switchover,
                    _new_primary,
                    hold_seconds=0.0,
                    replication=mode,
                ),
                Fault(
                    f"Patroni primary SIGKILLed ({mode})",
                    _crash_primary,
                    _promoted_then_rejoin,
                    hold_seconds=0.0,
                    replication=mode,
                ),
                Fault(
                    f"Patroni primary cut off from etcd and its replica ({mode})",
                    _cut_primary,
                    _promoted_then_reconnect,
                    hold_seconds=0.0,
                    replication=mode,
                    loss_allowed=mode == "asynchronous",
                    partition=True,
                ),
                Fault(
                    f"Patroni primary SIGKILLed with its replica 1 s behind ({mode})",
                    _crash_primary_replica_stalled,
                    _promoted_then_rejoin,
                    hold_seconds=0.0,
                    replication=mode,
                    loss_allowed=mode == "asynchronous",
                ),
            )
        ),
    )
}
SHORT = ("Redis SIGKILL + restart", "pub/sub connection killed", "one gateway SIGKILLed mid-claim")
