"""Questions `gateway doctor` asks a Postgres server: its version, the schema's
migrations, whether a transaction pooler stands between, and its clock. Each opens and
closes its own connections; none writes anything."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from .base import DRIVER_ERRORS
from .hosts import Hosts, reason
from .migrate import Migration, load_migrations, pending_migrations
from .sql import migrate as migrate_sql
from .sql import probe as sql

T = TypeVar("T")

# What a probe waits for a connection or a statement, in seconds: long enough for a
# server across a slow link, short enough that a firewall that drops packets is named
# within seconds rather than after the kernel's TCP timeout.
PROBE_TIMEOUT_SECONDS = 5.0


class ProbeFailed(Exception):
    """Postgres could not be reached or refused a statement; the text says why."""


@functools.lru_cache(maxsize=8)
def _hosts(url: str) -> Hosts:
    """The walk over `url`'s hosts, each within the timeout (hosts.py), shared by the
    probes of one run: a host that does not answer costs its timeout once, not once
    per question."""
    return Hosts(url, PROBE_TIMEOUT_SECONDS)


async def connect(url: str) -> asyncpg.Connection:
    """A connection with no prepared-statement cache, so that it works through any
    pooler; raises ProbeFailed with the driver's reason."""
    try:
        return await _hosts(url).connect(
            statement_cache_size=0,
            server_settings={"application_name": "claim-gateway-doctor"},
        )
    except (*DRIVER_ERRORS, ValueError) as exc:
        raise ProbeFailed(reason(exc, PROBE_TIMEOUT_SECONDS)) from exc


async def bounded(awaitable: Awaitable[T]) -> T:
    """`awaitable` within PROBE_TIMEOUT_SECONDS; a driver's error or the timeout becomes
    ProbeFailed with its reason. Other errors (MigrationError) pass through."""
    try:
        return await asyncio.wait_for(awaitable, PROBE_TIMEOUT_SECONDS)
    except DRIVER_ERRORS as exc:
        raise ProbeFailed(reason(exc, PROBE_TIMEOUT_SECONDS)) from exc


async def server_version(conn: asyncpg.Connection) -> str:
    """The server's version, as `SHOW server_version` gives it ("15.19 (Debian ...)")."""
    return str(await conn.fetchval(sql.PROBE_SERVER_VERSION, timeout=PROBE_TIMEOUT_SECONDS))


@dataclass(frozen=True)
class SchemaState:
    """The database's migrations against the ones this gateway ships."""

    shipped: list[Migration]
    applied: list[str]  # names, in order
    pending: list[Migration]
    newer: list[str]  # applied by a newer release: numbered above every shipped file

    @property
    def empty(self) -> bool:
        """No claim-gateway migration was ever applied here."""
        return not self.applied


async def schema_state(conn: asyncpg.Connection) -> SchemaState:
    """Reads `schema_migrations`; raises MigrationError when an applied file was edited
    or is missing (the text says which)."""
    shipped = load_migrations()
    pending = await pending_migrations(conn, newer_applied_ok=True)
    rows = []
    if await conn.fetchval(migrate_sql.MIGRATIONS_TABLE_EXISTS):
        rows = await conn.fetch(migrate_sql.MIGRATIONS_SELECT_APPLIED)
    newest = max((m.version for m in shipped), default=0)
    return SchemaState(
        shipped=shipped,
        applied=[row["name"] for row in rows],
        pending=pending,
        newer=[row["name"] for row in rows if row["version"] > newest],
    )


@dataclass(frozen=True)
class Pooling:
    """What stands between this process and the Postgres backend."""

    # The server saw another client port than the one this process opened: a pooler or
    # a TCP proxy sits between (None: a unix socket, nothing to compare).
    proxied: bool | None
    # Two client connections were served by one backend: a transaction (or statement)
    # pooler, which moves a client between server connections at each transaction.
    shares_backends: bool


async def pooling(url: str, attempts: int = 3) -> Pooling:
    """Opens two connections. The first ends a transaction and sits idle; the second
    then starts one. A transaction pooler hands the second the server connection the
    first just gave back (PgBouncer reuses the most recently released one), which a
    direct connection never does: two clients, one backend pid. Under load another
    client may take that server connection first, so up to `attempts` tries."""
    first = await connect(url)
    try:
        seen_port = await first.fetchval(sql.PROBE_CLIENT_PORT, timeout=PROBE_TIMEOUT_SECONDS)
        sockname = first._transport.get_extra_info("sockname")
        own_port = sockname[1] if isinstance(sockname, tuple) else None
        second = await connect(url)
        try:
            shared = False
            for _ in range(attempts):
                pid = await first.fetchval(sql.PROBE_BACKEND_PID, timeout=PROBE_TIMEOUT_SECONDS)
                async with second.transaction():
                    other = await second.fetchval(
                        sql.PROBE_BACKEND_PID, timeout=PROBE_TIMEOUT_SECONDS
                    )
                if shared := other == pid:
                    break
        finally:
            await second.close()
    except DRIVER_ERRORS as exc:
        raise ProbeFailed(reason(exc, PROBE_TIMEOUT_SECONDS)) from exc
    finally:
        await first.close()
    proxied = None if own_port is None or seen_port is None else seen_port != own_port
    return Pooling(proxied=proxied, shares_backends=shared)


async def clock_offset_seconds(conn: asyncpg.Connection) -> float:
    """Postgres's clock minus this host's, in seconds, read at the middle of one round
    trip (so within half of it)."""
    before = time.time()
    theirs = float(await conn.fetchval(sql.PROBE_CLOCK, timeout=PROBE_TIMEOUT_SECONDS))
    after = time.time()
    return theirs - (before + after) / 2


async def close_quietly(conn: asyncpg.Connection) -> None:
    """Close, or abandon a connection that no longer answers."""
    try:
        await asyncio.wait_for(conn.close(), PROBE_TIMEOUT_SECONDS)
    except DRIVER_ERRORS:
        conn.terminate()
