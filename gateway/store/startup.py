"""What `gateway serve` asks Postgres before it starts: does it answer (and if not, why,
in a few words), and is its schema the one this release needs. The schema is read as
`gateway doctor` reads it (probe.schema_state).

One connection of its own, opened and closed here, before any pool: a start that cannot
go on must say why in one line, and the driver's errors stop in this package.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg

from ..errors import ConfigError, SchemaNotCurrent, Unreachable
from .base import DRIVER_ERRORS
from .hosts import Hosts, reason
from .migrate import FILE_NAME_RE, Migration, MigrationError, apply_migrations
from .probe import SchemaState, close_quietly, schema_state

DEFAULT_PORT = 5432
MIGRATE_HINT = "run `gateway migrate` (or start with `gateway serve --migrate`), then start again"


def version(name: str) -> int:
    """A migration file's number, from its name (0005_runtime_counts.sql: 5)."""
    match = FILE_NAME_RE.match(name)
    return int(match.group(1)) if match else 0


def current(schema: SchemaState) -> int:
    """The newest applied migration's number; 0 when none is."""
    return max((version(name) for name in schema.applied), default=0)


def newest_shipped(schema: SchemaState) -> int:
    return max((m.version for m in schema.shipped), default=0)


def location(dsn: str) -> str:
    """Where a Postgres URL points, for people: `database NAME at HOST:PORT`, without
    the user or password."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    hosts = parts.netloc.rsplit("@", 1)[-1] or query.get("host", "") or "localhost"
    if hosts.startswith("/"):
        where = f"the socket in {hosts}"
    elif "," in hosts or hosts.endswith("]") or hosts.rsplit(":", 1)[-1].isdigit():
        where = hosts  # several hosts, each with its port, or one with its port already
    else:
        where = f"{hosts}:{query.get('port', DEFAULT_PORT)}"
    database = unquote(parts.path.lstrip("/")) or query.get("dbname", "")
    return f"database {database} at {where}" if database else where


def server(dsn: str) -> str:
    """`Postgres at HOST:PORT`: the server alone, for messages about reaching it."""
    return "Postgres at " + location(dsn).rsplit(" at ", 1)[-1]


def _unreachable(what: str, dsn: str, exc: BaseException, timeout_seconds: float) -> Unreachable:
    """Unreachable for the server of `dsn`: `what` (with `{server}` in it), then why."""
    why = reason(exc, timeout_seconds)
    return Unreachable(f"{what.format(server=server(dsn))}: {why}", reason=why, server=server(dsn))


async def connect(
    dsn: str, timeout_seconds: float, host_timeout_seconds: float | None = None
) -> asyncpg.Connection:
    """A connection of its own within `timeout_seconds`, each host of a multi-host URL
    given `host_timeout_seconds` at most (hosts.py); raises Unreachable naming the
    server and why, or ConfigError for a URL the driver cannot read."""
    per_host = min(timeout_seconds, host_timeout_seconds or timeout_seconds)
    try:
        # No statement cache: the probe may pass through a transaction pooler.
        conn: asyncpg.Connection = await asyncio.wait_for(
            Hosts(dsn, per_host, timeout_seconds).connect(statement_cache_size=0),
            timeout_seconds,
        )
        return conn
    except (asyncpg.ClientConfigurationError, ValueError) as exc:
        raise ConfigError(f"DATABASE_URL cannot be read: {exc}") from exc
    except DRIVER_ERRORS as exc:
        raise _unreachable("cannot connect to {server}", dsn, exc, timeout_seconds) from exc


async def probe(
    dsn: str, timeout_seconds: float, host_timeout_seconds: float | None = None
) -> SchemaState:
    """Connect (as `connect`), read the schema, close: raises Unreachable, ConfigError,
    or SchemaNotCurrent for an applied migration edited or removed since; pending
    migrations are the caller's to judge (`require_current`)."""
    conn = await connect(dsn, timeout_seconds, host_timeout_seconds)
    try:
        # Bounded too: through PgBouncer a stopped Postgres accepts the login and then
        # keeps the first query waiting (query_wait_timeout, 120 s by default).
        return await asyncio.wait_for(schema_state(conn), timeout_seconds)
    except MigrationError as exc:
        raise SchemaNotCurrent(exc.detail) from exc
    except DRIVER_ERRORS as exc:
        raise _unreachable(
            "{server} failed while its schema was read", dsn, exc, timeout_seconds
        ) from exc
    finally:
        await close_quietly(conn)


def require_current(dsn: str, schema: SchemaState) -> None:
    """Raises SchemaNotCurrent when migrations of this release are pending; its detail
    is two lines, the state and the fix."""
    if not schema.pending:
        return
    where = location(dsn)
    names = ", ".join(m.name for m in schema.pending)
    hint = MIGRATE_HINT
    if not schema.applied:
        state = f"{where} has no claim-gateway schema"
    elif schema.newer:  # a newer release migrated it, yet some of this one's are missing
        state = (
            f"{where} is at migration {current(schema):04d}, newer than this release, but "
            f"lacks some of this release's (pending: {names})"
        )
        # This release's `gateway migrate` refuses migrations it does not know.
        hint = "run `gateway migrate` of the newest release, which knows them all"
    else:
        state = (
            f"{where} is at migration {current(schema):04d} of {newest_shipped(schema):04d} "
            f"(pending: {names})"
        )
    raise SchemaNotCurrent(f"{state}\n{hint}", state=state)


def newer_warning(dsn: str, schema: SchemaState) -> str | None:
    """The warning for a schema newer than this release (after a rollback), else None."""
    if not schema.newer:
        return None
    return (
        f"{location(dsn)} is at migration {current(schema):04d} ({schema.newer[-1]}), newer "
        f"than this release, which knows up to {newest_shipped(schema):04d}: starting "
        "anyway, as after a rollback (a migration keeps the release before it working)"
    )


async def apply(
    dsn: str, timeout_seconds: float, host_timeout_seconds: float | None = None
) -> list[Migration]:
    """`gateway serve --migrate`: apply what is pending (migrate.apply_migrations),
    with its failures as start-up errors: Unreachable, or SchemaNotCurrent for a
    migration that failed or a file that was edited."""
    # Says why it cannot, within the timeout.
    conn = await connect(dsn, timeout_seconds, host_timeout_seconds)
    await conn.close()
    per_host = min(timeout_seconds, host_timeout_seconds or timeout_seconds)
    try:
        return await apply_migrations(dsn, connect_timeout_seconds=per_host)
    except MigrationError as exc:
        raise SchemaNotCurrent(exc.detail) from exc
    except DRIVER_ERRORS as exc:
        raise _unreachable("{server} failed while migrating", dsn, exc, timeout_seconds) from exc
