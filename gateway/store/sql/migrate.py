"""The statements of store/migrate.py: the `schema_migrations` table that records each
applied file, and the advisory lock that serialises concurrent runners.
"""

from __future__ import annotations

MIGRATIONS_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"

MIGRATIONS_SELECT_APPLIED = "SELECT version, name, checksum FROM schema_migrations ORDER BY version"

MIGRATIONS_INSERT_APPLIED = (
    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
)

MIGRATIONS_LOCK = "SELECT pg_advisory_lock($1)"

MIGRATIONS_UNLOCK = "SELECT pg_advisory_unlock($1)"
