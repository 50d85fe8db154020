"""The gateway's configuration: one frozen object built from the environment.

Every knob is read once, at start-up, and validated there; a bad value stops the
process with a message naming the variable. Units are part of the names.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .errors import ConfigError

MIN_ADMIN_TOKEN_CHARS = 32
LOG_FORMATS = ("text", "json")
MAX_JSON_DEPTH_LIMIT = 200
REDIS_MODES = ("standalone", "cluster", "sentinel")
# Connections of one process's command client (per node in a cluster). A call on the
# claim path holds one for well under a millisecond, so 64 serve tens of thousands of
# calls a second, four times the default GATEWAY_MAX_CONCURRENT_CLAIMS; and 150
# processes, each with its pub/sub connection, stay under Redis's default maxclients
# (10,000). A call beyond the bound waits for a connection (gateway/redis/slots.py).
DEFAULT_REDIS_MAX_CONNECTIONS = 64
MAX_REDIS_MAX_CONNECTIONS = 10_000  # Redis's default maxclients: more could never open

# Every environment variable `Settings.from_env` reads, and no other: it refuses to
# read a name missing here, so deployment checks can trust this list.
ENV_NAMES = frozenset(
    {
        "DATABASE_URL",
        "GATEWAY_DIRECT_DATABASE_URL",
        "REDIS_URL",
        "GATEWAY_ADMIN_TOKEN",
        "GATEWAY_AUTH",
        "GATEWAY_CACHE",
        "GATEWAY_REDIS_PREFIX",
        "GATEWAY_EMPTY_TTL_SECONDS",
        "GATEWAY_VERSION_TTL_SECONDS",
        "GATEWAY_REDIS_TIMEOUT_MS",
        "GATEWAY_REDIS_MAX_CONNECTIONS",
        "GATEWAY_MAX_WAIT_SECONDS",
        "GATEWAY_DEFAULT_LEASE_SECONDS",
        "GATEWAY_MAX_PAYLOAD_BYTES",
        "GATEWAY_MAX_BODY_BYTES",
        "GATEWAY_JANITOR_INTERVAL_SECONDS",
        "GATEWAY_RETENTION_SECONDS",
        "GATEWAY_DEAD_RETENTION_SECONDS",
        "GATEWAY_MAX_CONCURRENT_CLAIMS",
        "GATEWAY_MAX_QUEUED_CLAIMS",
        "GATEWAY_DB_POOL_MAX",
        "GATEWAY_DB_ACQUIRE_TIMEOUT_MS",
        "GATEWAY_DB_STATEMENT_CACHE_SIZE",
        "GATEWAY_SHUTDOWN_GRACE_SECONDS",
        "GATEWAY_MAX_JSON_DEPTH",
        "GATEWAY_READ_TIMEOUT_SECONDS",
        "GATEWAY_MAX_PARKED_POLLS",
        "GATEWAY_DEGRADED_POLL_SECONDS",
        "GATEWAY_LOG_FORMAT",
        "GATEWAY_REDIS_MODE",
        "GATEWAY_REDIS_SENTINEL_MASTER",
        "GATEWAY_NEAR_CACHE",
        "GATEWAY_SYNC_MATCH",
    }
)


def _mask_url(url: str | None) -> str | None:
    """Hide the password of a connection URL (in the user part or the query), for logs
    and reprs."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
    if parts.query:
        query = [
            (k, "***" if k.lower() in ("password", "pass", "passwd") else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        parts = parts._replace(query=urlencode(query, safe="*/"))
    return urlunsplit(parts)


@dataclass(frozen=True)
class Settings:
    """Validated configuration. Build it with `Settings.from_env()`."""

    database_url: str | None = field(default=None)
    # A connection that bypasses any pooler, for the session advisory locks (janitor
    # leadership, migrations); None: DATABASE_URL is direct.
    direct_database_url: str | None = field(default=None)
    redis_url: str | None = field(default=None)
    admin_token: str | None = field(default=None, repr=False)
    auth_enabled: bool = True
    cache_enabled: bool = True
    redis_prefix: str = "gw"
    redis_mode: str = "standalone"  # one of REDIS_MODES; see gateway/redis/clients.py
    redis_sentinel_master: str | None = None  # the master's name, in sentinel mode
    empty_ttl_seconds: float = 30.0
    version_ttl_seconds: int = 7 * 24 * 3600
    redis_timeout_ms: int = 250
    # Bound of the command client's pool; a call beyond it waits (gateway/redis/verdict.py).
    redis_max_connections: int = DEFAULT_REDIS_MAX_CONNECTIONS
    breaker_failures: int = 3
    breaker_open_seconds: float = 5.0
    degraded_poll_seconds: float = 1.0
    max_wait_seconds: float = 60.0
    default_lease_seconds: int = 60
    max_payload_bytes: int = 1_048_576
    max_body_bytes: int = 16_777_216
    janitor_interval_seconds: float = 5.0
    janitor_batch_size: int = 1000
    retention_seconds: float = 7 * 86400.0
    dead_retention_seconds: float = 30 * 86400.0
    max_concurrent_claims: int = 16
    max_queued_claims: int = 1000
    db_pool_min: int = 2
    db_pool_max: int = 20
    db_statement_timeout_ms: int = 10_000
    # How long a request waits for a pooled connection before a 503 database_busy.
    db_acquire_timeout_ms: int = 5_000
    # asyncpg's prepared statement cache; 0 behind a transaction pooler (PgBouncer).
    db_statement_cache_size: int = 100
    shutdown_grace_seconds: float = 25.0
    max_json_depth: int = 64
    read_timeout_seconds: float = 30.0
    max_parked_polls: int = 10_000
    log_format: str = "text"  # text for people, json (one object a line) for collectors
    # Keep verdict hits of subscribed runtimes in the process (near_cache.py): an empty poll
    # then costs no Redis round trip.
    near_cache_enabled: bool = True
    # Sync match (claim.py): an enqueue with a poll parked on this instance for its runtime
    # writes the task already leased to the oldest one, in the enqueue's own statement.
    sync_match_enabled: bool = True

    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "admin_token":
                value = "***" if value else None
            elif f.name in ("database_url", "direct_database_url", "redis_url"):
                value = _mask_url(value)
            shown.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(shown)})"

    @property
    def lock_database_url(self) -> str | None:
        """Where session advisory locks are taken: never through a transaction pooler."""
        return self.direct_database_url or self.database_url

    @property
    def redis_timeout_seconds(self) -> float:
        return self.redis_timeout_ms / 1000.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read and validate `GATEWAY_*`, `DATABASE_URL` and `REDIS_URL`.

        Raises ConfigError naming the first bad variable.
        """
        env = _Listed(os.environ if env is None else env)
        values: dict[str, object] = {
            "database_url": env.get("DATABASE_URL") or None,
            "direct_database_url": env.get("GATEWAY_DIRECT_DATABASE_URL") or None,
            "redis_url": env.get("REDIS_URL") or None,
            "admin_token": env.get("GATEWAY_ADMIN_TOKEN") or None,
            "auth_enabled": _switch(env, "GATEWAY_AUTH", True),
            "cache_enabled": _switch(env, "GATEWAY_CACHE", True),
            "redis_prefix": env.get("GATEWAY_REDIS_PREFIX", "gw"),
            "redis_mode": (env.get("GATEWAY_REDIS_MODE") or "standalone").strip().lower(),
            "redis_sentinel_master": env.get("GATEWAY_REDIS_SENTINEL_MASTER") or None,
            "empty_ttl_seconds": _number(env, "GATEWAY_EMPTY_TTL_SECONDS", 30.0, 0.1, 86400),
            "version_ttl_seconds": _integer(
                env, "GATEWAY_VERSION_TTL_SECONDS", 7 * 24 * 3600, 60, 365 * 86400
            ),
            "redis_timeout_ms": _integer(env, "GATEWAY_REDIS_TIMEOUT_MS", 250, 1, 60_000),
            "redis_max_connections": _integer(
                env,
                "GATEWAY_REDIS_MAX_CONNECTIONS",
                DEFAULT_REDIS_MAX_CONNECTIONS,
                1,
                MAX_REDIS_MAX_CONNECTIONS,
            ),
            "max_wait_seconds": _number(env, "GATEWAY_MAX_WAIT_SECONDS", 60.0, 0, 3600),
            "default_lease_seconds": _integer(env, "GATEWAY_DEFAULT_LEASE_SECONDS", 60, 1, 3600),
            "max_payload_bytes": _integer(env, "GATEWAY_MAX_PAYLOAD_BYTES", 1_048_576, 1, 1 << 30),
            "max_body_bytes": _integer(env, "GATEWAY_MAX_BODY_BYTES", 16_777_216, 1, 1 << 31),
            "janitor_interval_seconds": _number(
                env, "GATEWAY_JANITOR_INTERVAL_SECONDS", 5.0, 0.05, 3600
            ),
            "retention_seconds": _number(
                env, "GATEWAY_RETENTION_SECONDS", 7 * 86400, 0, 10 * 365 * 86400
            ),
            "dead_retention_seconds": _number(
                env, "GATEWAY_DEAD_RETENTION_SECONDS", 30 * 86400, 0, 10 * 365 * 86400
            ),
            "max_concurrent_claims": _integer(env, "GATEWAY_MAX_CONCURRENT_CLAIMS", 16, 1, 10_000),
            "max_queued_claims": _integer(env, "GATEWAY_MAX_QUEUED_CLAIMS", 1000, 0, 1_000_000),
            "db_pool_max": _integer(env, "GATEWAY_DB_POOL_MAX", 20, 2, 1000),
            "db_acquire_timeout_ms": _integer(
                env, "GATEWAY_DB_ACQUIRE_TIMEOUT_MS", 5_000, 10, 600_000
            ),
            "db_statement_cache_size": _integer(
                env, "GATEWAY_DB_STATEMENT_CACHE_SIZE", 100, 0, 100_000
            ),
            "shutdown_grace_seconds": _number(env, "GATEWAY_SHUTDOWN_GRACE_SECONDS", 25.0, 0, 3600),
            # orjson writes at most ~254 levels: what is accepted must be answerable.
            "max_json_depth": _integer(env, "GATEWAY_MAX_JSON_DEPTH", 64, 1, MAX_JSON_DEPTH_LIMIT),
            "read_timeout_seconds": _number(env, "GATEWAY_READ_TIMEOUT_SECONDS", 30.0, 0.1, 3600),
            "max_parked_polls": _integer(env, "GATEWAY_MAX_PARKED_POLLS", 10_000, 0, 10_000_000),
            "degraded_poll_seconds": _number(env, "GATEWAY_DEGRADED_POLL_SECONDS", 1.0, 0.05, 60),
            "log_format": _choice(env, "GATEWAY_LOG_FORMAT", LOG_FORMATS, "text"),
            "near_cache_enabled": _switch(env, "GATEWAY_NEAR_CACHE", True),
            "sync_match_enabled": _switch(env, "GATEWAY_SYNC_MATCH", True),
        }
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """Cross-field checks; raises ConfigError."""
        if not self.redis_prefix or any(c in self.redis_prefix for c in "{} "):
            raise ConfigError("GATEWAY_REDIS_PREFIX must be non-empty, without spaces or braces")
        self._validate_redis_mode()
        if self.auth_enabled and not self.admin_token:
            raise ConfigError(
                "GATEWAY_ADMIN_TOKEN is not set. Set it to a long random secret, "
                "or set GATEWAY_AUTH=off for local development only."
            )
        if self.auth_enabled and len(self.admin_token or "") < MIN_ADMIN_TOKEN_CHARS:
            raise ConfigError(
                f"GATEWAY_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters; "
                "generate one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        if not 1 <= self.max_json_depth <= MAX_JSON_DEPTH_LIMIT:
            raise ConfigError(
                f"GATEWAY_MAX_JSON_DEPTH must be between 1 and {MAX_JSON_DEPTH_LIMIT}"
            )
        if self.default_lease_seconds > 3600:
            raise ConfigError("GATEWAY_DEFAULT_LEASE_SECONDS must be at most 3600")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"GATEWAY_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}")
        if self.direct_database_url and urlsplit(self.direct_database_url).scheme not in (
            "postgres",
            "postgresql",
        ):
            raise ConfigError(
                "GATEWAY_DIRECT_DATABASE_URL must be a postgresql:// URL that reaches "
                "Postgres without a pooler"
            )
        if self.db_pool_min > self.db_pool_max:
            raise ConfigError(f"GATEWAY_DB_POOL_MAX must be at least {self.db_pool_min}")

    def _validate_redis_mode(self) -> None:
        if self.redis_mode not in REDIS_MODES:
            raise ConfigError(
                f"GATEWAY_REDIS_MODE must be one of {', '.join(REDIS_MODES)}, "
                f"got {self.redis_mode!r}"
            )
        scheme = urlsplit(self.redis_url).scheme if self.redis_url else None
        if self.redis_mode == "sentinel":
            if not self.redis_sentinel_master:
                raise ConfigError(
                    "GATEWAY_REDIS_SENTINEL_MASTER must name the master "
                    "when GATEWAY_REDIS_MODE=sentinel"
                )
            if scheme is not None and scheme not in ("redis+sentinel", "rediss+sentinel"):
                raise ConfigError(
                    "with GATEWAY_REDIS_MODE=sentinel, REDIS_URL must list the sentinels: "
                    "redis+sentinel://host1:26379,host2:26379/0 (rediss+sentinel:// for TLS)"
                )
        elif scheme is not None and scheme.endswith("+sentinel"):
            raise ConfigError("a redis+sentinel:// REDIS_URL needs GATEWAY_REDIS_MODE=sentinel")
        if self.redis_mode == "cluster" and scheme not in (None, "redis", "rediss"):
            raise ConfigError(
                "with GATEWAY_REDIS_MODE=cluster, REDIS_URL must be redis:// or rediss:// "
                "naming any one node of the cluster"
            )


class _Listed(Mapping[str, str]):
    """The environment, readable only by the names in ENV_NAMES."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def __getitem__(self, name: str) -> str:
        if name not in ENV_NAMES:
            raise AssertionError(f"{name} is read by Settings.from_env but not in ENV_NAMES")
        return self._env[name]

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._env if name in ENV_NAMES)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be 'on' or 'off', got {raw!r}")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return value


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, got {raw!r}")
    return value


def _integer(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = _number(env, name, default, low, high)
    if value != int(value):
        raise ConfigError(f"{name} must be a whole number, got {env.get(name)!r}")
    return int(value)
