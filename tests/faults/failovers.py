"""The failover rows' steps: a Patroni-managed primary moved (a switchover, a crash, a
cut from etcd and its replica) and the old one brought back as a replica, HAProxy's
view of it watched, and a Redis master SIGKILLed under Sentinel. The rows themselves
are in `faults`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable

import asyncpg
import psutil

from tests.faults.haproxy import HAProxy, routes
from tests.faults.patroni import TTL_SECONDS, Node, PatroniCluster
from tests.faults.rig import Rig
from tests.faults.servers import REDIS_BREAKER, REDIS_ERRORS, log
from tests.support.redis_servers import LocalSentinel

# How long a new primary may take: the dead leader's key outlives it by up to its ttl,
# then Patroni's loop (loop_wait) promotes the replica.
PROMOTION_SECONDS = 3.0 * TTL_SECONDS
REPLICA_STALL_SECONDS = 1.0
# The sentinels judge the master down after 1 s, agree, elect a leader among
# themselves and promote; a failover that stalls is tried again after the rig's
# failover-timeout (5 s).
SENTINEL_PROMOTION_SECONDS = 30.0


def _cluster(rig: Rig) -> PatroniCluster:
    assert rig.ha is not None
    return rig.ha


async def switchover(rig: Rig) -> None:
    """A planned switchover to the replica, through Patroni's REST API; returns once
    Patroni reports it done."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    await asyncio.to_thread(ha.switchover, ha.others(old)[0])
    log(f"switched over from {old.name}")


async def new_primary(rig: Rig) -> None:
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


