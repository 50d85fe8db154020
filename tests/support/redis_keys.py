"""Redis key prefixes of the tests' own: every gateway a test starts keeps its keys
under a prefix nobody else uses, so that tests never see each other's keys, and the
keys of every prefix handed out are deleted at the end of the session."""

from __future__ import annotations

import secrets

import redis.asyncio as aioredis

# The prefixes handed out in this session (this process), whose keys go at its end.
PREFIXES: set[str] = set()


def new_prefix() -> str:
    """A fresh `gwt<hex>` prefix, remembered for forget_keys."""
    prefix = "gwt" + secrets.token_hex(4)
    PREFIXES.add(prefix)
    return prefix


async def forget_keys(url: str, prefixes: set[str]) -> None:
    """Deletes the keys of these prefixes. Version keys live for days, so a shared Redis
    would gather them run after run, and every SCAN would slow down."""
    client = aioredis.Redis.from_url(url, socket_timeout=10)
    try:
        doomed = [
            key
            async for key in client.scan_iter(match="gwt*", count=1000)
            if key.split(b":", 1)[0].decode() in prefixes
        ]
        for start in range(0, len(doomed), 1000):
            await client.delete(*doomed[start : start + 1000])
    finally:
        await client.aclose()
