"""The gateway's configuration: one frozen object built from the environment.

Every knob is read once, at start-up, and validated there; a bad value stops the
process with a message naming the variable. Units are part of the names. Which
variables there are, their defaults, bounds and meaning: gateway/environment/.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .dsn import Host, hosts
from .environment import (
    DEFAULT_REDIS_MAX_CONNECTIONS as DEFAULT_REDIS_MAX_CONNECTIONS,
)
from .environment import ENV_NAMES as ENV_NAMES
from .environment import LOG_FORMATS as LOG_FORMATS
from .environment import MAX_JSON_DEPTH_LIMIT, MIN_ADMIN_TOKEN_CHARS, REDIS_MODES, VARIABLES
from .errors import ConfigError

POSTGRES_SCHEMES = ("postgresql", "postgres")


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
    janitor_vacuum_dead_rows: int = 100_000
    retention_seconds: float = 7 * 86400.0
    dead_retention_seconds: float = 30 * 86400.0
    # How long schedule ticks are recorded; a backfill may not reach further back.
    schedule_ticks_days: int = 30
    # The per-runtime history (docs/guides/history.md): how long its buckets are kept,
    # and their width.
    history_days: int = 7
    history_interval_seconds: int = 60
    max_concurrent_claims: int = 16
    max_queued_claims: int = 1000
    db_pool_min: int = 2
    db_pool_max: int = 20
    db_statement_timeout_ms: int = 10_000
    # How long a request waits for a pooled connection before a 503 database_busy.
    db_acquire_timeout_ms: int = 5_000
    # How long each host of DATABASE_URL may take to accept a new connection before the
    # next host is tried (gateway/store/hosts.py).
    db_connect_timeout_ms: int = 2_000
    # The line of work (enqueues, claims, reads) waiting for a connection, in ms of the
    # mean hold: past it, work is refused at once (gateway/admission.py).
    db_queue_budget_ms: float = 250.0
    # asyncpg's prepared statement cache; 0 behind a transaction pooler (PgBouncer).
    db_statement_cache_size: int = 100
    shutdown_grace_seconds: float = 25.0
    max_json_depth: int = 64
    read_timeout_seconds: float = 30.0
    max_parked_polls: int = 10_000
    # Requests at work at once, past which work that can wait is refused (in_flight.py).
    max_active_requests: int = 128
    log_format: str = "text"  # text for people, json (one object a line) for collectors
    # The share of successful requests answered within a second that get an access line
    # (errors and slower requests always do; 1: every request).
    access_log_sample: float = 0.1
    # Keep verdict hits of subscribed runtimes in the process (near_cache.py): an empty poll
    # then costs no Redis round trip.
    near_cache_enabled: bool = True
    # Sync match (claim.py): an enqueue with a poll parked on this instance for its runtime
    # writes the task already leased to the oldest one, in the enqueue's own statement.
    sync_match_enabled: bool = True
    # How long `gateway serve` waits for Postgres (and its schema) at start, listening
    # meanwhile with /readyz 503; 0: not at all, the first failure stops it.
    startup_retry_seconds: float = 0.0

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
        values: dict[str, object] = {v.field: v.read(env) for v in VARIABLES}
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """Cross-field checks; raises ConfigError."""
        if self.database_url is not None:
            check_database_url(self.database_url)
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
        self._validate_connect_timeout()

    def _validate_connect_timeout(self) -> None:
        # A request that needs a new connection waits for it GATEWAY_DB_ACQUIRE_TIMEOUT_MS
        # at most, and its wait ending ends the connection attempt too: were a dead first
        # host to take that long, no new connection would ever reach the second.
        several = [url for url in self._database_urls() if len(_hosts_of(url)) > 1]
        for url in several:
            # With any server of the list taken, a process could settle on a standby,
            # where every write fails (and an advisory lock still succeeds: two janitor
            # leaders); asyncpg's default, and PGTARGETSESSIONATTRS's, is "any".
            attrs = dict(parse_qsl(urlsplit(url).query)).get(
                "target_session_attrs", os.environ.get("PGTARGETSESSIONATTRS", "any")
            )
            if attrs not in ("read-write", "primary"):
                raise ConfigError(
                    "a database URL that names several hosts must ask for the primary: "
                    "add target_session_attrs=read-write to it (it says "
                    f"{attrs!r}), or the gateway could connect to a read-only standby"
                )
        if several and self.db_connect_timeout_ms >= self.db_acquire_timeout_ms:
            raise ConfigError(
                f"GATEWAY_DB_CONNECT_TIMEOUT_MS ({self.db_connect_timeout_ms}) must be less "
                f"than GATEWAY_DB_ACQUIRE_TIMEOUT_MS ({self.db_acquire_timeout_ms}) when the "
                "database URL names several hosts: a host that does not answer would use up "
                "a request's whole wait for a connection, and the next host would never be tried"
            )

    def _database_urls(self) -> list[str]:
        return [url for url in (self.database_url, self.direct_database_url) if url]

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


def check_database_url(url: str | None) -> None:
    """Refuses a DATABASE_URL that is unset or not a Postgres URL (ConfigError); says
    nothing of the rest of it, which only the driver reads (several hosts, a socket)."""
    if not url:
        raise ConfigError(
            "DATABASE_URL is not set: point it at Postgres "
            "(postgresql://user:password@host:5432/database), "
            "or run `gateway serve --embedded` for development"
        )
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme.lower() not in POSTGRES_SCHEMES:
        # Only the scheme is shown: the rest may hold a password.
        got = f"{scheme}://" if scheme else "a URL without a scheme"
        raise ConfigError(
            f"DATABASE_URL must be a postgresql:// (or postgres://) URL, got {got}: "
            "the gateway stores its tasks in Postgres only"
        )
    for host in _host_part(url):
        after_address = host.rsplit("]", 1)[-1]
        port = after_address.rpartition(":")[2] if ":" in after_address else ""
        if port and not port.isdigit():
            raise ConfigError(f"DATABASE_URL names the port {port!r}, which is not a number")


def _hosts_of(url: str) -> list[Host]:
    """The hosts `url` names, as its connections walk them (gateway/dsn.py)."""
    try:
        return hosts(url)
    except ValueError as exc:  # a port, in the host part or its parameter, not a number
        raise ConfigError(f"DATABASE_URL names a port that is not a number ({exc})") from None


def _host_part(url: str) -> list[str]:
    """The hosts of a Postgres URL's host part, as written (empty when it has none)."""
    if "://" not in url:
        return []
    hosts = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    return hosts.split(",") if hosts else []


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
