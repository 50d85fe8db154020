"""Databases for the tests: made and dropped on a Postgres server, migrated, and
queried one-off, each query on a connection of its own (or, `rows`, through a running
gateway's own pool)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from bench.infra import create_database, drop_database
from gateway.store.migrate import apply_migrations

if TYPE_CHECKING:
    from tests.support.gateways import Instance


@contextlib.asynccontextmanager
async def temporary_database(
    admin_url: str, prefix: str = "gwtest_", *, migrated: bool = True
) -> AsyncIterator[str]:
    """A new database (migrated unless `migrated` is false) for the block; dropped after."""
    url = await create_database(admin_url, prefix)
    try:
        if migrated:
            await migrate(url)
        yield url
    finally:
        await drop_database(admin_url, url)


@contextlib.contextmanager
def temporary_database_sync(admin_url: str, *, migrated: bool = True) -> Iterator[str]:
    """temporary_database for callers outside any event loop: the session-, module- and
    function-scoped database fixtures, which pytest runs synchronously."""
    url = asyncio.run(create_database(admin_url))
    try:
        if migrated:
            asyncio.run(migrate(url))
        yield url
    finally:
        asyncio.run(drop_database(admin_url, url))


async def migrate(url: str) -> str:
    """Apply the schema to an empty database; returns the URL."""
    await apply_migrations(url, log=lambda _line: None)
    return url


async def execute(url: str, query: str, *args: Any) -> str:
    conn = await asyncpg.connect(url)
    try:
        return await conn.execute(query, *args)
    finally:
        await conn.close()


async def fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def rows(inst: Instance, query: str, *args: Any) -> list[dict[str, Any]]:
    """Rows straight from Postgres, through the instance's own pool; jsonb values (which
    the pool hands over as orjson.Fragment, comparable only by identity) as their text."""
    found = await inst.gateway.store.run(lambda c: c.fetch(query, *args))
    return [
        {k: orjson.dumps(v) if isinstance(v, orjson.Fragment) else v for k, v in r.items()}
        for r in found
    ]


async def waiting_for_a_lock(conn: asyncpg.Connection, pid: int, within: float = 5.0) -> None:
    """Until the backend `pid` waits for a lock (another transaction holds its row),
    asked on `conn`: so a test knows the statement it started is blocked, not late."""
    deadline = time.monotonic() + within
    query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    while not await conn.fetchval(query, pid):
        assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
        await asyncio.sleep(0.01)
