"""The matrix's rows: each fault is injected, held for `hold_seconds`, then healed; and
the reading of the counter that proves a fault left a trace."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg
import psutil
import redis.asyncio as aioredis

from tests.faults import failovers
from tests.faults.rig import JANITOR_INTERVAL_SECONDS, Rig
from tests.faults.servers import REDIS_ERRORS, log

Step = Callable[[Rig], Awaitable[None]]
# Runs from the heal, beside the load, and says what went wrong ('' for nothing).
Check = Callable[[Rig], Coroutine[Any, Any, str]]
LEADER_METRIC = "gateway_janitor_leader"
BACKEND_KILL_EVERY_SECONDS = 0.3
MID_CLAIM_WATCH_SECONDS = 5.0
# Ticks the tick passes enqueued (gateway/schedules/service.py), a pass's failures left out.
TICKS_ENQUEUED = 'gateway_schedule_ticks_total{outcome="enqueued"}'
# The tick pass's statements (gateway/store/sql/schedules.py) as pg_stat_activity shows
# the one a backend runs, or last ran in its open transaction: the due schedules
# locked, their ticks and tasks written, the schedules advanced.
TICK_PASS_STATEMENTS = [
    "%FOR UPDATE OF s SKIP LOCKED%",
    "%INSERT INTO schedule_ticks%",
    "%UPDATE schedules s%",
]


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
    # The gateways reach the Patroni pair through HAProxy on Patroni's /primary check
    # (rig's `haproxy`), not through a multi-host URL.
    haproxy: bool = False
    # A gateway counter (summed over both; a gateway started again counts from zero)
    # that must grow across the fault, so that a fault that silently did nothing cannot
    # pass as a clean row.
    proof: str | None = None
    # The proof must also have counted before the fault: the work it counts ran on both
    # sides of it.
    proof_before: bool = False
    # What must come true after the heal while the load goes on (the old primary back
    # as a replica, say); its problem, if any, fails the row.
    settled: Check | None = None
    sentinel: bool = False  # Redis is a master, its replica and sentinels (rig's `sentinel`)
    # The load also runs schedules (tests/faults/ticks.py), and the check their class:
    # every due tick has exactly one task or a recorded skip.
    schedules: bool = False

    @property
    def failover(self) -> bool:
        """A row that moves a primary: Postgres's (Patroni) or Redis's (Sentinel)."""
        return self.replication is not None or self.sentinel


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


async def _kill_mid_pass(rig: Rig, index: int) -> None:
    """SIGKILL gateway `index` as soon as one of its tick passes is seen inside its
    transaction (due schedules locked, their ticks perhaps written, nothing committed):
    Postgres rolls the pass back whole, and the next leader decides the same ticks.
    After MID_CLAIM_WATCH_SECONDS without seeing one, anyway."""
    gateway = rig.gateways[index]
    assert gateway.process is not None
    conn = await asyncpg.connect(rig.database_url, timeout=10)
    try:
        deadline = time.monotonic() + MID_CLAIM_WATCH_SECONDS
        seen = None
        for round_ in itertools.count():
            if seen is not None or time.monotonic() > deadline:
                break
            if round_ % 50 == 0:  # its pool opens connections as it needs them
                ports = _local_ports(gateway.process.pid)
            seen = await conn.fetchval(
                "SELECT query FROM pg_stat_activity WHERE client_port = ANY($1::int[]) "
                "AND state IN ('active', 'idle in transaction') "
                "AND query LIKE ANY($2::text[])",
                ports,
                TICK_PASS_STATEMENTS,
            )
        await gateway.kill()  # before anything else: the pass may commit any moment
    finally:
        await conn.close()
    where = "inside a tick pass's transaction" if seen else "without seeing a tick pass"
    rig.notes["janitor leader SIGKILLed"] = where
    log(f"SIGKILLed gateway {index}, the janitor's leader, {where}")


async def _janitor_leader(rig: Rig) -> int:
    """The index of the gateway that reports itself the janitor's leader."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for index, gateway in enumerate(rig.gateways):
            if await gateway.metric(LEADER_METRIC) == 1.0:
                return index
        await asyncio.sleep(0.1)
    raise RuntimeError("no gateway reported itself the janitor's leader")


async def _kill_janitor_leader(rig: Rig) -> None:
    await _kill_mid_claim(rig, await _janitor_leader(rig))


async def _redis_kill_then_leader_mid_pass(rig: Rig) -> None:
    """Redis first, so that the surviving gateway takes the lead, and runs its first
    tick passes, with no Redis to bump the runtimes that got tasks."""
    rig.redis.kill()
    await _kill_mid_pass(rig, await _janitor_leader(rig))


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


