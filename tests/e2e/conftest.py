"""End-to-end fixtures: one gateway per test module, on the module's event loop.

Tests isolate by runtime id. A janitor pass touches the whole database, so tests check
the state of their own tasks, not the pass's counts. A module whose gateway needs other
settings says so by overriding `gateway_options` (or `served_options`), not by writing
its own `gw` (or `served`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from tests.support.browser import MISSING, chromium_missing
from tests.support.ci import unavailable
from tests.support.connections import Conn
from tests.support.gateways import Instance, Served, gateway, gateway_thread
from tests.support.logs import Records, server_records
from tests.support.openapi import OVERRIDES
from tests.support.redis_keys import new_prefix


@pytest.fixture(scope="module")
def gateway_options() -> dict[str, Any]:
    """The options of the module's `gw`: those of `gateway(...)` (settings and how its
    session connects). None by default."""
    return {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    database_url: str, redis_url: str, gateway_options: dict[str, Any]
) -> AsyncIterator[Instance]:
    """The module's gateway on the session's database, janitor quiet (see gateway())."""
    async with gateway(database_url, redis_url, **gateway_options) as inst:
        yield inst


@pytest_asyncio.fixture(loop_scope="module")
async def tcp(gw: Instance) -> AsyncIterator[Conn]:
    """A raw TCP connection to the module's gateway, closed after the test."""
    c = await Conn.open(gw.url)
    yield c
    c.close()


@pytest.fixture(scope="module")
def served_options() -> dict[str, Any]:
    """The settings of the module's `served` gateway: short long polls, janitor quiet."""
    return OVERRIDES


@pytest.fixture(scope="module")
def served(database_url: str, redis_url: str, served_options: dict[str, Any]) -> Iterator[Served]:
    """The module's gateway in a thread of its own, for synchronous clients (schemathesis,
    requests)."""
    with gateway_thread(
        database_url=database_url, redis_url=redis_url, prefix=new_prefix(), **served_options
    ) as served:
        yield served


@pytest.fixture
def server_logs() -> Iterator[Records]:
    """Every record the gateway's and uvicorn's loggers write during the test."""
    with server_records() as records:
        yield records


@pytest.fixture
def chromium() -> None:
    """Debian's Chromium for a browser test: missing, the test fails with CI=true and is
    skipped otherwise."""
    if chromium_missing():
        unavailable(MISSING)
