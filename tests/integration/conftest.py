"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.store import Store
from tests.support.databases import execute, temporary_database_sync
from tests.support.stores import open_store


@pytest.fixture(scope="module")
def module_database_url(pg_admin_url: str) -> Iterator[str]:
    """A migrated database for one test module (its data loaded once, as the EXPLAIN
    tests load theirs), dropped after it."""
    with temporary_database_sync(pg_admin_url) as url:
        yield url


@pytest.fixture
async def store(database_url: str, runtime_id: str) -> AsyncIterator[Store]:
    """A Store on the session's shared database over one connection, so that a query
    logger on it sees every statement sent; the rows of runtimes named `runtime_id`...
    are deleted afterwards."""
    async with open_store(database_url) as opened:
        yield opened
    await execute(database_url, "DELETE FROM tasks WHERE runtime_id LIKE $1", runtime_id + "%")
