"""A saturated pool sheds load: a request waits GATEWAY_DB_ACQUIRE_TIMEOUT_MS at most
for a pooled connection, then gets 503 database_busy with Retry-After, instead of
queueing without end behind the others."""

from __future__ import annotations

import time
import uuid

import pytest

from gateway.errors import DatabaseBusy, NotFound, StoreUnavailable
from gateway.metrics import Metrics
from gateway.store import Store
from tests.support.gateways import TOKEN, make_settings, running_gateway
from tests.support.metrics import sample
from tests.support.stores import holding

pytestmark = pytest.mark.integration


async def test_a_request_waits_the_acquire_timeout_then_is_refused(database_url):
    metrics = Metrics()
    store = Store(database_url, metrics, min_size=1, max_size=2, acquire_timeout_ms=300)
    await store.open()
    async with holding(store, 2):
        started = time.monotonic()
        with pytest.raises(DatabaseBusy) as info:
            await store.get(uuid.uuid4())
        waited = time.monotonic() - started
        # Refused after the bound, not at once and not after the 10 s wait_for above.
        assert 0.25 <= waited < 5.0, waited
        assert isinstance(info.value, StoreUnavailable)  # compensations still catch it
        assert "GATEWAY_DB_ACQUIRE_TIMEOUT_MS" in info.value.detail
        assert info.value.headers() == {"Retry-After": "1"}
        assert metrics.db_acquire_timeouts._value.get() == 1
    # Both connections came back: the next request is served.
    with pytest.raises(NotFound):
        await store.get(uuid.uuid4())
    await store.close()


async def test_a_slow_statement_is_still_a_database_failure_not_busy(database_url):
    # The statement's own timeout (TimeoutError too) must not read as a busy pool.
    store = Store(database_url, Metrics(), min_size=1, max_size=2, acquire_timeout_ms=5_000)
    await store.open()
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.run(lambda c: c.execute("SELECT pg_sleep(5)", timeout=0.2))
        assert not isinstance(info.value, DatabaseBusy)
    finally:
        await store.close()


async def test_the_http_answer_is_503_database_busy_with_retry_after(
    database_url, redis_url, redis_prefix, runtime_id
):
    settings = make_settings(
        database_url, redis_url, redis_prefix, db_pool_max=2, db_acquire_timeout_ms=200
    )
    async with running_gateway(settings) as gw:
        store = gw.gateway.store
        async with holding(store, 2):
            resp = await gw.http.post(
                f"{gw.url}/v1/runtimes/{runtime_id}/tasks",
                json={"payload": {"n": 1}},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            body = await resp.json(content_type=None)
            assert resp.status == 503, body
            assert body["code"] == "database_busy"
            assert resp.headers["Retry-After"] == "1"
            assert sample(gw, "gateway_db_acquire_timeouts_total") >= 1
        resp = await gw.http.post(
            f"{gw.url}/v1/runtimes/{runtime_id}/tasks",
            json={"payload": {"n": 1}},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert resp.status == 201, await resp.text()
