"""What a failed start of `gateway serve` says and exits with, piece by piece: how a
database URL is named (never with its password), which error gives which exit code,
and what /readyz says while the start waits for Postgres."""

from __future__ import annotations

import pytest

from gateway.cli.startup import DatabaseWait, exit_code, mask_secrets, refusal
from gateway.errors import ConfigError, SchemaNotCurrent, StoreUnavailable, Unreachable
from gateway.settings import Settings, check_database_url
from gateway.store.migrate import Migration, MigrationError
from gateway.store.probe import SchemaState
from gateway.store.startup import location, newer_warning, require_current, server
from tests.support.clocks import FakeClock


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("postgresql://u:pw@db.internal:6432/tasks", "database tasks at db.internal:6432"),
        ("postgres://u@db/tasks", "database tasks at db:5432"),
        ("postgresql://u@[::1]:5433/tasks", "database tasks at [::1]:5433"),
        ("postgresql://u:pw@h1:5432,h2:5433/tasks", "database tasks at h1:5432,h2:5433"),
        ("postgresql://u@/tasks?host=/run/pg", "database tasks at the socket in /run/pg"),
        ("postgresql://u:pw@db", "db:5432"),
    ],
)  # fmt: skip
def test_a_database_is_named_by_host_port_and_name_without_credentials(url, named):
    assert location(url) == named
    assert "pw" not in server(url)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("x"), 2),
        (Unreachable("x"), 3),
        (StoreUnavailable("x"), 3),
        (SchemaNotCurrent("x"), 4),
        (MigrationError("x"), 4),
        (RuntimeError("x"), 1),
    ],
)
def test_each_failure_has_its_exit_code(error, code):
    assert exit_code(error) == code


def test_passwords_of_the_configured_urls_never_show():
    env = {
        "DATABASE_URL": "postgresql://gw:pg-secret@db/tasks",
        "REDIS_URL": "redis://:redis-secret@cache:6379/0",
    }
    text = "DSN postgresql://gw:pg-secret@db/tasks refused; auth redis-secret failed"
    assert mask_secrets(text, env) == "DSN postgresql://gw:***@db/tasks refused; auth *** failed"
    token = {"GATEWAY_ADMIN_TOKEN": "t0ken-that-is-long-enough"}
    assert mask_secrets("bad token t0ken-that-is-long-enough", token) == "bad token ***"


def test_an_unexpected_error_is_named_as_a_bug_with_the_way_to_its_traceback():
    assert refusal(KeyError("db"), {}) == [
        "gateway: start-up failed: KeyError: 'db'",
        "gateway: this is a bug: `gateway --log-level debug serve` shows where it happened",
    ]


def test_readyz_counts_down_the_wait():
    clock = FakeClock()
    settings = Settings(database_url="postgresql://u@db:5432/tasks", startup_retry_seconds=40)
    wait = DatabaseWait(settings, migrate=False, clock=clock)
    assert wait.waiting_for() == "connecting to Postgres at db:5432 (retrying for 40 s more)"
    clock.advance(32.5)
    assert wait.waiting_for() == "connecting to Postgres at db:5432 (retrying for 7.5 s more)"
    clock.advance(60)
    assert wait.waiting_for() == "connecting to Postgres at db:5432 (retrying for 0.0 s more)"


NOT_POSTGRES = "DATABASE_URL must be a postgresql:// (or postgres://) URL"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:pw@db:5432/tasks",
        "postgres://db/tasks",
        "postgresql://u@h1:5432,h2:5433/tasks",
        "postgresql://u@[::1]:5432/tasks",
        "postgresql://u@/tasks?host=/run/pg",
        "POSTGRESQL://u@db/tasks",
    ],
)
def test_postgres_urls_pass(url):
    check_database_url(url)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (None, "DATABASE_URL is not set: point it at Postgres"),
        ("", "DATABASE_URL is not set: point it at Postgres"),
        ("mysql://u:pw@db/tasks", f"{NOT_POSTGRES}, got mysql://:"),
        ("db:5432/tasks", f"{NOT_POSTGRES}, got a URL without a scheme"),
        ("postgresql://u:pw@db:54x2/tasks", "DATABASE_URL names the port '54x2', which is not"),
        ("postgresql://u@h1:5432,h2:/tasks", None),
    ],
)  # fmt: skip
def test_other_database_urls_are_refused_without_their_password(url, said):
    if said is None:  # an empty port: the driver's default
        check_database_url(url)
        return
    with pytest.raises(ConfigError) as refused:
        check_database_url(url)
    assert refused.value.detail.startswith(said)
    assert "pw" not in refused.value.detail


def _schema(applied: list[int], shipped: int) -> SchemaState:
    files = [Migration(v, f"{v:04d}_m.sql", "", "", True) for v in range(1, shipped + 1)]
    return SchemaState(
        shipped=files,
        applied=[f"{v:04d}_m.sql" for v in applied],
        pending=[m for m in files if m.version not in applied],
        newer=[f"{v:04d}_m.sql" for v in applied if v > shipped],
    )


def test_a_schema_is_judged_against_the_release():
    url = "postgresql://u@db/tasks"
    assert require_current(url, _schema([1, 2, 3], 3)) is None
    assert newer_warning(url, _schema([1, 2, 3], 3)) is None
    with pytest.raises(SchemaNotCurrent) as none:
        require_current(url, _schema([], 3))
    assert none.value.detail.splitlines() == [
        "database tasks at db:5432 has no claim-gateway schema",
        "run `gateway migrate` (or start with `gateway serve --migrate`), then start again",
    ]
    with pytest.raises(SchemaNotCurrent) as older:
        require_current(url, _schema([1], 3))
    assert older.value.extra["state"] == (
        "database tasks at db:5432 is at migration 0001 of 0003 (pending: 0002_m.sql, 0003_m.sql)"
    )
    assert newer_warning(url, _schema([1, 2, 3, 4], 3)) == (
        "database tasks at db:5432 is at migration 0004 (0004_m.sql), newer than this release, "
        "which knows up to 0003: starting anyway, as after a rollback (a migration keeps the "
        "release before it working)"
    )
    # Newer, yet missing one of this release's: this release's migrate would refuse it.
    with pytest.raises(SchemaNotCurrent) as gap:
        require_current(url, _schema([1, 3, 4], 3))
    assert gap.value.detail.splitlines() == [
        "database tasks at db:5432 is at migration 0004, newer than this release, but lacks "
        "some of this release's (pending: 0002_m.sql)",
        "run `gateway migrate` of the newest release, which knows them all",
    ]
