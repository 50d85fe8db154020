"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.support.databases import migrate


@pytest.fixture
async def own_database_url(fresh_database_url: str) -> str:
    """A freshly migrated database of the test's own (see janitor_support)."""
    return await migrate(fresh_database_url)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the session's shared database, closed after the test."""
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()
