"""GATEWAY_REDIS_MODE=cluster against a real three-master Redis Cluster of the module's
own: verdicts for runtimes on every node, wake-ups across nodes and instances, the
janitor's scans, and a master killed under parked polls (fail open, then recovery)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from gateway.errors import CacheUnavailable
from gateway.metrics import Metrics
from gateway.redis.breaker import CircuitBreaker
from gateway.redis.clients import ClusterNodes, command_client
from gateway.redis.keys import keys_for
from gateway.redis.verdict import VerdictCache
from tests.support.claims import pg_claims, poll, timed_enqueue, verdict_hits
from tests.support.gateways import (
    Instance,
    make_settings,
    running_gateway,
    serve_env,
    serve_refused,
)
from tests.support.janitor import empty_verdict
from tests.support.metrics import sample
from tests.support.proxy import BlackholeProxy
from tests.support.redis_servers import LocalCluster, RedisServer, require_redis_cli
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_redis_cli("the Redis Cluster tests")
    local = LocalCluster(Path(tmp_path_factory.mktemp("cluster")))
    try:
        local.start()
        yield local
    finally:
        local.stop()


CLUSTER_MODE: dict[str, Any] = {"redis_mode": "cluster"}


async def runtimes_by_node(
    cluster: LocalCluster, prefix: str, count: int, each_at_least: int = 1
) -> dict[int, list[str]]:
    """At least `count` fresh runtime ids, and more until every master holds
    `each_at_least` of them (ids are random: a fixed count may leave a master short),
    grouped by the port of the master that holds their keys (CLUSTER KEYSLOT of the
    version key, then the cluster's slot map)."""
    client = aioredis.Redis(port=cluster.nodes[0].port, decode_responses=True)
    grouped: dict[int, list[str]] = {n.port: [] for n in cluster.nodes}
    made = 0
    try:
        while made < count or min(map(len, grouped.values())) < each_at_least:
            assert made < 100 * max(count, 1), f"runtimes do not spread over the nodes: {grouped}"
            made += 1
            runtime = "rt-" + secrets.token_hex(6)
            key = keys_for(prefix, runtime).version
            slot = await client.execute_command("CLUSTER KEYSLOT", key)
            grouped[cluster.node_of_slot(int(slot)).port].append(runtime)
    finally:
        await client.aclose()
    return grouped


def checks(inst: Instance, outcome: str) -> float:
    return sample(inst, "gateway_verdict_checks_total", outcome=outcome)


def subscriber_node(inst: Instance) -> tuple[str, int] | None:
    source = inst.gateway.subscriber._client
    assert isinstance(source, ClusterNodes)
    return source.current


async def test_empty_polls_on_every_node_are_answered_from_redis(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    grouped = await runtimes_by_node(cluster, redis_prefix, 40)
    runtimes = [rt for group in grouped.values() for rt in group]
    async with running_gateway(
        make_settings(database_url, cluster.url, redis_prefix, **CLUSTER_MODE)
    ) as a:
        for runtime in runtimes:  # the first poll of each scans Postgres and says empty
            await empty_verdict(a, runtime)
        for _ in range(3):
            deadline = time.monotonic() + 15
            while not a.gateway.cache.healthy:  # a round after a breaker trip: let it close
                assert time.monotonic() < deadline, "the breaker did not close"
                await poll(a, runtimes[0], wait_seconds=0)
                await asyncio.sleep(0.2)
            claims, hits = pg_claims(a), verdict_hits(a)
            misses, errors = checks(a, "miss"), checks(a, "error")
            answers = await asyncio.gather(*(poll(a, rt, wait_seconds=0) for rt in runtimes))
            assert all(answer.tasks == [] for answer in answers)
            assert checks(a, "miss") == misses, "a verdict written as empty was not a hit"
            if pg_claims(a) == claims:
                break
            # Only a Redis call over its budget (a loaded machine) may send one there.
            assert checks(a, "error") > errors, "empty polls must not reach Postgres"
        else:
            raise AssertionError("every round of empty polls had Redis calls time out")
        assert verdict_hits(a) >= hits + len(runtimes)
        # The verdicts really live on the node that owns their slot.
        for port, group in grouped.items():
            node = aioredis.Redis(port=port, decode_responses=True)
            try:
                for runtime in group:
                    assert await node.exists(keys_for(redis_prefix, runtime).empty) == 1
            finally:
                await node.aclose()


async def test_janitor_scans_and_wakeups_reach_every_node(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    grouped = await runtimes_by_node(cluster, redis_prefix, 12)
    runtimes = [rt for group in grouped.values() for rt in group]
    async with running_gateway(
        make_settings(database_url, cluster.url, redis_prefix, **CLUSTER_MODE)
    ) as a:
        said_empty = runtimes[::2]
        for runtime in said_empty:
            await empty_verdict(a, runtime)
        cache = a.gateway.cache
        assert sorted(await cache.says_empty(runtimes)) == sorted(said_empty)
        listener = aioredis.Redis(port=cluster.nodes[0].port)
        pubsub = listener.pubsub()
        try:
            await pubsub.subscribe(*(keys_for(redis_prefix, rt).wake for rt in runtimes))
            for _ in runtimes:
                assert (await pubsub.get_message(timeout=2))["type"] == "subscribe"
            await cache.wake(runtimes)
            heard = set()
            while len(heard) < len(runtimes):
                message = await pubsub.get_message(timeout=2)
                assert message is not None, f"heard only {len(heard)} wake-ups"
                heard.add(message["data"].decode())
            assert heard == set(runtimes)
        finally:
            await pubsub.aclose()
            await listener.aclose()


async def _wakes_within_a_second(a: Instance, b: Instance, runtime: str) -> None:
    await empty_verdict(a, runtime)
    waiting = asyncio.create_task(poll(a, runtime, "parked", wait_seconds=15))
    await wait_until(lambda: a.gateway.claimer.parked(runtime) == 1, 3, "poll parked")
    await wait_until(
        lambda: a.gateway.subscriber.confirmed(a.gateway.cache.keys(runtime).wake), 3, "confirmed"
    )
    await asyncio.sleep(0.2)
    task, sent = await timed_enqueue(b, runtime, "wake")
    answer = await asyncio.wait_for(waiting, 5)
    assert [t["id"] for t in answer.tasks] == [task["id"]]
    assert answer.answered - sent < 1.0, f"woken after {answer.answered - sent:.2f}s"
    await a.complete(answer.tasks[0])


async def _bumps_again(inst: Instance, runtime: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            await inst.gateway.cache.bump(runtime)
            return
        except CacheUnavailable:
            assert time.monotonic() < deadline, "no bump reached the returned master"
            await asyncio.sleep(0.2)


async def test_a_poll_parked_on_one_instance_wakes_on_an_enqueue_through_another(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    grouped = await runtimes_by_node(cluster, redis_prefix, 24)
    # Polling Postgres is slow here, so only a wake-up can answer within a second.
    cfg = make_settings(
        database_url, cluster.url, redis_prefix, **CLUSTER_MODE, degraded_poll_seconds=20
    )
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        for group in grouped.values():  # one runtime on each master
            await _wakes_within_a_second(a, b, group[0])


async def test_a_wait_for_a_result_is_woken_by_a_complete_through_another_instance(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    """The result wake-up is published by a keyless script on any node; the waiting
    instance hears it on its one pub/sub connection. Postgres polling is slow here, so
    only the wake-up can answer the wait."""
    cfg = make_settings(
        database_url, cluster.url, redis_prefix, **CLUSTER_MODE, degraded_poll_seconds=20
    )
    runtime = "rt-" + secrets.token_hex(6)
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        task = await a.enqueue(runtime, "wait for me")
        waiting = asyncio.create_task(a.call("GET", f"/v1/tasks/{task['id']}?wait_seconds=30"))
        await wait_until(lambda: a.gateway.results.waiting() == 1, 5, "a waiting request")
        await asyncio.sleep(0.2)  # its channel subscribed and its task read
        [claimed] = await b.claim(runtime)
        await b.complete(claimed, result="through b")
        status, answer = await asyncio.wait_for(waiting, 15)
        assert status == 200 and answer["result"] == "through b", answer
        # At least: a janitor pass may also have finished other tests' leftover tasks.
        assert sample(b, "gateway_result_publishes_total", outcome="ok") >= 1


async def test_a_killed_master_fails_open_and_the_cache_comes_back(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    """The master under A's pub/sub connection is SIGKILLed with polls parked on its
    runtimes: they fall back to Postgres (one gets a task enqueued meanwhile, none
    outlives its wait by much), the subscriber moves to another node, and once the
    master is back verdicts and wake-ups work again for its runtimes."""
    grouped = await runtimes_by_node(cluster, redis_prefix, 40, each_at_least=5)
    cfg = make_settings(
        database_url,
        cluster.url,
        redis_prefix,
        **CLUSTER_MODE,
        degraded_poll_seconds=1,
        redis_timeout_ms=100,
    )
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        await wait_until(lambda: a.gateway.subscriber.healthy, 5, "subscriber up")
        current = subscriber_node(a)
        assert current is not None
        victim: RedisServer = next(n for n in cluster.nodes if n.port == current[1])
        runtimes = grouped[victim.port][:3]
        for runtime in runtimes:
            await empty_verdict(a, runtime)
        wait_seconds = 6
        parked = {
            rt: asyncio.create_task(poll(a, rt, "parked", wait_seconds=wait_seconds))
            for rt in runtimes
        }
        for runtime in runtimes:
            await wait_until(lambda rt=runtime: a.gateway.claimer.parked(rt) == 1, 3, "parked")
        victim.kill()
        try:
            await wait_until(lambda: subscriber_node(a) != current, 5, "subscriber to move")
            task, sent = await timed_enqueue(b, runtimes[0], "while a master is down")
            first = await asyncio.wait_for(parked.pop(runtimes[0]), 5)
            assert [t["id"] for t in first.tasks] == [task["id"]]
            assert first.answered - sent < 3.0, f"took {first.answered - sent:.2f}s"
            await a.complete(first.tasks[0])
            for answer in await asyncio.gather(*parked.values()):
                assert answer.tasks == []
                assert answer.elapsed < wait_seconds + 2.0, f"hung {answer.elapsed:.2f}s"
        finally:
            victim.start()
        await asyncio.to_thread(cluster.wait_ok)
        await wait_until(lambda: a.gateway.subscriber.healthy, 10, "subscriber back")

        # Verdicts on the returned master answer empty polls again, off Postgres.
        empty_rt = grouped[victim.port][3]
        hits = verdict_hits(a)
        deadline = time.monotonic() + 15
        while verdict_hits(a) == hits:
            assert time.monotonic() < deadline, "the verdict cache did not come back"
            assert (await poll(a, empty_rt, wait_seconds=0)).tasks == []
            await asyncio.sleep(0.2)
        claims = pg_claims(a)
        for _ in range(5):
            assert (await poll(a, empty_rt, wait_seconds=0)).tasks == []
        assert pg_claims(a) == claims
        # And wake-ups reach parked polls for its runtimes within a second again, once
        # B too has reached the returned master. B's first call there reconnects, learns
        # the slot map and loads the bump script into the restarted node: several round
        # trips, which on a loaded machine can outrun this test's 100 ms Redis budget.
        # That bump is lost and the janitor repairs it (I6), seconds later.
        await wait_until(lambda: a.gateway.cache.healthy, 10, "A's cache healthy")
        woken_rt = grouped[victim.port][4]
        await _bumps_again(b, woken_rt)
        await _wakes_within_a_second(a, b, woken_rt)


async def test_a_cluster_unreachable_at_start_up_fails_open_until_it_is_reached(
    database_url: str, cluster: LocalCluster, redis_prefix: str
) -> None:
    """With no node reachable, the cluster client cannot learn the slot map, and every
    call raises redis-py's RedisClusterException (no RedisError): the gateway still
    starts, claims and enqueues go to Postgres, and once a node answers the verdicts
    work again."""
    door = BlackholeProxy(cluster.nodes[0].port)  # not listening yet: refused
    cfg = make_settings(
        database_url, door.url, redis_prefix, **CLUSTER_MODE, degraded_poll_seconds=1
    )
    runtime = "rt-" + secrets.token_hex(6)
    try:
        async with running_gateway(cfg) as a:
            task = await a.enqueue(runtime, {"n": 1})
            answer = await poll(a, runtime, wait_seconds=0)
            assert answer.status == 200 and [t["id"] for t in answer.tasks] == [task["id"]]
            await a.complete(answer.tasks[0])
            assert (await poll(a, runtime, wait_seconds=0)).tasks == []
            assert checks(a, "error") > 0
            await door.start()
            hits = verdict_hits(a)
            deadline = time.monotonic() + 15
            while verdict_hits(a) == hits:
                assert time.monotonic() < deadline, "the verdict cache did not come back"
                assert (await poll(a, runtime, wait_seconds=0)).tasks == []
                await asyncio.sleep(0.2)
    finally:
        await door.close()


async def test_cluster_mode_on_a_redis_that_is_no_cluster_node_stops_the_start(
    database_url: str, redis_url: str, redis_prefix: str
) -> None:
    """A Redis that answers, but is no cluster node, is a setting to fix, not an
    outage to ride out: the start stops with a configuration error that says so."""
    env = serve_env(database_url, redis_url, redis_prefix, GATEWAY_REDIS_MODE="cluster")
    code, lines = await serve_refused(env=env)
    assert code == 2, lines
    assert lines == [
        "gateway: GATEWAY_REDIS_MODE is cluster, but the Redis at REDIS_URL answered that "
        "it is not a cluster node (Cluster mode is not enabled on this node); set "
        "GATEWAY_REDIS_MODE to standalone, or point REDIS_URL at a node of the cluster"
    ]


async def test_a_burst_opens_at_most_the_bound_of_connections_to_each_node(
    cluster: LocalCluster, redis_prefix: str
) -> None:
    """GATEWAY_REDIS_MAX_CONNECTIONS bounds each node's connections: 60 concurrent
    reads and bumps over runtimes on every node all succeed through 2 per node."""
    name = f"{redis_prefix}-pool"  # to find the client's connections in CLIENT LIST
    client = command_client("cluster", f"{cluster.url}?client_name={name}", 2.0, None, 2)
    assert isinstance(client, RedisCluster)
    cache = VerdictCache(
        client,
        redis_prefix,
        Metrics(60),
        timeout_seconds=2.0,
        version_ttl_seconds=3600,
        breaker=CircuitBreaker(3, 5.0),
        cluster=True,
        max_connections=2,
    )
    grouped = await runtimes_by_node(cluster, redis_prefix, 30)
    runtimes = [rt for group in grouped.values() for rt in group]
    try:
        await client.initialize()  # as the Gateway does when it opens
        calls = [cache.read(rt) for rt in runtimes] + [cache.bump(rt) for rt in runtimes]
        results = await asyncio.gather(*calls, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert failures == [], failures[:3]
        opened = {}
        for node in cluster.nodes:
            admin = aioredis.Redis(port=node.port, decode_responses=True)
            try:
                listed = await admin.client_list()
            finally:
                await admin.aclose()
            # redis-py keeps the connection that learnt the slot map (CLUSTER SLOTS)
            # for later re-discovery, apart from the nodes' pools: not a command's.
            ours = [c for c in listed if c.get("name") == name]
            assert sum(1 for c in ours if c.get("cmd") == "cluster|slots") <= 1, ours
            opened[node.port] = sum(1 for c in ours if c.get("cmd") != "cluster|slots")
        # Idle connections stay pooled: what is open now is all the client ever opened.
        assert all(1 <= n <= 2 for n in opened.values()), opened
    finally:
        await cache.close()
