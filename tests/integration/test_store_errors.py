"""Driver errors never reach a client: their text can name hosts, databases or other
callers' values (a batched claim carries every waiter's worker id)."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.store import Store


async def test_a_driver_error_is_logged_and_answered_without_its_text(database_url, caplog):
    store = Store(database_url, Metrics(), min_size=1, max_size=2)
    await store.open()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.store"):
            with pytest.raises(StoreUnavailable) as info:
                await store.run(lambda c: c.fetchval("SELECT 'worker-of-another-tenant'::int"))
    finally:
        await store.close()
    assert "worker-of-another-tenant" not in info.value.detail
    assert "log" in info.value.detail
    assert any("worker-of-another-tenant" in r.getMessage() for r in caplog.records)


async def test_a_cancelled_leadership_attempt_leaves_no_connection(fresh_database_url):
    """The janitor is cancelled at shutdown, possibly between connecting and taking
    the lock: that connection must not outlive it (it could hold the lock)."""
    import asyncio

    import asyncpg

    store = Store(fresh_database_url, Metrics())
    for step in range(40):
        attempt = asyncio.create_task(store.try_leadership(424242))
        await asyncio.sleep(step * 0.0005)
        attempt.cancel()
        try:
            leadership = await attempt
        except asyncio.CancelledError:
            continue
        if leadership is not None:
            await leadership.release()
    probe = await asyncpg.connect(fresh_database_url)
    try:
        for _ in range(100):
            left = await probe.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'claim-gateway-janitor' AND datname = current_database()"
            )
            if left == 0:
                break
            await asyncio.sleep(0.05)
        assert left == 0
    finally:
        await probe.close()
