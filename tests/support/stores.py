"""The gateway's Store, driven without the HTTP layer: opened on a database with a pool
of a given size (`open_store`), and handed requests parsed as the routes parse them
(`enqueue_request`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.requests import EnqueueRequest, parse_enqueue
from gateway.metrics import Metrics
from gateway.store import Store

MAX_PAYLOAD_BYTES = 1_000_000


@contextlib.asynccontextmanager
async def open_store(database_url: str, max_size: int = 1) -> AsyncIterator[Store]:
    """A Store on `database_url` with metrics of its own, at most `max_size` connections
    (one by default: a query logger on it sees every statement sent), closed afterwards."""
    store = Store(database_url, Metrics(), min_size=1, max_size=max_size)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def enqueue_request(payload: Any, **fields: Any) -> EnqueueRequest:
    """One enqueue's request, as the route parses its body (`fields`: priority,
    idempotency_key, delay_seconds, ...)."""
    return parse_enqueue({"payload": payload, **fields}, None, MAX_PAYLOAD_BYTES)
