"""The migration runner against a real Postgres, one empty database per test."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from gateway.store.migrate import (
    LOCK_KEY,
    MigrationError,
    apply_migrations,
    load_migrations,
    migrations_dir,
    pending_migrations,
    schema_is_current,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def conn(fresh_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Not the shared `conn` (tests/conftest.py): to the test's own empty database, which
    the test migrates."""
    connection = await asyncpg.connect(fresh_database_url)
    yield connection
    await connection.close()


def write(directory: Path, name: str, sql: str) -> Path:
    path = directory / name
    path.write_text(sql, encoding="utf-8")
    return path


async def table_exists(conn: asyncpg.Connection, name: str) -> bool:
    return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name))


async def applied_versions(conn: asyncpg.Connection) -> list[int]:
    rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    return [row["version"] for row in rows]


def test_migrations_dir_finds_the_repo_migrations() -> None:
    assert (migrations_dir() / "0001_tasks.sql").is_file()
    names = [m.name for m in load_migrations()]
    assert names[0] == "0001_tasks.sql"
    marked = {m.name for m in load_migrations() if not m.transactional}
    assert marked == {
        "0002_retention_index.sql",
        "0010_token_listing_index.sql",
        "0016_ended_badly_index.sql",
    }


async def test_applies_shipped_migrations_once(
    fresh_database_url: str, conn: asyncpg.Connection
) -> None:
    messages: list[str] = []
    applied = await apply_migrations(fresh_database_url, log=messages.append)

    shipped = load_migrations()
    assert [m.name for m in applied] == [m.name for m in shipped]
    assert await table_exists(conn, "tasks")
    rows = await conn.fetch("SELECT version, name, checksum FROM schema_migrations")
    assert {(r["version"], r["name"], r["checksum"]) for r in rows} == {
        (m.version, m.name, m.checksum) for m in shipped
    }
    tasks_sql = (migrations_dir() / "0001_tasks.sql").read_bytes()
    assert shipped[0].checksum == hashlib.sha256(tasks_sql).hexdigest()
    assert len(messages) == len(shipped)
    assert "0001_tasks.sql" in messages[0]

    assert await apply_migrations(fresh_database_url) == []


async def test_schema_is_current_before_and_after(
    fresh_database_url: str, conn: asyncpg.Connection
) -> None:
    assert await schema_is_current(conn) is False  # no schema_migrations table yet
    await apply_migrations(fresh_database_url)
    assert await schema_is_current(conn) is True


