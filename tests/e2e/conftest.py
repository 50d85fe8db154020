"""End-to-end fixtures: one gateway per test module, on the module's event loop."""

from __future__ import annotations

import pytest_asyncio

from tests.e2e.lifecycle_support import gateway


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(database_url, redis_url):
    async with gateway(database_url, redis_url) as inst:
        yield inst
