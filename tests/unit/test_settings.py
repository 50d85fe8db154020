"""Settings.from_env: defaults, validation naming the variable, masking, immutability."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from gateway.environment import VARIABLES
from gateway.errors import ConfigError
from gateway.settings import ENV_NAMES, Settings
from tests.support.environment import RecordingEnv

TOKEN = "adm-7f3c9e1d2b4a5968-0123456789abcdef"
BASE = {"GATEWAY_ADMIN_TOKEN": TOKEN}


def from_env(**env: str) -> Settings:
    return Settings.from_env({**BASE, **env})


def test_defaults_match_the_design() -> None:
    s = Settings.from_env(BASE)
    assert s.database_url is None
    assert s.redis_url is None
    assert s.admin_token == TOKEN
    assert s.auth_enabled is True
    assert s.cache_enabled is True
    assert s.near_cache_enabled is True
    assert s.redis_prefix == "gw"
    assert s.empty_ttl_seconds == 30.0
    assert s.version_ttl_seconds == 7 * 24 * 3600
    assert s.redis_timeout_ms == 250
    assert s.redis_timeout_seconds == 0.25
    assert s.max_wait_seconds == 60.0
    assert s.default_lease_seconds == 60
    assert s.max_payload_bytes == 1_048_576
    assert s.max_body_bytes == 16_777_216
    assert s.janitor_interval_seconds == 5.0
    assert s.max_concurrent_claims == 16
    assert s.max_queued_claims == 1000
    assert s.db_pool_max == 20
    assert s.shutdown_grace_seconds == 25.0


def test_from_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("GATEWAY_MAX_WAIT_SECONDS", "12")
    assert Settings.from_env().max_wait_seconds == 12.0


def test_env_names_are_exactly_what_from_env_reads() -> None:
    # Deployment checks (tests/deploy) trust ENV_NAMES: a name added to from_env fails
    # every call until listed, and a listed name nobody reads fails here.
    env = RecordingEnv(BASE)
    Settings.from_env(env)
    assert env.read == ENV_NAMES


# Settings no environment variable sets: tuning that only the tests change.
INTERNAL_FIELDS = {"breaker_failures", "breaker_open_seconds", "db_pool_min"}


def test_every_setting_but_the_internal_ones_has_its_variable() -> None:
    # The docs name a variable for each setting an operator may need (the capacity
    # guide's batch size and statement timeout were once named and read by nothing).
    read = {v.field for v in VARIABLES}
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert fields - read == INTERNAL_FIELDS


def test_urls_read_and_empty_means_unset() -> None:
    s = from_env(DATABASE_URL="postgresql://h/db", REDIS_URL="redis://h:6379/0")
    assert s.database_url == "postgresql://h/db"
    assert s.redis_url == "redis://h:6379/0"
    s = from_env(DATABASE_URL="", REDIS_URL="")
    assert s.database_url is None and s.redis_url is None


NUMERIC: list[tuple[str, str, str, Any]] = [
    ("GATEWAY_EMPTY_TTL_SECONDS", "empty_ttl_seconds", "2.5", 2.5),
    ("GATEWAY_VERSION_TTL_SECONDS", "version_ttl_seconds", "86400", 86400),
    ("GATEWAY_REDIS_TIMEOUT_MS", "redis_timeout_ms", "100", 100),
    ("GATEWAY_REDIS_MAX_CONNECTIONS", "redis_max_connections", "8", 8),
    ("GATEWAY_MAX_WAIT_SECONDS", "max_wait_seconds", "20", 20.0),
    ("GATEWAY_DEFAULT_LEASE_SECONDS", "default_lease_seconds", "120", 120),
    ("GATEWAY_MAX_PAYLOAD_BYTES", "max_payload_bytes", "1024", 1024),
    ("GATEWAY_MAX_BODY_BYTES", "max_body_bytes", "2048", 2048),
    ("GATEWAY_JANITOR_INTERVAL_SECONDS", "janitor_interval_seconds", "0.5", 0.5),
    ("GATEWAY_MAX_CONCURRENT_CLAIMS", "max_concurrent_claims", "4", 4),
    ("GATEWAY_MAX_QUEUED_CLAIMS", "max_queued_claims", "0", 0),
    ("GATEWAY_DB_POOL_MAX", "db_pool_max", "50", 50),
    ("GATEWAY_DB_STATEMENT_CACHE_SIZE", "db_statement_cache_size", "0", 0),
    ("GATEWAY_DB_CONNECT_TIMEOUT_MS", "db_connect_timeout_ms", "500", 500),
    ("GATEWAY_DB_STATEMENT_TIMEOUT_MS", "db_statement_timeout_ms", "30000", 30000),
    ("GATEWAY_JANITOR_BATCH_SIZE", "janitor_batch_size", "5000", 5000),
    ("GATEWAY_SHUTDOWN_GRACE_SECONDS", "shutdown_grace_seconds", "3", 3.0),
    ("GATEWAY_DEGRADED_POLL_SECONDS", "degraded_poll_seconds", "0.25", 0.25),
]
NUMERIC_NAMES = [n[0] for n in NUMERIC]


@pytest.mark.parametrize(("name", "attr", "raw", "expected"), NUMERIC)
def test_numeric_variable_parsed(name: str, attr: str, raw: str, expected: Any) -> None:
    value = getattr(from_env(**{name: raw}), attr)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("name", NUMERIC_NAMES)
def test_numeric_variable_empty_means_default(name: str) -> None:
    assert from_env(**{name: ""}) == Settings.from_env(BASE)


@pytest.mark.parametrize("bad", ["abc", "-5", "1e12", "nan", "inf", "10s", " "])
@pytest.mark.parametrize("name", NUMERIC_NAMES)
def test_numeric_variable_bad_value_names_it(name: str, bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(**{name: bad})
    assert name in str(info.value)


def test_redis_timeout_seconds_follows_ms() -> None:
    assert from_env(GATEWAY_REDIS_TIMEOUT_MS="1500").redis_timeout_seconds == 1.5


def test_redis_max_connections_defaults_to_64_and_is_bounded() -> None:
    assert Settings.from_env(BASE).redis_max_connections == 64
    assert from_env(GATEWAY_REDIS_MAX_CONNECTIONS="1").redis_max_connections == 1
    assert from_env(GATEWAY_REDIS_MAX_CONNECTIONS="10000").redis_max_connections == 10_000
    for bad in ("0", "10001", "2.5"):
        with pytest.raises(ConfigError, match="GATEWAY_REDIS_MAX_CONNECTIONS"):
            from_env(GATEWAY_REDIS_MAX_CONNECTIONS=bad)


def test_default_lease_above_an_hour_refused() -> None:
    with pytest.raises(ConfigError, match="GATEWAY_DEFAULT_LEASE_SECONDS"):
        from_env(GATEWAY_DEFAULT_LEASE_SECONDS="3601")


def test_statement_cache_size_defaults_to_asyncpgs_and_is_bounded() -> None:
    assert Settings.from_env(BASE).db_statement_cache_size == 100
    assert from_env(GATEWAY_DB_STATEMENT_CACHE_SIZE="100000").db_statement_cache_size == 100_000
    with pytest.raises(ConfigError, match="GATEWAY_DB_STATEMENT_CACHE_SIZE"):
        from_env(GATEWAY_DB_STATEMENT_CACHE_SIZE="100001")


def test_direct_database_url_is_where_locks_go_and_is_masked() -> None:
    s = from_env(
        DATABASE_URL="postgresql://u:pool-secret@bouncer:6432/db",
        GATEWAY_DIRECT_DATABASE_URL="postgresql://u:direct-secret@pg:5432/db",
    )
    assert s.direct_database_url == "postgresql://u:direct-secret@pg:5432/db"
    assert s.lock_database_url == s.direct_database_url
    assert "direct-secret" not in repr(s) and "pool-secret" not in repr(s)
    plain = from_env(DATABASE_URL="postgresql://h/db", GATEWAY_DIRECT_DATABASE_URL="")
    assert plain.direct_database_url is None
    assert plain.lock_database_url == "postgresql://h/db"


def test_direct_database_url_must_be_postgres() -> None:
    with pytest.raises(ConfigError, match="GATEWAY_DIRECT_DATABASE_URL"):
        from_env(GATEWAY_DIRECT_DATABASE_URL="redis://h:6379/0")


MULTI_HOST_URL = "postgresql://u@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs=read-write"


def test_connect_timeout_defaults_to_two_seconds_and_is_bounded() -> None:
    assert Settings.from_env(BASE).db_connect_timeout_ms == 2_000
    for bad in ("99", "600001"):
        with pytest.raises(ConfigError, match="GATEWAY_DB_CONNECT_TIMEOUT_MS"):
            from_env(GATEWAY_DB_CONNECT_TIMEOUT_MS=bad)


@pytest.mark.parametrize("variable", ["DATABASE_URL", "GATEWAY_DIRECT_DATABASE_URL"])
def test_with_several_hosts_the_connect_timeout_must_be_below_the_acquire_timeout(
    variable: str,
) -> None:
    """A request's wait for a connection ends its connect too: were a silent first host
    given as long, no new connection would ever reach the second."""
    env = {variable: MULTI_HOST_URL, "GATEWAY_DB_ACQUIRE_TIMEOUT_MS": "2000"}
    with pytest.raises(ConfigError) as info:
        from_env(**env, GATEWAY_DB_CONNECT_TIMEOUT_MS="2000")
    assert "GATEWAY_DB_CONNECT_TIMEOUT_MS (2000)" in info.value.detail
    assert "GATEWAY_DB_ACQUIRE_TIMEOUT_MS (2000)" in info.value.detail
    assert from_env(**env, GATEWAY_DB_CONNECT_TIMEOUT_MS="1999").db_connect_timeout_ms == 1999
    # One host: nothing to pass over, any pair is fine.
    one = from_env(
        DATABASE_URL="postgresql://u@10.0.0.1:5432/db", GATEWAY_DB_ACQUIRE_TIMEOUT_MS="100"
    )
    assert one.db_connect_timeout_ms == 2_000


def test_hosts_named_in_the_host_parameter_count_as_several() -> None:
    url = "postgresql://u@/db?host=10.0.0.1,10.0.0.2&target_session_attrs=read-write"
    env = {"DATABASE_URL": url, "GATEWAY_DB_ACQUIRE_TIMEOUT_MS": "5000"}
    with pytest.raises(ConfigError, match="GATEWAY_DB_CONNECT_TIMEOUT_MS"):
        from_env(**env, GATEWAY_DB_CONNECT_TIMEOUT_MS="5000")
    assert from_env(**env).db_connect_timeout_ms == 2_000


def test_a_port_parameter_that_is_not_a_number_is_refused_plainly() -> None:
    url = "postgresql://u@/db?host=10.0.0.1,10.0.0.2&port=x&target_session_attrs=read-write"
    with pytest.raises(ConfigError, match="port that is not a number"):
        from_env(DATABASE_URL=url)


@pytest.mark.parametrize(
    "attrs", ["", "&target_session_attrs=any", "&target_session_attrs=standby"]
)
def test_several_hosts_must_ask_for_the_primary(
    attrs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any server of the list would do otherwise, a read-only standby too."""
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    url = f"postgresql://u@10.0.0.1:5432,10.0.0.2:5432/db?sslmode=prefer{attrs}"
    with pytest.raises(ConfigError, match="target_session_attrs=read-write"):
        from_env(DATABASE_URL=url)
    for fine in ("read-write", "primary"):
        url = f"postgresql://u@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs={fine}"
        assert from_env(DATABASE_URL=url).database_url == url
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "read-write")
    assert from_env(DATABASE_URL="postgresql://u@h1,h2/db").database_url is not None


