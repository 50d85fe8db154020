"""Readiness is about the instance, not the database every instance shares: while
Postgres is stopped or does not answer (a failover), /readyz stays 200 and says so in
`degraded`, so that a Kubernetes Service keeps its endpoints and clients get a fast 503
rather than refused connections; shutting down is still not ready. /healthz is not
touched by any of it (docs/operations/failover.md)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.faults.servers import PrivatePostgres
from tests.support.databases import migrate
from tests.support.gateways import gateway
from tests.support.http import req
from tests.support.lifecycle import assert_problem, enqueue
from tests.support.metrics import sample
from tests.support.proxy import BlackholeProxy
from tests.support.waiting import within

# The readiness probe's timeout in deploy/kubernetes: an answer later than this is a
# failed probe, whatever it says.
PROBE_TIMEOUT_SECONDS = 3.0
DEGRADED = {"status": "ready", "degraded": ["database unavailable"]}


@pytest.fixture
async def private_postgres() -> AsyncIterator[PrivatePostgres]:
    """A Postgres of the test's own (the machine's is shared), migrated, which the test
    stops and starts; stopped and removed afterwards."""
    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="gateway-readyz-pg-")))
    try:
        await asyncio.to_thread(server.init)
        await migrate(server.url)
        yield server
    finally:
        await asyncio.to_thread(server.stop, "immediate")
        shutil.rmtree(server.workdir, ignore_errors=True)


async def probe(gw, path: str = "/readyz") -> tuple[int, object, float]:
    started = time.monotonic()
    resp = await req(gw, "GET", path, auth=None)
    return resp.status, resp.body, time.monotonic() - started


async def test_readyz_stays_ready_while_postgres_is_stopped(
    private_postgres, redis_url, runtime_id
):
    async with gateway(private_postgres.url, redis_url) as gw:
        assert (await probe(gw))[:2] == (200, {"status": "ready"})
        await asyncio.to_thread(private_postgres.stop, "fast")

        status, body, took = await probe(gw)
        assert (status, body) == (200, DEGRADED)
        assert took < PROBE_TIMEOUT_SECONDS
        assert (await probe(gw, "/healthz"))[:2] == (200, {"status": "ok"})
        # Ready, and answering: what needs Postgres gets a 503 at once.
        refused = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1})
        assert_problem(refused, 503, "store_unavailable")
        # When to try again, as every 503 says: a client that honours it waits.
        assert refused.headers["Retry-After"] == "1"
        # Ready, but its metrics say it does not reach Postgres (the alert's input).
        assert sample(gw, "gateway_database_reachable") == 0

        await asyncio.to_thread(private_postgres.start)
        await wait_until_serving(gw, runtime_id)
        assert (await probe(gw))[:2] == (200, {"status": "ready"})
        assert sample(gw, "gateway_database_reachable") == 1


async def test_readyz_is_not_ready_while_shutting_down_even_with_postgres_stopped(
    private_postgres, redis_url
):
    async with gateway(private_postgres.url, redis_url) as gw:
        await asyncio.to_thread(private_postgres.stop, "fast")
        assert (await probe(gw))[:2] == (200, DEGRADED)
        gw.gateway.claimer.drain()
        assert (await probe(gw))[:2] == (
            503,
            {"status": "not ready", "problems": ["shutting down"]},
        )


async def test_readyz_answers_within_the_probe_timeout_when_postgres_does_not_answer(
    database_url, redis_url
):
    """A path that drops packets: the pooled connection's statement would wait for the
    statement timeout (10 s), a new connection for its connect timeout."""
    port = int(database_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = BlackholeProxy(port)
    await proxy.start()
    try:
        via = database_url.replace(f":{port}/", f":{proxy.port}/", 1)
        async with gateway(via, redis_url) as gw:
            assert (await probe(gw))[:2] == (200, {"status": "ready"})
            proxy.blackhole()
            status, body, took = await probe(gw)
            assert (status, body) == (200, DEGRADED)
            assert took < PROBE_TIMEOUT_SECONDS
            proxy.heal()
    finally:
        await proxy.close()


async def wait_until_serving(gw, runtime_id: str) -> None:
    """Enqueue until one is stored: the pool replaces its connections to the stopped
    server as requests need them."""

    async def stored() -> bool:
        resp = await req(gw, "POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 2})
        return resp.status == 201

    await within(20, stored)
    await enqueue(gw, runtime_id, 3)
