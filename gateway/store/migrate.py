"""Forward-only schema migrations: numbered `.sql` files applied once, in order.

Each file runs in its own transaction together with its `schema_migrations` row. A file
whose leading comment block holds `-- gateway: no-transaction` runs outside a transaction
(for `CREATE INDEX CONCURRENTLY`); such a file must hold exactly one statement, and should
be safe to re-run (`IF NOT EXISTS`), since it is recorded only after it has succeeded.
A session advisory lock serialises concurrent runners: the second waits, then finds nothing
pending.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

import gateway

from ..errors import GatewayError
from .hosts import Hosts
from .sql import migrate as sql

logger = logging.getLogger("gateway.migrate")

NO_TRANSACTION_MARKER = "-- gateway: no-transaction"
FILE_NAME_RE = re.compile(r"^(\d+)_[A-Za-z0-9_]+\.sql$")
# A fixed bigint key for pg_advisory_lock, shared by every process that migrates.
LOCK_KEY = zlib.crc32(b"claim-gateway.migrate")
# What `gateway migrate` waits for each host of DATABASE_URL to take its connection: a
# command an operator runs once can afford more than the server's pool
# (GATEWAY_DB_CONNECT_TIMEOUT_MS), and a dead host is still passed over.
CONNECT_TIMEOUT_SECONDS = 10.0


class MigrationError(GatewayError):
    """A migration file is malformed, was edited after being applied, or failed to run."""

    code = "migration_error"


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str
    checksum: str
    transactional: bool


def migrations_dir() -> Path:
    """The shipped migrations: inside the installed package, else the repo's `migrations/`."""
    packaged = Path(gateway.__file__).parent / "migrations"
    if packaged.is_dir():
        return packaged
    return Path(gateway.__file__).parent.parent / "migrations"


def _is_no_transaction(text: str) -> bool:
    """True when the leading comment block (before any SQL) carries the marker."""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            return False
        if stripped.lower() == NO_TRANSACTION_MARKER:
            return True
    return False


def _statement_count(text: str) -> int:
    """A loose count of `;`-separated statements, ignoring comment lines."""
    code = "\n".join(ln for ln in text.splitlines() if not ln.strip().startswith("--"))
    return sum(1 for part in code.split(";") if part.strip())


def _load_file(path: Path) -> Migration:
    match = FILE_NAME_RE.match(path.name)
    if match is None:
        raise MigrationError(
            f"migration file {path.name} is badly named; names must look like "
            f"0002_add_column.sql (a number, an underscore, letters, digits or underscores)"
        )
    data = path.read_bytes()
    text = data.decode("utf-8")
    transactional = not _is_no_transaction(text)
    if not transactional and _statement_count(text) > 1:
        raise MigrationError(
            f"migration {path.name} is marked '{NO_TRANSACTION_MARKER}' but holds more than "
            f"one statement; split it so that each such file holds exactly one statement"
        )
    return Migration(
        int(match.group(1)), path.name, text, hashlib.sha256(data).hexdigest(), transactional
    )


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Every `.sql` file of the directory, sorted by version; refuses bad names and duplicates."""
    directory = directory or migrations_dir()
    if not directory.is_dir():
        raise MigrationError(f"migrations directory {directory} does not exist")
    by_version: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        migration = _load_file(path)
        other = by_version.get(migration.version)
        if other is not None:
            raise MigrationError(
                f"migrations {other.name} and {migration.name} share the number "
                f"{migration.version}; each file needs a number of its own — renumber the "
                f"one that has not been applied yet"
            )
        by_version[migration.version] = migration
    return [by_version[v] for v in sorted(by_version)]


async def pending_migrations(
    conn: asyncpg.Connection, directory: Path | None = None, *, newer_applied_ok: bool = False
) -> list[Migration]:
    """Files not yet applied; refuses edited or missing files that were applied. With
    `newer_applied_ok`, migrations numbered above every file (a newer release's) pass."""
    migrations = load_migrations(directory)
    applied: dict[int, asyncpg.Record] = {}
    if await conn.fetchval(sql.MIGRATIONS_TABLE_EXISTS):
        applied = {row["version"]: row for row in await conn.fetch(sql.MIGRATIONS_SELECT_APPLIED)}
    files = {m.version: m for m in migrations}
    newest = max(files, default=0)
    for version, row in applied.items():
        migration = files.get(version)
        if migration is None and newer_applied_ok and version > newest:
            continue
        if migration is None:
            raise MigrationError(
                f"migration {row['name']} (number {version}) was applied to this database but "
                f"its file is missing; restore the file — applied migrations must not be removed"
            )
        if migration.checksum != row["checksum"]:
            raise MigrationError(
                f"migration {migration.name} was changed after it was applied (checksum "
                f"differs); forward-only migrations must not be edited — add a new file instead"
            )
    return [m for m in migrations if m.version not in applied]


async def _apply_one(conn: asyncpg.Connection, migration: Migration) -> None:
    """Run one file and record it; a transactional file leaves no trace when it fails."""
    record = (migration.version, migration.name, migration.checksum)
    try:
        if migration.transactional:
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(sql.MIGRATIONS_INSERT_APPLIED, *record)
        else:
            await conn.execute(migration.sql)
            await conn.execute(sql.MIGRATIONS_INSERT_APPLIED, *record)
    except asyncpg.LockNotAvailableError as exc:
        # The file's own lock_timeout: a long transaction holds a table it changes.
        raise MigrationError(
            f"migration {migration.name} could not lock a table in time ({exc}) and was not "
            "applied: a long-running transaction holds it; run the migration again, when "
            "that transaction has ended"
        ) from exc
    except asyncpg.PostgresError as exc:
        raise MigrationError(
            f"migration {migration.name} failed and was not recorded: "
            f"{type(exc).__name__}: {exc}; fix the file (it was never applied) and run again"
        ) from exc


async def apply_migrations(
    dsn: str,
    directory: Path | None = None,
    *,
    log: Callable[[str], None] | None = None,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
) -> list[Migration]:
    """Apply every pending migration under an advisory lock; returns those applied. Each
    host of a multi-host URL is given `connect_timeout_seconds` (hosts.py)."""
    log = log or logger.info
    conn = await Hosts(dsn, connect_timeout_seconds).connect()
    try:
        await conn.execute(sql.MIGRATIONS_LOCK, LOCK_KEY)
        try:
            await conn.execute(sql.MIGRATIONS_CREATE_TABLE)
            pending = await pending_migrations(conn, directory)
            for migration in pending:
                started = time.monotonic()
                await _apply_one(conn, migration)
                mode = "" if migration.transactional else " (outside a transaction)"
                log(
                    f"applied migration {migration.name}{mode} in {time.monotonic() - started:.2f}s"
                )
            return pending
        finally:
            # Closing the session releases the lock too, so a broken connection is no loss.
            with contextlib.suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.execute(sql.MIGRATIONS_UNLOCK, LOCK_KEY)
    finally:
        await conn.close()


async def schema_is_current(conn: asyncpg.Connection, directory: Path | None = None) -> bool:
    """True when every file is applied unchanged; False otherwise (never raises on that).

    Migrations of a newer release do not count against it: a release migrates before it
    rolls out, and the running (or rolled-back-to) release must stay ready meanwhile.
    Forward-only migrations keep the previous release working for that reason."""
    try:
        return not await pending_migrations(conn, directory, newer_applied_ok=True)
    except MigrationError:
        return False