def test_pool_max_below_pool_min_refused() -> None:
    with pytest.raises(ConfigError, match="GATEWAY_DB_POOL_MAX"):
        from_env(GATEWAY_DB_POOL_MAX="1")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("on", True),
        ("off", False),
        ("true", True),
        ("false", False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("no", False),
        ("OFF", False),
        (" On ", True),
    ],
)
def test_switches(raw: str, expected: bool) -> None:
    s = Settings.from_env(
        {"GATEWAY_AUTH": raw, "GATEWAY_CACHE": raw, "GATEWAY_NEAR_CACHE": raw, **BASE}
    )
    assert s.auth_enabled is expected
    assert s.cache_enabled is expected
    assert s.near_cache_enabled is expected


@pytest.mark.parametrize("name", ["GATEWAY_AUTH", "GATEWAY_CACHE", "GATEWAY_NEAR_CACHE"])
@pytest.mark.parametrize("bad", ["maybe", "enabled", "2"])
def test_switch_bad_value_names_it(name: str, bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_env(**{name: bad})
    assert name in str(info.value)


def test_auth_off_without_token_ok() -> None:
    s = Settings.from_env({"GATEWAY_AUTH": "off"})
    assert s.auth_enabled is False
    assert s.admin_token is None


@pytest.mark.parametrize("env", [{}, {"GATEWAY_AUTH": "on"}, {"GATEWAY_ADMIN_TOKEN": ""}])
def test_auth_on_without_token_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert "GATEWAY_ADMIN_TOKEN" in str(info.value)


@pytest.mark.parametrize("short", ["x", "a" * 31])
def test_short_admin_token_refused(short: str) -> None:
    with pytest.raises(ConfigError, match="at least 32 characters") as info:
        Settings.from_env({"GATEWAY_ADMIN_TOKEN": short})
    assert short not in str(info.value)  # a secret is never echoed, even a bad one


def test_admin_token_of_32_characters_accepted() -> None:
    assert Settings.from_env({"GATEWAY_ADMIN_TOKEN": "a" * 32}).admin_token == "a" * 32


def test_short_admin_token_is_fine_with_auth_off() -> None:
    Settings.from_env({"GATEWAY_AUTH": "off", "GATEWAY_ADMIN_TOKEN": "x"})


def test_new_limits_have_defaults_and_bounds() -> None:
    s = from_env()
    assert (s.max_json_depth, s.read_timeout_seconds, s.max_parked_polls) == (64, 30.0, 10_000)
    s = from_env(
        GATEWAY_MAX_JSON_DEPTH="10",
        GATEWAY_READ_TIMEOUT_SECONDS="2.5",
        GATEWAY_MAX_PARKED_POLLS="7",
    )
    assert (s.max_json_depth, s.read_timeout_seconds, s.max_parked_polls) == (10, 2.5, 7)
    for name, bad in [
        ("GATEWAY_MAX_JSON_DEPTH", "0"),
        ("GATEWAY_MAX_JSON_DEPTH", "201"),
        ("GATEWAY_READ_TIMEOUT_SECONDS", "0"),
        ("GATEWAY_MAX_PARKED_POLLS", "-1"),
    ]:
        with pytest.raises(ConfigError, match=name):
            from_env(**{name: bad})


def test_cache_off_keeps_settings_valid() -> None:
    assert from_env(GATEWAY_CACHE="off").cache_enabled is False


def test_redis_prefix() -> None:
    assert from_env(GATEWAY_REDIS_PREFIX="myapp").redis_prefix == "myapp"


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "a b"])
def test_bad_redis_prefix_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="GATEWAY_REDIS_PREFIX"):
        from_env(GATEWAY_REDIS_PREFIX=bad)


