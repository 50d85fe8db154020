"""`gateway doctor` against real servers in real trouble: Postgres and Redis that cannot
be reached, databases never migrated, half migrated, migrated by a newer release or with
an edited migration, a transaction pooler (PgBouncer) in front, Redis that refuses
writes when full, refuses CONFIG, or refuses pub/sub to its user, and admin tokens that
look typed. Most run the checks in the test's process; two run the real command for its
exit codes and output."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.cli.doctor import diagnose, exit_code, render
from gateway.store.migrate import apply_migrations, migrations_dir
from tests.support.databases import execute
from tests.support.net import free_port
from tests.support.pgbouncer import PgBouncer
from tests.support.redis_servers import RedisServer, redis_cli

TOKEN = secrets.token_urlsafe(32)


def doctor_env(database_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GATEWAY_ADMIN_TOKEN": TOKEN,
        "GATEWAY_REDIS_PREFIX": "gwtest-doctor-" + secrets.token_hex(4),
        **extra,
    }


async def report(env: dict[str, str]) -> tuple[list[str], int]:
    findings = await diagnose(env)
    return render(findings).splitlines(), exit_code(findings)


def line(lines: list[str], start: str) -> str:
    """The one line of the report that starts with `start` (a mark and a check's name)."""
    found = [text for text in lines if text.startswith(start)]
    assert len(found) == 1, f"{start!r} in:\n" + "\n".join(lines)
    return found[0]


def after(lines: list[str], start: str) -> list[str]:
    """The explanation lines under the line starting with `start`."""
    index = lines.index(line(lines, start))
    rest = []
    for text in lines[index + 1 :]:
        if not text.startswith("    "):
            break
        rest.append(text.strip())
    return rest


def database_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def run_doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).with_name("gateway")
    return subprocess.run(
        [str(binary), "doctor"],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONIOENCODING": "utf-8", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_sound_setup_passes_every_check_and_masks_its_secrets(
    database_url: str, redis_url: str
) -> None:
    with_password = database_url.replace("://postgres@", "://postgres:s3cret-pw@", 1)
    assert "s3cret-pw" in with_password, "the test database URL names user postgres"
    done = run_doctor(doctor_env(with_password, redis_url))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    checks = [text for text in lines if not text.startswith("    ")]
    assert all(text.startswith("✓ ") for text in checks[:-1]), done.stdout
    assert checks[-1] == "every check passed"
    assert line(lines, "✓ settings: valid; 4 set")
    assert f"    DATABASE_URL={with_password.replace('s3cret-pw', '***')}" in lines
    assert f"    GATEWAY_ADMIN_TOKEN=*** ({len(TOKEN)} characters)" in lines
    assert "s3cret-pw" not in done.stdout and TOKEN not in done.stdout
    assert line(lines, "✓ Postgres ").endswith(")")
    assert line(lines, "✓ schema: current, ")
    assert line(lines, "✓ pooler: none; DATABASE_URL reaches Postgres directly")
    assert line(lines, "✓ Redis pub/sub: a publish came back in ")
    assert line(lines, "✓ clock: Postgres is ")
    assert line(lines, "✓ clock: Redis is ")
    assert line(lines, f"✓ admin token: {len(TOKEN)} characters, about ")


