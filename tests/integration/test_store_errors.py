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