def test_overrides_win_and_are_validated() -> None:
    s = Settings.from_env(BASE, max_wait_seconds=5.0, cache_enabled=False)
    assert s.max_wait_seconds == 5.0
    assert s.cache_enabled is False
    with pytest.raises(ConfigError):
        Settings.from_env(BASE, admin_token=None)


# --- secrets never shown ------------------------------------------------------------------


def test_repr_masks_token_and_url_passwords() -> None:
    s = from_env(
        DATABASE_URL="postgresql://app:pg-s3cr3t-pw@db.example:5432/tasks",
        REDIS_URL="redis://:r3dis-s3cr3t@cache.example:6379/0",
    )
    for text in (repr(s), str(s), f"{s}", f"{s!r}"):
        assert TOKEN not in text
        assert "pg-s3cr3t-pw" not in text
        assert "r3dis-s3cr3t" not in text
        assert "admin_token='***'" in text
        assert "postgresql://app:***@db.example:5432/tasks" in text
        assert "redis://:***@cache.example:6379/0" in text


def test_repr_masks_password_with_at_sign() -> None:
    s = from_env(DATABASE_URL="postgresql://app:p@ss@db.example/tasks")
    assert "p@ss" not in repr(s)
    assert "db.example/tasks" in repr(s)


def test_repr_leaves_urls_without_password_alone() -> None:
    s = Settings.from_env({"GATEWAY_AUTH": "off", "REDIS_URL": "redis://cache.example:6379/0"})
    assert "redis_url='redis://cache.example:6379/0'" in repr(s)
    assert "admin_token=None" in repr(s)


def test_repr_masks_password_in_query_string() -> None:
    # libpq/asyncpg and redis-py also take the password as a query parameter.
    s = from_env(
        DATABASE_URL="postgresql://app@db.example/tasks?password=pg-s3cr3t-pw",
        REDIS_URL="redis://cache.example:6379/0?password=r3dis-s3cr3t",
    )
    text = repr(s)
    assert "pg-s3cr3t-pw" not in text
    assert "r3dis-s3cr3t" not in text
    assert "db.example/tasks" in text
    assert "cache.example:6379/0" in text


def test_repr_masking_keeps_other_query_parameters() -> None:
    s = from_env(DATABASE_URL="postgresql://app:pw-123456@db.example/tasks?sslmode=require")
    text = repr(s)
    assert "pw-123456" not in text
    assert "sslmode=require" in text
    assert "postgresql://app:***@db.example/tasks" in text


def test_frozen() -> None:
    s = Settings.from_env(BASE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_wait_seconds = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.admin_token = "other"  # type: ignore[misc]
    assert s.max_wait_seconds == 60.0
