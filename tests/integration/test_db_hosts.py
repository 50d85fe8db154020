"""A DATABASE_URL that names several hosts (a primary and its replicas) is walked host
by host, each within GATEWAY_DB_CONNECT_TIMEOUT_MS: a host that never answers, or
answers with an error, is passed over for the next (gateway/store/hosts.py).

The bounds are functional, not speed measurements: the driver alone waits 60 s on a
silent host (its whole connect timeout) and never reaches the next; here the next is
reached after one connect timeout. BOUND_SECONDS leaves room for a slow machine.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from gateway.errors import StoreUnavailable, Unreachable
from gateway.metrics import Metrics
from gateway.store import Store, probe
from gateway.store import startup as postgres
from tests.support.bad_hosts import ErrorHost, SilentHost, SlowHost, with_hosts_first
from tests.support.gateways import gateway
from tests.support.lifecycle import claim_one, enqueue

CONNECT_TIMEOUT_MS = 1_000
# Each connection pays the silent host's timeout at most once (then the host that took
# a connection is tried first): a few timeouts, far from the driver's 60 s.
BOUND_SECONDS = 10 * CONNECT_TIMEOUT_MS / 1000

# Errors a Postgres host answers a new connection with while it cannot serve; the driver
# alone stops the walk at each of them.
BROKEN = [
    # An old primary rejoining after a cut, in the fault matrix.
    ("XX000", 'could not open file "global/pg_filenode.map": No such file or directory'),
    ("53300", "sorry, too many clients already"),
    ("57P01", "terminating connection due to administrator command"),
]


async def test_a_gateway_serves_through_a_url_whose_first_host_never_answers(
    database_url, redis_url, runtime_id
):
    async with SilentHost() as silent:
        url = with_hosts_first(database_url, silent.port)
        started = time.monotonic()
        async with asyncio.timeout(BOUND_SECONDS):
            async with gateway(url, redis_url, db_connect_timeout_ms=CONNECT_TIMEOUT_MS) as gw:
                task = await enqueue(gw, runtime_id, "through the second host")
                assert (await claim_one(gw, runtime_id))["id"] == task["id"]
                # The janitor's leadership takes a connection of its own, the same way.
                await gw.gateway.janitor.run_once()
        assert silent.connections >= 1, "the silent host was never tried"
    assert time.monotonic() - started < BOUND_SECONDS


async def test_the_host_that_took_a_connection_is_tried_first_next_time(database_url):
    async with SilentHost() as silent:
        url = with_hosts_first(database_url, silent.port)
        store = Store(url, Metrics(), min_size=1, max_size=4, connect_timeout_ms=CONNECT_TIMEOUT_MS)
        async with asyncio.timeout(BOUND_SECONDS):
            await store.open()
        try:
            tried = silent.connections
            # Connections of their own: the pool's idle one would prove nothing.
            for _ in range(3):
                leadership = await store.try_leadership(31337)
                assert leadership is not None
                await leadership.release()
            assert silent.connections == tried
        finally:
            await store.close()


@pytest.mark.parametrize(("sqlstate", "message"), BROKEN, ids=[s for s, _ in BROKEN])
async def test_a_host_that_answers_with_an_error_is_passed_over(database_url, sqlstate, message):
    async with ErrorHost(sqlstate, message) as broken:
        url = with_hosts_first(database_url, broken.port)
        store = Store(url, Metrics(), min_size=1, max_size=2, connect_timeout_ms=CONNECT_TIMEOUT_MS)
        async with asyncio.timeout(BOUND_SECONDS):
            await store.open()
            try:
                assert await store.run(lambda c: c.fetchval("SELECT 1")) == 1
            finally:
                await store.close()
        assert broken.connections >= 1, "the broken host was never tried"


async def test_when_no_host_takes_the_connection_the_error_names_each_and_why():
    async with SilentHost() as silent, ErrorHost(*BROKEN[0]) as broken:
        url = with_hosts_first("postgresql://postgres@127.0.0.1:1/db", silent.port, broken.port)
        with pytest.raises(Unreachable) as info:
            await postgres.probe(url, 10.0, CONNECT_TIMEOUT_MS / 1000)
        store = Store(url, Metrics(), min_size=0, connect_timeout_ms=CONNECT_TIMEOUT_MS)
        await store.open()
        try:
            with pytest.raises(StoreUnavailable):
                await store.run(lambda c: c.fetchval("SELECT 1"))
        finally:
            await store.close()
    detail = info.value.detail
    assert f"127.0.0.1:{silent.port}: no answer within 1 s" in detail, detail
    assert f"127.0.0.1:{broken.port}: {BROKEN[0][1]}" in detail, detail
    assert "127.0.0.1:1: connection refused" in detail, detail


async def test_gateway_serve_checks_the_schema_through_a_url_whose_first_host_never_answers(
    database_url,
):
    async with SilentHost() as silent:
        url = with_hosts_first(database_url, silent.port)
        async with asyncio.timeout(BOUND_SECONDS):
            schema = await postgres.probe(url, 10.0, CONNECT_TIMEOUT_MS / 1000)
    assert not schema.pending


async def test_gateway_doctor_pays_for_a_silent_host_once_per_run(database_url, monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_SECONDS", CONNECT_TIMEOUT_MS / 1000)
    async with SilentHost() as silent:
        url = with_hosts_first(database_url, silent.port)
        for _ in range(3):  # doctor's questions each open a connection of their own
            conn = await probe.connect(url)
            await probe.close_quietly(conn)
        assert silent.connections == 1


async def test_a_url_of_one_slow_host_is_given_the_acquire_timeout_not_the_per_host_one(
    database_url,
):
    """One host has nothing to pass on to: a login slower than the per-host timeout
    (here 0.5 s against a 1.5 s login) still connects, within the acquire timeout."""
    parts = urlsplit(database_url)
    async with SlowHost((parts.hostname or "127.0.0.1", parts.port or 5432), 1.5) as slow:
        url = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{slow.port}"))
        store = Store(
            url,
            Metrics(),
            min_size=1,
            max_size=2,
            connect_timeout_ms=500,
            acquire_timeout_ms=5_000,
        )
        async with asyncio.timeout(BOUND_SECONDS):
            await store.open()
            try:
                assert await store.schema_is_current() in (True, False)
            finally:
                await store.close()
        assert slow.connections >= 1
