"""A database's schema and one-off queries on it, each on a connection of its own."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from gateway.store.migrate import apply_migrations


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


async def waiting_for_a_lock(conn: asyncpg.Connection, pid: int, within: float = 5.0) -> None:
    """Until the backend `pid` waits for a lock (another transaction holds its row),
    asked on `conn`: so a test knows the statement it started is blocked, not late."""
    deadline = time.monotonic() + within
    query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    while not await conn.fetchval(query, pid):
        assert time.monotonic() < deadline, f"backend {pid} never waited for a lock"
        await asyncio.sleep(0.01)