async def test_pending_lists_only_unapplied_files(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    write(tmp_path, "0001_first.sql", "CREATE TABLE first (id int);")
    assert [m.name for m in await pending_migrations(conn, tmp_path)] == ["0001_first.sql"]
    await apply_migrations(fresh_database_url, tmp_path)
    assert await pending_migrations(conn, tmp_path) == []

    write(tmp_path, "0002_second.sql", "CREATE TABLE second (id int);")
    write(tmp_path, "10_third.sql", "CREATE TABLE third (id int);")
    write(tmp_path, "README.md", "not a migration")
    pending = await pending_migrations(conn, tmp_path)
    assert [(m.version, m.name) for m in pending] == [(2, "0002_second.sql"), (10, "10_third.sql")]
    assert await schema_is_current(conn, tmp_path) is False

    assert [m.version for m in await apply_migrations(fresh_database_url, tmp_path)] == [2, 10]
    assert await applied_versions(conn) == [1, 2, 10]


async def test_duplicate_numbers_refused(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE a (id int);")
    write(tmp_path, "1_b.sql", "CREATE TABLE b (id int);")
    with pytest.raises(MigrationError) as caught:
        await apply_migrations(fresh_database_url, tmp_path)
    assert "0001_a.sql" in caught.value.detail and "1_b.sql" in caught.value.detail
    assert caught.value.code == "migration_error"
    assert not await table_exists(conn, "a")
    assert not await table_exists(conn, "b")


@pytest.mark.parametrize("name", ["0003-add-x.sql", "add_x.sql", "0003_add x.sql", "0003.sql"])
def test_badly_named_file_refused(tmp_path: Path, name: str) -> None:
    write(tmp_path, "0001_ok.sql", "SELECT 1;")
    write(tmp_path, name, "SELECT 1;")
    with pytest.raises(MigrationError, match=name):
        load_migrations(tmp_path)


async def test_changed_checksum_refused_and_nothing_applied(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    first = write(tmp_path, "0001_first.sql", "CREATE TABLE first (id int);")
    await apply_migrations(fresh_database_url, tmp_path)
    first.write_text("CREATE TABLE first (id bigint);", encoding="utf-8")
    write(tmp_path, "0002_second.sql", "CREATE TABLE second (id int);")

    with pytest.raises(MigrationError, match=r"0001_first\.sql was changed after it was applied"):
        await apply_migrations(fresh_database_url, tmp_path)
    assert not await table_exists(conn, "second")
    assert await applied_versions(conn) == [1]
    assert await schema_is_current(conn, tmp_path) is False


async def test_applied_file_missing_refused(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    first = write(tmp_path, "0001_first.sql", "CREATE TABLE first (id int);")
    await apply_migrations(fresh_database_url, tmp_path)
    first.unlink()
    write(tmp_path, "0002_second.sql", "CREATE TABLE second (id int);")
    with pytest.raises(MigrationError, match=r"0001_first\.sql .* file is missing"):
        await pending_migrations(conn, tmp_path)
    assert await schema_is_current(conn, tmp_path) is False


async def test_newer_release_migrations_keep_the_running_release_ready(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    # A deployment migrates before its rollout: the pods still running the previous
    # release (and a rollback to it) must stay ready with the newer schema.
    write(tmp_path, "0001_first.sql", "CREATE TABLE first (id int);")
    newer = write(tmp_path, "0002_second.sql", "CREATE TABLE second (id int);")
    await apply_migrations(fresh_database_url, tmp_path)
    newer.unlink()
    assert await schema_is_current(conn, tmp_path) is True
    # `gateway migrate` of the older release still says what is odd about the database.
    with pytest.raises(MigrationError, match=r"0002_second\.sql .* file is missing"):
        await pending_migrations(conn, tmp_path)


async def test_no_transaction_file_runs_outside_a_transaction(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    write(tmp_path, "0001_table.sql", "CREATE TABLE items (id int, label text);")
    write(
        tmp_path,
        "0002_index.sql",
        "-- Build the index without blocking writes.\n"
        "-- gateway: no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS items_label_idx ON items (label);\n",
    )
    migrations = load_migrations(tmp_path)
    assert [m.transactional for m in migrations] == [True, False]

    applied = await apply_migrations(fresh_database_url, tmp_path)
    assert [m.version for m in applied] == [1, 2]
    valid = await conn.fetchval(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('items_label_idx')"
    )
    assert valid is True
    assert await applied_versions(conn) == [1, 2]


def test_no_transaction_file_with_two_statements_refused(tmp_path: Path) -> None:
    write(
        tmp_path,
        "0001_two.sql",
        "-- gateway: no-transaction\n"
        "CREATE INDEX CONCURRENTLY a_idx ON a (x);\n"
        "CREATE INDEX CONCURRENTLY b_idx ON b (x);\n",
    )
    with pytest.raises(MigrationError, match=r"0001_two\.sql .* more than one statement"):
        load_migrations(tmp_path)


def test_marker_only_counts_in_the_leading_comments(tmp_path: Path) -> None:
    write(tmp_path, "0001_late.sql", "SELECT 1;\n-- gateway: no-transaction\nSELECT 2;\n")
    assert load_migrations(tmp_path)[0].transactional is True


async def test_failing_transactional_file_leaves_no_trace(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    write(tmp_path, "0001_ok.sql", "CREATE TABLE ok (id int);")
    write(tmp_path, "0002_broken.sql", "CREATE TABLE broken (id int);\nSELECT 1 / 0;\n")
    write(tmp_path, "0003_later.sql", "CREATE TABLE later (id int);")

    with pytest.raises(MigrationError, match=r"0002_broken\.sql failed") as caught:
        await apply_migrations(fresh_database_url, tmp_path)
    assert isinstance(caught.value.__cause__, asyncpg.DivisionByZeroError)
    assert await table_exists(conn, "ok")
    assert not await table_exists(conn, "broken")
    assert not await table_exists(conn, "later")
    assert await applied_versions(conn) == [1]
    assert [m.name for m in await pending_migrations(conn, tmp_path)] == [
        "0002_broken.sql",
        "0003_later.sql",
    ]
    # The advisory lock was released: another session can take it at once.
    assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY) is True
    await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)


async def test_concurrent_runs_apply_each_file_once(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    # Fails if run twice: no IF NOT EXISTS, and the sleep widens the race window.
    write(tmp_path, "0001_slow.sql", "CREATE TABLE slow (id int);\nSELECT pg_sleep(0.3);\n")
    write(tmp_path, "0002_next.sql", "CREATE TABLE next_one (id int);")

    results = await asyncio.gather(
        apply_migrations(fresh_database_url, tmp_path),
        apply_migrations(fresh_database_url, tmp_path),
    )
    counts = sorted(len(applied) for applied in results)
    assert counts == [0, 2]
    assert await applied_versions(conn) == [1, 2]
    assert await schema_is_current(conn, tmp_path) is True


async def test_time_ordered_ids_give_up_on_a_held_table_and_apply_later(
    fresh_database_url: str, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    """Migration 0009 waits at most its lock_timeout (5 s) for the task table, so that
    enqueues and claims do not queue behind it while a long transaction holds the table;
    it fails with nothing applied, and applies once the table is free."""
    shipped = load_migrations()
    for m in shipped:
        if m.version < 9:
            write(tmp_path, m.name, m.sql)
    await apply_migrations(fresh_database_url, tmp_path, log=lambda _m: None)
    holder = await asyncpg.connect(fresh_database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("LOCK TABLE tasks IN ACCESS SHARE MODE")  # as a long read does
        # Without its lock_timeout the migration would wait as long as the holder does.
        with pytest.raises(MigrationError, match="could not lock a table in time") as caught:
            await asyncio.wait_for(apply_migrations(fresh_database_url, log=lambda _m: None), 30)
        assert "0009_time_ordered_task_ids.sql" in str(caught.value)
        assert 9 not in await applied_versions(conn)
        await transaction.rollback()
    finally:
        await holder.close()
    applied = await apply_migrations(fresh_database_url, log=lambda _m: None)
    # 0009 and the migrations after it, which wait for it.
    assert [m.version for m in applied] == [m.version for m in load_migrations() if m.version >= 9]