def test_servers_that_cannot_be_reached_fail_with_exit_1() -> None:
    pg_port, redis_port = free_port(), free_port()
    done = run_doctor(
        doctor_env(
            f"postgresql://postgres@127.0.0.1:{pg_port}/gateway",
            f"redis://127.0.0.1:{redis_port}/0",
        )
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert line(lines, f"✗ Postgres at 127.0.0.1:{pg_port} cannot be reached: ") == (
        f"✗ Postgres at 127.0.0.1:{pg_port} cannot be reached: connection refused"
    )
    assert after(lines, "✗ Postgres at") == [
        "check DATABASE_URL, that the server is up, and that it accepts this host"
    ]
    assert line(lines, "✗ Redis at") == (
        f"✗ Redis at 127.0.0.1:{redis_port} (standalone mode) cannot be reached: connection refused"
    )
    assert after(lines, "✗ Redis at") == [
        "the gateway still starts and serves, but every empty poll then reads Postgres, "
        "and new tasks wake parked polls late"
    ]
    # Nothing is checked on a server that was not reached.
    assert not any(text.startswith(("✓ schema", "✗ schema", "✓ pooler")) for text in lines)
    assert lines[-1] == "2 problems, 0 warnings"


async def test_a_database_never_migrated_is_named_with_the_command_that_fixes_it(
    fresh_database_url: str, redis_url: str
) -> None:
    lines, code = await report(doctor_env(fresh_database_url, redis_url))
    assert code == 1
    assert line(lines, "✗ schema") == (
        f"✗ schema: database {database_of(fresh_database_url)} has no claim-gateway schema: "
        "run `gateway migrate` (or start with `gateway serve --migrate`)"
    )


async def test_a_half_migrated_database_names_the_pending_migrations(
    fresh_database_url: str, redis_url: str, tmp_path: Path
) -> None:
    shipped = sorted(migrations_dir().glob("*.sql"))
    for path in shipped[:-2]:
        shutil.copy(path, tmp_path / path.name)
    await apply_migrations(fresh_database_url, tmp_path, log=lambda _line: None)
    lines, code = await report(doctor_env(fresh_database_url, redis_url))
    assert code == 1
    names = ", ".join(path.name for path in shipped[-2:])
    assert line(lines, "✗ schema") == (
        f"✗ schema: 2 of {len(shipped)} migrations are not applied ({names}): run `gateway migrate`"
    )


async def test_a_schema_from_a_newer_release_is_a_warning(
    own_database_url: str, redis_url: str
) -> None:
    await execute(
        own_database_url,
        "INSERT INTO schema_migrations (version, name, checksum) VALUES (9999, $1, 'x')",
        "9999_from_a_later_release",
    )
    lines, code = await report(doctor_env(own_database_url, redis_url))
    assert code == 0
    shipped = len(list(migrations_dir().glob("*.sql")))
    assert line(lines, "⚠ schema") == (
        "⚠ schema: newer than this gateway: 9999_from_a_later_release came from a later "
        f"release (this one knows {shipped} migrations)"
    )


async def test_an_edited_migration_is_a_failure(own_database_url: str, redis_url: str) -> None:
    await execute(own_database_url, "UPDATE schema_migrations SET checksum = 'x' WHERE version = 1")
    lines, code = await report(doctor_env(own_database_url, redis_url))
    assert code == 1
    first = sorted(migrations_dir().glob("*.sql"))[0].name
    assert line(lines, "✗ schema").startswith(
        f"✗ schema: migration {first} was changed after it was applied"
    )


async def test_a_transaction_pooler_needs_the_statement_cache_off_and_a_direct_url(
    database_url: str, redis_url: str, make_pgbouncer: Callable[[str], PgBouncer]
) -> None:
    bouncer = make_pgbouncer(database_url)
    pooled = bouncer.url(database_url)
    lines, code = await report(doctor_env(pooled, redis_url))
    assert code == 1
    assert line(lines, "✗ pooler") == (
        "✗ pooler: DATABASE_URL goes through a transaction pooler (such as PgBouncer in "
        "pool_mode=transaction)"
    )
    assert after(lines, "✗ pooler") == [
        "prepared statements do not survive from one transaction to the next: "
        "set GATEWAY_DB_STATEMENT_CACHE_SIZE=0",
        "migrations and the janitor's leadership hold session locks, which need a connection "
        "of their own: set GATEWAY_DIRECT_DATABASE_URL to a URL that reaches Postgres directly",
    ]

    set_for_it = doctor_env(
        pooled,
        redis_url,
        GATEWAY_DB_STATEMENT_CACHE_SIZE="0",
        GATEWAY_DIRECT_DATABASE_URL=database_url,
    )
    lines, code = await report(set_for_it)
    assert code == 0, "\n".join(lines)
    assert line(lines, "✓ pooler") == (
        "✓ pooler: DATABASE_URL goes through a transaction pooler (such as PgBouncer in "
        "pool_mode=transaction); the gateway is set for it"
    )

    set_for_it["GATEWAY_DIRECT_DATABASE_URL"] = pooled
    lines, code = await report(set_for_it)
    assert code == 1
    assert line(lines, "✗ GATEWAY_DIRECT_DATABASE_URL") == (
        "✗ GATEWAY_DIRECT_DATABASE_URL goes through a transaction pooler too: "
        "point it at Postgres itself"
    )


def private_redis(tmp_path: Path, *extra: str) -> RedisServer:
    server = RedisServer(tmp_path / secrets.token_hex(4), extra=list(extra))
    server.start()
    return server


async def test_a_full_redis_that_refuses_writes_is_a_warning_and_one_that_evicts_is_fine(
    database_url: str, tmp_path: Path
) -> None:
    refusing = private_redis(tmp_path, "--maxmemory", "1mb", "--maxmemory-policy", "noeviction")
    evicting = private_redis(tmp_path, "--maxmemory", "1mb", "--maxmemory-policy", "allkeys-lru")
    try:
        lines, code = await report(doctor_env(database_url, refusing.url))
        assert code == 0
        assert line(lines, "⚠ Redis memory") == (
            "⚠ Redis memory: maxmemory 1.0 MiB with policy noeviction: once full, Redis "
            "refuses writes"
        )
        assert after(lines, "⚠ Redis memory") == [
            "a task enqueued then can stay hidden from empty polls for up to "
            "GATEWAY_EMPTY_TTL_SECONDS (30 s); prefer allkeys-lru, since an evicted gateway "
            "key costs one Postgres read and never loses or hides a task"
        ]
        lines, code = await report(doctor_env(database_url, evicting.url))
        assert code == 0
        assert line(lines, "✓ Redis memory") == (
            "✓ Redis memory: maxmemory 1.0 MiB, policy allkeys-lru: when full, Redis evicts; "
            "an evicted gateway key costs one Postgres read, never a lost or hidden task"
        )
    finally:
        refusing.kill()
        evicting.kill()


async def test_a_redis_that_refuses_config_or_pubsub_says_so(
    database_url: str, tmp_path: Path
) -> None:
    server = private_redis(tmp_path, "--rename-command", "CONFIG", "")
    try:
        # A user allowed every command and key but no channel (Redis 7's default for a
        # new user): its subscribe is refused, as a managed Redis's ACL might.
        redis_cli("-p", str(server.port), "ACL", "SETUSER", "doctor", "on", ">pw", "~*", "+@all")
        url = f"redis://doctor:pw@127.0.0.1:{server.port}/0"
        lines, code = await report(doctor_env(database_url, url))
        assert code == 1
        assert line(lines, "⚠ Redis memory").startswith("⚠ Redis memory: cannot read maxmemory (")
        assert after(lines, "⚠ Redis memory") == [
            "check in your provider's settings that a full Redis evicts keys (an allkeys-* or "
            "volatile-* policy) rather than refusing writes"
        ]
        refused = line(lines, "✗ Redis pub/sub")
        assert refused.startswith("✗ Redis pub/sub: a publish did not come back: ")
        assert "permission" in refused.lower() or "noperm" in refused.lower(), refused
    finally:
        server.kill()


async def test_admin_tokens_that_look_typed_and_auth_off_are_warnings(
    database_url: str, redis_url: str
) -> None:
    typed = "a" * 40
    lines, code = await report(doctor_env(database_url, redis_url, GATEWAY_ADMIN_TOKEN=typed))
    assert code == 0
    assert line(lines, "⚠ admin token") == (
        "⚠ admin token: 40 characters, about 188 bits, from 1 distinct characters: it looks "
        "chosen, not generated"
    )
    off = doctor_env(database_url, redis_url, GATEWAY_AUTH="off")
    del off["GATEWAY_ADMIN_TOKEN"]
    lines, code = await report(off)
    assert code == 0
    assert line(lines, "⚠ admin token") == (
        "⚠ admin token: auth is off (GATEWAY_AUTH=off): anyone who reaches the port can "
        "enqueue, claim and administer; for local development only"
    )


async def test_invalid_settings_fail_and_the_servers_are_still_checked(
    database_url: str, redis_url: str
) -> None:
    lines, code = await report(doctor_env(database_url, redis_url, GATEWAY_MAX_WAIT_SECONDS="-1"))
    assert code == 1
    assert line(lines, "✗ settings").startswith("✗ settings: GATEWAY_MAX_WAIT_SECONDS ")
    assert line(lines, "✓ Postgres ")
    assert line(lines, "✓ Redis 7.")


@pytest.mark.parametrize("missing", ["DATABASE_URL", "REDIS_URL"])
async def test_an_unset_url_says_what_to_set(
    database_url: str, redis_url: str, missing: str
) -> None:
    env = doctor_env(database_url, redis_url)
    del env[missing]
    lines, code = await report(env)
    assert code == 1
    expected = {
        "DATABASE_URL": "✗ Postgres: DATABASE_URL is not set: point it at Postgres "
        "(postgresql://user:password@host:5432/database)",
        "REDIS_URL": "✗ Redis: REDIS_URL is not set: point it at Redis (redis://host:6379/0)",
    }[missing]
    assert expected in lines


async def test_a_redis_url_it_cannot_read_is_a_finding_not_a_traceback(database_url: str) -> None:
    lines, code = await report(doctor_env(database_url, "redis://127.0.0.1:abc/0"))
    assert code == 1
    assert line(lines, "✗ Redis at").startswith(
        "✗ Redis at 127.0.0.1:abc (standalone mode) cannot be reached: REDIS_URL cannot be read: "
    )
    assert line(lines, "✓ Postgres ")  # the other checks are still reported


async def test_a_schema_the_user_may_not_read_is_a_finding_not_a_traceback(
    own_database_url: str, redis_url: str
) -> None:
    role = "gwtest_doctor_" + secrets.token_hex(4)
    await execute(own_database_url, f"CREATE ROLE {role} LOGIN")
    try:
        as_role = own_database_url.replace("://postgres@", f"://{role}@", 1)
        assert role in as_role, "the test database URL names user postgres"
        lines, code = await report(doctor_env(as_role, redis_url))
        assert code == 1
        assert line(lines, "✗ schema").startswith(
            "✗ schema: cannot be read: permission denied for table schema_migrations"
        )
        assert line(lines, "✓ Redis 7.")
    finally:
        await execute(own_database_url, f"DROP ROLE {role}")
