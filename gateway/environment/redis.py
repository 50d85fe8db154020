"""The variables of Redis: where it is and in which mode, the empty verdicts it caches,
its timeouts and connections, and the near-cache in front of it."""

from __future__ import annotations

from ..variable import Variable
from .bounds import (
    DEFAULT_REDIS_MAX_CONNECTIONS,
    MAX_REDIS_MAX_CONNECTIONS,
    REDIS_MODES,
    SWITCH,
)

TITLE = "Redis"
REDIS: tuple[Variable, ...] = (
    Variable(
        "REDIS_URL",
        "redis_url",
        "optional",
        None,
        shown_default="(embedded with `--embedded`)",
        doc="Redis 6.2 or newer, or Valkey. How it is read depends on `GATEWAY_REDIS_MODE`.",
    ),
    Variable(
        "GATEWAY_REDIS_MODE",
        "redis_mode",
        "lowered",
        "standalone",
        choices=REDIS_MODES,
        doc="How `REDIS_URL` is read: one server, any one node of a cluster, or a list of "
        "sentinels (see [Redis modes](operations/redis.md)).",
    ),
    Variable(
        "GATEWAY_REDIS_SENTINEL_MASTER",
        "redis_sentinel_master",
        "optional",
        None,
        shown_default="(required in `sentinel` mode)",
        doc="The name under which the sentinels know the master.",
    ),
    Variable(
        "GATEWAY_CACHE",
        "cache_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="`off` sends every claim to Postgres (Redis still carries wake-ups); the "
        "baseline for benchmarks.",
    ),
    Variable(
        "GATEWAY_REDIS_PREFIX",
        "redis_prefix",
        "text",
        "gw",
        doc="Prefix of every Redis key and channel; not empty, without spaces or braces.",
    ),
    Variable(
        "GATEWAY_EMPTY_TTL_SECONDS",
        "empty_ttl_seconds",
        "number",
        30.0,
        low=0.1,
        high=86400,
        unit="seconds",
        doc='Life of an "empty" verdict; never longer than the time until the runtime\'s next '
        "delayed task is due. While polls are parked, the instance that wrote it renews it in "
        "Redis for another such life (no Postgres query) as long as nothing changed in the "
        "runtime's tasks.",
    ),
    Variable(
        "GATEWAY_VERSION_TTL_SECONDS",
        "version_ttl_seconds",
        "integer",
        7 * 24 * 3600,
        low=60,
        high=365 * 86400,
        unit="seconds",
        doc="Life of a runtime's version key in Redis, renewed by every bump. When it lapses "
        "the next claim starts a new epoch, so no old verdict can match again and nothing "
        "is lost; a short life only costs a Postgres scan for runtimes idle that long.",
    ),
    Variable(
        "GATEWAY_REDIS_TIMEOUT_MS",
        "redis_timeout_ms",
        "integer",
        250,
        low=1,
        high=60_000,
        unit="milliseconds",
        doc="Budget of one Redis attempt; at most one retry, then the gateway falls back to "
        "Postgres.",
    ),
    Variable(
        "GATEWAY_REDIS_MAX_CONNECTIONS",
        "redis_max_connections",
        "integer",
        DEFAULT_REDIS_MAX_CONNECTIONS,
        low=1,
        high=MAX_REDIS_MAX_CONNECTIONS,
        unit="connections",
        doc="Redis connections per process for commands (verdicts, bumps, wake-up publishes), "
        "to each node in `cluster` mode; the pub/sub connection comes on top. A call beyond "
        "the bound waits for a connection, up to `GATEWAY_REDIS_TIMEOUT_MS`, then falls back "
        "to Postgres like a failed call, but without counting towards the circuit breaker "
        "(see `gateway_redis_pool_timeouts_total`). Size it so that replicas x (this + 1) "
        "stays under Redis's `maxclients`.",
    ),
    Variable(
        "GATEWAY_NEAR_CACHE",
        "near_cache_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="Each process keeps the empty verdicts of the runtimes whose polls it serves, so "
        "that an empty poll costs no Redis round trip; a copy is dropped at the runtime's "
        "next wake-up from any instance, when Redis fails or the wake-up connection is down, "
        "and at the verdict's life in Redis. `off` reads Redis for every check.",
    ),
)