async def crash_primary(rig: Rig) -> None:
    """The primary's node dies: Patroni and its Postgres (postmaster and backends)
    SIGKILLed. The replica is promoted once the leader key expires."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    await _note_replica_lag(rig, old)
    await asyncio.to_thread(ha.crash, old)
    log(f"SIGKILLed {old.name} (Patroni and Postgres)")


async def kill_primary_patroni(rig: Rig) -> None:
    """Only the primary's Patroni dies (SIGKILL), as when the kernel's out-of-memory
    killer picks it: its Postgres runs on, a primary that accepts writes, and nothing
    demotes it (Patroni's watchdog, which would reset the machine, is not set up). The
    replica is promoted once the leader key expires; the old Postgres is stopped with
    the cluster at the row's end."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    proc, old.process = old.process, None
    assert proc is not None
    proc.kill()
    await asyncio.to_thread(proc.wait)
    log(f"SIGKILLed {old.name}'s Patroni; its Postgres runs on")


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


async def crash_primary_replica_stalled(rig: Rig) -> None:
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


ENQUEUED = "gateway_tasks_enqueued_total"
# How long the gateways may take to commit on the new primary after its promotion (s),
# before the old primary is started again anyway.
SERVING_AGAIN_SECONDS = 20.0


async def _start_old_primary(rig: Rig) -> float:
    """Once every gateway has committed an enqueue since the promotion (so that the
    rejoin's span shows the rejoin, not the failover's tail; SERVING_AGAIN_SECONDS at
    most), the old primary's Patroni is started again, to rejoin as a replica (pg_rewind
    if it diverged) while the load goes on. Returns when (time.time())."""
    promoted = time.monotonic()
    before = [await g.metric(ENQUEUED) or 0.0 for g in rig.gateways]
    while time.monotonic() < promoted + SERVING_AGAIN_SECONDS:
        now = [await g.metric(ENQUEUED) or 0.0 for g in rig.gateways]
        if all(b > a for a, b in zip(before, now, strict=True)):
            rig.notes["every gateway committed on the new primary"] = (
                f"{time.monotonic() - promoted:.2f} s after the heal"
            )
            break
        await asyncio.sleep(0.05)
    ha = _cluster(rig)
    old = ha.node(rig.notes["old primary"])
    rig.notes["old primary's log from"] = str(ha.log_size(old))
    started = time.time()
    await asyncio.to_thread(ha.start_node, old)
    return started


# Patroni's start, crash recovery in single-user mode, pg_rewind and the start as a
# replica; a few seconds alone, longer on a busy machine.
REJOIN_SECONDS = 60.0


async def _rejoin(rig: Rig, *, rewind: bool, start: bool = True) -> str:
    """From the heal (the replica promoted): starts the old primary again
    (`_start_old_primary`; `start` False: its Patroni ran throughout, cut off, and
    rejoins by itself from the heal) and waits for it to run as a replica of the new
    primary (PatroniCluster.not_rejoined); notes how long it took and whether pg_rewind
    ran, and sets `rig.rejoin`. `rewind`: it must have rejoined through pg_rewind (a
    row whose old primary surely had WAL the new one lacks)."""
    started = await _start_old_primary(rig) if start else float(rig.notes["healed at"])
    since = "its restart" if start else "the heal"
    ha = _cluster(rig)
    old = ha.node(rig.notes["old primary"])
    why = await asyncio.to_thread(ha.wait_rejoined, old, REJOIN_SECONDS)
    if why:
        return f"the old primary was not a replica {REJOIN_SECONDS:.0f} s after {since}: {why}"
    back = time.time()
    rig.rejoin = (started, back)
    rewound = ha.rewound(old, int(rig.notes["old primary's log from"]))
    role = "synchronous standby" if ha.synchronous else "replica"
    timeline = ha.status(old).get("timeline")
    rig.notes["old primary back as a replica"] = (
        f"{back - started:.2f} s after {since}, {role} on timeline {timeline}, "
        f"{'through pg_rewind' if rewound else 'without pg_rewind'}"
    )
    if rewind and not rewound:
        return "the old primary rejoined, but its Patroni log shows no pg_rewind that succeeded"
    return ""


async def rejoined(rig: Rig) -> str:
    return await _rejoin(rig, rewind=False)


async def rejoined_through_rewind(rig: Rig) -> str:
    return await _rejoin(rig, rewind=True)


async def rejoined_after_heal(rig: Rig) -> str:
    """The old primary of a cut, its paths open again, back as a replica by itself."""
    return await _rejoin(rig, rewind=False, start=False)


async def cut_primary(rig: Rig) -> None:
    """The primary's paths to etcd and to its replica blackholed; the gateways still
    reach it. Patroni demotes it once etcd has been unreachable for retry_timeout; the
    replica is promoted once the leader key expires."""
    ha = _cluster(rig)
    old = await asyncio.to_thread(ha.leader)
    rig.notes["old primary"] = old.name
    for proxy in rig.cuts[old.name]:
        proxy.blackhole()
    log(f"cut {old.name} off from etcd and its replica")


async def promoted_then_reconnect(rig: Rig) -> None:
    """Heals once the replica is promoted: the old primary's paths open again, and it
    rejoins as a replica (through pg_rewind if it diverged) while the load goes on."""
    await new_primary(rig)
    ha = _cluster(rig)
    rig.notes["old primary's log from"] = str(ha.log_size(ha.node(rig.notes["old primary"])))
    rig.notes["healed at"] = repr(time.time())
    for proxy in rig.cuts[rig.notes["old primary"]]:
        proxy.heal()


HAPROXY_SAMPLE_SECONDS = 0.1
# HAProxy's line for a server marked down, with the sessions it had (which
# `shutdown-sessions` ends): "Server postgres_primary/node0 is DOWN, reason: ...
# 1 active and 0 backup servers left. 12 sessions active, 0 requeued, ...".
DOWN_LINE = re.compile(r"Server \S+/(\S+) is DOWN, .*? (\d+) sessions active")


def _haproxy(rig: Rig) -> HAProxy:
    assert rig.haproxy is not None
    return rig.haproxy


def through_haproxy(inject: Callable[[Rig], Awaitable[None]]) -> Callable[[Rig], Awaitable[None]]:
    """`inject`, with HAProxy watched from just before it (`watch_haproxy`, beside the
    load until the rig ends)."""

    async def inject_watched(rig: Rig) -> None:
        ha, balancer = _cluster(rig), _haproxy(rig)
        old = await asyncio.to_thread(ha.leader)
        log_from = balancer.log_path.stat().st_size
        rig.background.append(asyncio.create_task(watch_haproxy(rig, old.name, log_from)))
        await inject(rig)

    return inject_watched


async def watch_haproxy(rig: Rig, old: str, log_from: int) -> None:
    """Samples HAProxy's servers every HAPROXY_SAMPLE_SECONDS from the fault until the
    rig ends, and notes how long after the fault HAProxy marked the old primary down
    (ending the sessions its log says it had), when it first sent new connections to
    another node (the new primary, whose checks passed RISE times), and every change of
    the nodes it routed to (a node rejoining must never be among them)."""
    balancer = _haproxy(rig)
    started = time.monotonic()
    down = up = False
    rig.notes["HAProxy marked the old primary down"] = "never"
    rig.notes["HAProxy sent new connections to the new primary"] = "never"
    changes: list[str] = []
    routed: list[str] | None = None
    while True:
        servers = await asyncio.to_thread(balancer.servers)
        after = f"{time.monotonic() - started:.2f} s"
        if not down and servers.get(old, "UP").startswith(("DOWN", "MAINT")):
            down = True
            ended = sessions_ended(balancer, old, log_from)
            rig.notes["HAProxy marked the old primary down"] = f"{after} after the fault, {ended}"
        if not up and any(s == "UP" for name, s in servers.items() if name != old):
            up = True
            rig.notes["HAProxy sent new connections to the new primary"] = (
                f"{after} after the fault"
            )
        if servers and routes(servers) != routed:
            routed = routes(servers)
            changes.append(f"{' and '.join(routed) or 'no node'} from {after}")
            rig.notes["HAProxy routed new connections to"] = ", ".join(changes)
        await asyncio.sleep(HAPROXY_SAMPLE_SECONDS)


def sessions_ended(balancer: HAProxy, server: str, log_from: int) -> str:
    """What HAProxy's log, from byte `log_from`, says of `server` marked down."""
    with contextlib.suppress(OSError):
        with balancer.log_path.open("rb") as log_file:
            log_file.seek(log_from)
            text = log_file.read().decode(errors="replace")
        for name, sessions in DOWN_LINE.findall(text):
            if name == server:
                return f"ending the {sessions} sessions it had"
    return "its log names no sessions"


def _sentinels(rig: Rig) -> LocalSentinel:
    assert rig.sentinel is not None
    return rig.sentinel


async def kill_redis_master(rig: Rig) -> None:
    """The Redis master SIGKILLed; the sentinels see it down after 1 s and promote the
    replica."""
    group = _sentinels(rig)
    await asyncio.to_thread(group.master.kill)
    log(f"SIGKILLed the Redis master (port {group.master.port})")


async def redis_replica_promoted(rig: Rig) -> None:
    """Heals once every sentinel names the replica the master."""
    group = _sentinels(rig)
    started = time.monotonic()
    await asyncio.to_thread(group.wait_master, group.replica.port, SENTINEL_PROMOTION_SECONDS)
    rig.notes["sentinels named the replica master"] = (
        f"{time.monotonic() - started:.2f} s after the kill"
    )
    log(f"the sentinels name the replica (port {group.replica.port}) the master")


# How long after the promotion every gateway may take to be back on Redis: a command
# connection fails once (one retry, no backoff) and the breaker stays open
# BREAKER_OPEN_SECONDS (5 s) after repeated errors.
BACK_ON_REDIS_SECONDS = 20.0
QUIET_SECONDS = 1.0  # no Redis error for this long: the gateway is served again


async def back_on_redis(rig: Rig) -> str:
    """Every gateway served by the promoted master again, within BACK_ON_REDIS_SECONDS
    of the promotion: it holds a connection to it, its Redis breaker is closed, and its
    Redis errors stopped growing (none for QUIET_SECONDS). Notes when; returns what is
    wrong, or ''."""
    port = _sentinels(rig).replica.port
    started = time.monotonic()
    why = ""
    while time.monotonic() < started + BACK_ON_REDIS_SECONDS:
        why = await _not_served_by(rig, port)
        if not why:
            rig.notes["every gateway back on Redis"] = (
                f"{time.monotonic() - started:.2f} s after the promotion"
            )
            return ""
        await asyncio.sleep(0.2)
    return f"not every gateway was back on Redis {BACK_ON_REDIS_SECONDS:.0f} s after: {why}"


async def _not_served_by(rig: Rig, port: int) -> str:
    """Why some gateway is not served by the Redis on `port`, or ''."""
    before = []
    for i, gateway in enumerate(rig.gateways):
        if gateway.process is None:
            return f"gateway {i} is not running"
        try:
            connections = psutil.Process(gateway.process.pid).net_connections("tcp")
        except psutil.Error as exc:
            return f"gateway {i}'s connections cannot be read: {exc}"
        peers = {c.raddr.port for c in connections if c.raddr}
        if port not in peers:
            return f"gateway {i} holds no connection to the new master (port {port})"
        if await gateway.metric(REDIS_BREAKER) != 0.0:
            return f"gateway {i}'s Redis breaker is open"
        before.append(await gateway.metric(REDIS_ERRORS))
    await asyncio.sleep(QUIET_SECONDS)
    after = [await g.metric(REDIS_ERRORS) for g in rig.gateways]
    if after != before:
        return f"Redis errors still grow ({before} then {after})"
    return ""