async def _redis_start_then_takeover(rig: Rig) -> None:
    await _redis_start(rig)
    await _takeover_then_restart(rig)


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
            "janitor leader SIGKILLed mid tick pass + Redis restarted",
            _redis_kill_then_leader_mid_pass,
            _redis_start_then_takeover,
            schedules=True,
            # Passes enqueued ticks before the fault (the old leader's) and after it
            # (the survivor's, once it took the lock).
            proof=TICKS_ENQUEUED,
            proof_before=True,
        ),
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
                    failovers.switchover,
                    failovers.new_primary,
                    hold_seconds=0.0,
                    replication=mode,
                ),
                Fault(
                    f"Patroni primary SIGKILLed ({mode})",
                    failovers.crash_primary,
                    failovers.new_primary,
                    hold_seconds=0.0,
                    replication=mode,
                    # Asynchronous replication acknowledges a commit before the replica
                    # has it: a commit in the last moment before the kill may be lost
                    # however close the replica was when it was measured (one enqueue
                    # was, once, with 0 bytes of WAL behind just before the kill).
                    loss_allowed=mode == "asynchronous",
                    settled=failovers.rejoined,
                ),
                Fault(
                    f"Patroni primary cut off from etcd and its replica ({mode})",
                    failovers.cut_primary,
                    failovers.promoted_then_reconnect,
                    hold_seconds=0.0,
                    replication=mode,
                    loss_allowed=mode == "asynchronous",
                    partition=True,
                    settled=failovers.rejoined_after_heal,
                ),
                Fault(
                    f"Patroni primary SIGKILLed with its replica 1 s behind ({mode})",
                    failovers.crash_primary_replica_stalled,
                    failovers.new_primary,
                    hold_seconds=0.0,
                    replication=mode,
                    loss_allowed=mode == "asynchronous",
                    # Its WAL outran the replica's: it can only come back rewound.
                    settled=failovers.rejoined_through_rewind,
                ),
            )
        ),
        # The same faults, the gateways reaching the pair through HAProxy, as
        # docs/operations/failover.md recommends for Patroni.
        Fault(
            "Patroni switchover through HAProxy (synchronous)",
            failovers.through_haproxy(failovers.switchover),
            failovers.new_primary,
            hold_seconds=0.0,
            replication="synchronous",
            haproxy=True,
        ),
        Fault(
            "Patroni primary SIGKILLed through HAProxy (synchronous)",
            failovers.through_haproxy(failovers.crash_primary),
            failovers.new_primary,
            hold_seconds=0.0,
            replication="synchronous",
            haproxy=True,
            settled=failovers.rejoined,
        ),
        *(
            Fault(
                f"Patroni primary cut off from etcd and its replica through HAProxy ({mode})",
                failovers.through_haproxy(failovers.cut_primary),
                failovers.promoted_then_reconnect,
                hold_seconds=0.0,
                replication=mode,
                loss_allowed=mode == "asynchronous",
                partition=True,
                haproxy=True,
                settled=failovers.rejoined_after_heal,
            )
            # Asynchronous too: whether HAProxy shortens the split brain's loss window.
            for mode in ("synchronous", "asynchronous")
        ),
        Fault(
            "Patroni SIGKILLed alone on the primary through HAProxy (synchronous)",
            failovers.through_haproxy(failovers.kill_primary_patroni),
            failovers.new_primary,
            hold_seconds=0.0,
            replication="synchronous",
            haproxy=True,
        ),
        Fault(
            "Redis Sentinel failover (master SIGKILLed)",
            failovers.kill_redis_master,
            failovers.redis_replica_promoted,
            hold_seconds=0.0,
            sentinel=True,
            # The subscriber's connection was to the dead master: it must reconnect.
            proof="gateway_pubsub_reconnects_total",
            settled=failovers.back_on_redis,
        ),
    )
}
SHORT = (
    "Redis SIGKILL + restart",
    "pub/sub connection killed",
    "one gateway SIGKILLed mid-claim",
    "janitor leader SIGKILLed mid tick pass + Redis restarted",
)


async def counters(rig: Rig, name: str) -> dict[int, float]:
    """Counter `name` of each gateway that answers, by its process id."""
    found = {}
    for g in rig.gateways:
        pid = g.process.pid if g.process is not None else None
        value = await g.metric(name)
        if pid is not None and value is not None:
            found[pid] = value
    return found


def grown(before: dict[int, float], after: dict[int, float]) -> float:
    """How much a counter grew over the gateways from `before` to `after` (counters()):
    a process started since counts from zero, one gone counts nothing."""
    return sum(value - before.get(pid, 0.0) for pid, value in after.items())


# How long a row waits, after its warm-up, for its proof counter to count what ran
# before the fault (Fault.proof_before).
PROOF_BEFORE_SECONDS = 10.0


async def proof_before(rig: Rig, fault: Fault) -> tuple[dict[int, float], str]:
    """The proof counter before the fault, and what is wrong with it ('' for
    nothing): with proof_before, it must count something, waited for a while."""
    assert fault.proof is not None
    deadline = time.monotonic() + PROOF_BEFORE_SECONDS
    before = await counters(rig, fault.proof)
    while fault.proof_before and not sum(before.values()):
        if time.monotonic() > deadline:
            return before, f"{fault.proof} counted nothing before the fault"
        await asyncio.sleep(0.1)
        before = await counters(rig, fault.proof)
    return before, ""
