"""What the store's pool does when a connection comes back: no reset query (a round trip
per request), but never a transaction left open for the next borrower."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from gateway.errors import NotFound
from gateway.store import Store

pytestmark = pytest.mark.integration


async def test_a_returned_connection_costs_no_reset_query(store: Store, runtime_id: str) -> None:
    seen: list[str] = []

    async def log_queries(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda record: seen.append(record.query))

    await store.run(log_queries)
    for _ in range(2):
        with pytest.raises(NotFound):
            await store.get(uuid.uuid4())
    await store.claim(runtime_id, ["w"], [30.0])
    assert seen, "the query logger saw nothing: the test would prove nothing"
    resets = [query for query in seen if "RESET ALL" in query or "unlock_all" in query]
    assert resets == [], seen


async def test_a_transaction_left_open_is_rolled_back_on_return(store: Store) -> None:
    async def leave_open(conn: asyncpg.Connection) -> None:
        await conn.execute("BEGIN")

    async def in_transaction(conn: asyncpg.Connection) -> bool:
        return conn.is_in_transaction()

    await store.run(leave_open)
    assert await store.run(in_transaction) is False
