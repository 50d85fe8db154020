"""Databases for the tests: made and dropped on a Postgres server, migrated, and
queried one-off, each query on a connection of its own (or, `rows`, through a running
gateway's own pool)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import orjson

from gateway.store.migrate import apply_migrations

if TYPE_CHECKING:
    from tests.support.gateways import Instance


def with_database(url: str, name: str) -> str:
    """`url` (a Postgres URL) naming the database `name` instead of its own."""
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


async def create_database(admin_url: str, prefix: str = "gwtest_") -> str:
    """A new empty database `<prefix><random>` on the server of `admin_url` (whose role
    may create databases); returns its URL."""
    name = prefix + secrets.token_hex(6)
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(admin_url, name)


async def drop_database(admin_url: str, url: str) -> None:
    """Drops the database of `url`, through `admin_url`, whoever is still connected."""
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


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
