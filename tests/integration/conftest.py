"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.store import Store
from tests.support.databases import execute
from tests.support.stores import open_store


@pytest.fixture
async def store(database_url: str, runtime_id: str) -> AsyncIterator[Store]:
    """A Store on the session's shared database over one connection, so that a query
    logger on it sees every statement sent; the rows of runtimes named `runtime_id`...
    are deleted afterwards."""
    async with open_store(database_url) as opened:
        yield opened
    await execute(database_url, "DELETE FROM tasks WHERE runtime_id LIKE $1", runtime_id + "%")
