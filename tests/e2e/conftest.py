"""End-to-end fixtures: one gateway per test module, on the module's event loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_asyncio

from tests.e2e.lifecycle_support import gateway
from tests.support.logs import Records, server_records


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(database_url, redis_url):
    async with gateway(database_url, redis_url) as inst:
        yield inst


@pytest.fixture
def server_logs() -> Iterator[Records]:
    """Every record the gateway's and uvicorn's loggers write during the test."""
    with server_records() as records:
        yield records
