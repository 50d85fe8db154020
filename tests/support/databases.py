"""A database's schema and one-off queries on it, each on a connection of its own."""

from __future__ import annotations

from typing import Any

import asyncpg

from gateway.migrate import apply_migrations


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
