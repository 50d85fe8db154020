"""The gateway's Store, driven without the HTTP layer: opened on a database with a pool
of a given size (`open_store`), and handed requests parsed as the routes parse them
(`enqueue_request`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from gateway.api.requests import EnqueueRequest, parse_enqueue
from gateway.errors import DatabaseBusy
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


@contextlib.asynccontextmanager
async def holding(store: Store, count: int) -> AsyncIterator[None]:
    """Inside it, `count` of the store's pooled connections are held (every one, for a
    pool of that size), as by statements that do not finish; released on the way out."""
    release, held = asyncio.Event(), asyncio.Semaphore(0)
    holders = [asyncio.create_task(_hold(store, release, held)) for _ in range(count)]
    try:
        for _ in holders:
            await asyncio.wait_for(held.acquire(), 10)
        yield
    finally:
        release.set()
        await asyncio.gather(*holders)


async def _hold(store: Store, release: asyncio.Event, held: asyncio.Semaphore) -> None:
    """Holds one pooled connection until `release`, releasing `held` once it has it. A
    gateway's own background work (the janitor's first pass, on a loaded machine) may
    hold one for longer than a test's short acquire timeout at first: the holder then
    asks again."""

    async def wait(_: asyncpg.Connection) -> None:
        held.release()
        await release.wait()

    while True:
        try:
            await store.run(wait)
            return
        except DatabaseBusy:
            await asyncio.sleep(0.05)
