"""Pooled connections that keep prepared statements run each one's generic plan
(store/sql/base.py, KEEP_GENERIC_PLANS): once the task table has statistics, Postgres
left to itself plans the claim afresh on every execution, and the planning cost more
than the claim. Behind a transaction pooler (the statement cache off) nothing is set.

Runs on a database of its own (the ANALYZE below would touch every other test's rows).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.metrics import Metrics
from gateway.store import Store
from gateway.store.sql import leases as lease_sql
from tests.support.databases import execute

pytestmark = pytest.mark.integration

RUNTIME = "plans"
EXECUTIONS = 8  # past the five custom plans Postgres tries before it may settle
BACKLOG = """
INSERT INTO tasks (runtime_id, payload, created_at)
SELECT $1, jsonb_build_object('n', n), now() - interval '1 hour' + make_interval(secs => n)
  FROM generate_series(1, 5000) AS n
"""
PLANS = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1"


@pytest.fixture(scope="module")
def analyzed(module_database_url: str) -> str:
    """A database whose task table holds a runtime's backlog, with statistics on it."""
    asyncio.run(execute(module_database_url, BACKLOG, RUNTIME))
    asyncio.run(execute(module_database_url, "ANALYZE tasks"))
    return module_database_url


async def _opened(url: str, cache_size: int) -> AsyncIterator[Store]:
    store = Store(url, Metrics(), min_size=1, max_size=1, statement_cache_size=cache_size)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def keeping(analyzed: str) -> AsyncIterator[Store]:
    """The gateway's Store as configured by default (statement cache on), one connection."""
    async for store in _opened(analyzed, 100):
        yield store


async def _claims_then_plans(store: Store) -> tuple[int, int]:
    """Claims one task EXECUTIONS times on the store's one connection, giving each back;
    then how often the claim statement ran a generic plan and a custom one there."""
    for _ in range(EXECUTIONS):
        rows, _ = await store.claim(RUNTIME, ["w"], [60.0])
        assert len(rows) == 1
        await store.unclaim([rows[0].task.id], [rows[0].task.lease_id])
    row = await store.run(lambda c: c.fetchrow(PLANS, lease_sql.CLAIM))
    assert row is not None, "the claim statement is not prepared on the pooled connection"
    return row["generic_plans"], row["custom_plans"]


async def test_the_claim_runs_its_generic_plan_on_a_table_with_statistics(
    keeping: Store,
) -> None:
    assert await store_plan_mode(keeping) == "force_generic_plan"
    generic, custom = await _claims_then_plans(keeping)
    assert (generic, custom) == (EXECUTIONS, 0)


async def test_left_to_itself_postgres_plans_the_claim_on_every_execution(
    keeping: Store,
) -> None:
    """Why the setting is there: with the mode Postgres defaults to, the same claims on
    the same table ran a custom plan each, planned at every execution."""

    async def auto(conn: asyncpg.Connection) -> None:
        await conn.execute("SET plan_cache_mode = auto")

    await keeping.run(auto)
    try:
        generic, custom = await _claims_then_plans(keeping)
    finally:
        await keeping.run(lambda c: c.execute("SET plan_cache_mode = force_generic_plan"))
    assert (generic, custom) == (0, EXECUTIONS)


async def test_nothing_is_set_when_the_statement_cache_is_off(analyzed: str) -> None:
    """Behind a transaction pooler (GATEWAY_DB_STATEMENT_CACHE_SIZE=0) a session SET
    would stay on a server connection other clients share: the mode stays Postgres's."""
    async for store in _opened(analyzed, 0):
        assert await store_plan_mode(store) == "auto"


async def store_plan_mode(store: Store) -> str:
    mode: str = await store.run(lambda c: c.fetchval("SHOW plan_cache_mode"))
    return mode
