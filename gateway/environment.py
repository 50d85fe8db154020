"""Every environment variable the gateway reads, each declared once.

A declaration (Variable, gateway/variable.py) holds the variable's name, the Settings
field it sets, how its text is read (kind, default, bounds or choices, unit) and one
paragraph on what it means. `Settings.from_env` reads the environment through these
declarations alone, and the configuration reference of the documentation is written
from them, so a variable cannot be read without being documented.
"""

from __future__ import annotations

from .variable import Variable

MIN_ADMIN_TOKEN_CHARS = 32
LOG_FORMATS = ("text", "json")
SWITCH = ("on", "off")  # what the reference shows; true/false, 1/0 and yes/no are read too
MAX_JSON_DEPTH_LIMIT = 200
REDIS_MODES = ("standalone", "cluster", "sentinel")
# Connections of one process's command client (per node in a cluster). A call on the
# claim path holds one for well under a millisecond, so 64 serve tens of thousands of
# calls a second, four times the default GATEWAY_MAX_CONCURRENT_CLAIMS; and 150
# processes, each with its pub/sub connection, stay under Redis's default maxclients
# (10,000). A call beyond the bound waits for a connection (gateway/redis/slots.py).
DEFAULT_REDIS_MAX_CONNECTIONS = 64
MAX_REDIS_MAX_CONNECTIONS = 10_000  # Redis's default maxclients: more could never open

# Every environment variable `Settings.from_env` reads, and no other: it refuses to read
# a name missing here, so deployment checks can trust ENV_NAMES, and the configuration
# reference (docs/hooks) is written from these declarations; a doc's links are paths from
# the documentation's root, docs/.
VARIABLES: tuple[Variable, ...] = (
    Variable(
        "DATABASE_URL",
        "database_url",
        "optional",
        None,
        shown_default="(embedded with `--embedded`)",
        doc="Postgres 14 or newer, directly or through PgBouncer (see "
        "[Running behind PgBouncer](operations/pgbouncer.md)).",
    ),
    Variable(
        "GATEWAY_DIRECT_DATABASE_URL",
        "direct_database_url",
        "optional",
        None,
        shown_default="(`DATABASE_URL`)",
        doc="A `postgresql://` URL to the same database that bypasses any pooler: the "
        "janitor's advisory lock and `gateway migrate` (and `serve --migrate`) use it. "
        "Required when `DATABASE_URL` goes through a transaction pooler.",
    ),
    Variable(
        "REDIS_URL",
        "redis_url",
        "optional",
        None,
        shown_default="(embedded with `--embedded`)",
        doc="Redis 6.2 or newer, or Valkey. How it is read depends on `GATEWAY_REDIS_MODE`.",
    ),
    Variable(
        "GATEWAY_ADMIN_TOKEN",
        "admin_token",
        "optional",
        None,
        shown_default="(required unless auth is off)",
        doc=f"The bootstrap admin's bearer token, at least {MIN_ADMIN_TOKEN_CHARS} characters. "
        "Never logged.",
    ),
    Variable(
        "GATEWAY_AUTH",
        "auth_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="`off` disables authentication: local development only, loudly logged. Signed "
        "webhooks are checked either way.",
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
        "GATEWAY_MAX_WAIT_SECONDS",
        "max_wait_seconds",
        "number",
        60.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="Largest `wait_seconds` a claim, or a wait for a task's result, may ask for.",
    ),
    Variable(
        "GATEWAY_DEFAULT_LEASE_SECONDS",
        "default_lease_seconds",
        "integer",
        60,
        low=1,
        high=3600,
        unit="seconds",
        doc="Lease length when a claim does not say.",
    ),
    Variable(
        "GATEWAY_MAX_PAYLOAD_BYTES",
        "max_payload_bytes",
        "integer",
        1_048_576,
        low=1,
        high=1 << 30,
        unit="bytes",
        doc="Largest `payload` (and `result`), counted as written out in full: a larger one "
        "is `413`.",
    ),
    Variable(
        "GATEWAY_MAX_BODY_BYTES",
        "max_body_bytes",
        "integer",
        16_777_216,
        low=1,
        high=1 << 31,
        unit="bytes",
        doc="Largest request body as sent, and most that its payloads or results may come to "
        "together, written out. A body being received is held in memory, so size this for "
        "your concurrency.",
    ),
    Variable(
        "GATEWAY_JANITOR_INTERVAL_SECONDS",
        "janitor_interval_seconds",
        "number",
        5.0,
        low=0.05,
        high=3600,
        unit="seconds",
        doc="Time between janitor passes; a lapsed lease is taken back within it.",
    ),
    Variable(
        "GATEWAY_JANITOR_VACUUM_DEAD_ROWS",
        "janitor_vacuum_dead_rows",
        "integer",
        100_000,
        low=0,
        high=2_000_000_000,
        unit="rows",
        doc="Dead row versions in the task table (Postgres's own count) at which the "
        "janitor runs `VACUUM (ANALYZE) tasks` itself, after a burst of completions or "
        "deletes, instead of waiting for autovacuum; it blocks no read or write. `0`: "
        "leave it to autovacuum.",
    ),
    Variable(
        "GATEWAY_RETENTION_SECONDS",
        "retention_seconds",
        "number",
        7 * 86400.0,
        low=0,
        high=10 * 365 * 86400,
        unit="seconds",
        shown_default="`604800` (7 days)",
        doc="Age after which `completed`, `cancelled` and `expired` tasks are deleted.",
    ),
    Variable(
        "GATEWAY_DEAD_RETENTION_SECONDS",
        "dead_retention_seconds",
        "number",
        30 * 86400.0,
        low=0,
        high=10 * 365 * 86400,
        unit="seconds",
        shown_default="`2592000` (30 days)",
        doc="Age after which `dead` tasks are deleted.",
    ),
    Variable(
        "GATEWAY_SCHEDULE_TICKS_DAYS",
        "schedule_ticks_days",
        "integer",
        30,
        low=1,
        high=3650,
        unit="days",
        doc="How long every schedule tick is recorded (its outcome and task), which is what "
        "makes a tick's task exactly one: the janitor deletes older ticks, and a backfill "
        "may not reach further back.",
    ),
    Variable(
        "GATEWAY_HISTORY_DAYS",
        "history_days",
        "integer",
        7,
        low=1,
        high=3650,
        unit="days",
        doc="How long the per-runtime history (what happened to each runtime's tasks per "
        "bucket of time: GET /v1/runtimes/{rt}/history, GET /v1/history) is kept: the "
        "janitor deletes older buckets, a batch at a time.",
    ),
    Variable(
        "GATEWAY_HISTORY_INTERVAL_SECONDS",
        "history_interval_seconds",
        "integer",
        60,
        low=1,
        high=3600,
        unit="seconds",
        doc="The width of the history's buckets. The janitor's leader hands it to the "
        "database, where the counts are kept; every instance should have the same value. "
        "A change applies to new buckets only: the buckets already written keep their "
        "width.",
    ),
    Variable(
        "GATEWAY_MAX_CONCURRENT_CLAIMS",
        "max_concurrent_claims",
        "integer",
        16,
        low=1,
        high=10_000,
        unit="claims",
        doc="Postgres claims in flight per process; more wait in line.",
    ),
    Variable(
        "GATEWAY_MAX_QUEUED_CLAIMS",
        "max_queued_claims",
        "integer",
        1000,
        low=0,
        high=1_000_000,
        unit="claims",
        doc="Claims that may wait in that line before new ones get `429`.",
    ),
    Variable(
        "GATEWAY_DB_POOL_MAX",
        "db_pool_max",
        "integer",
        20,
        low=2,
        high=1000,
        unit="connections",
        doc="Postgres connections per process.",
    ),
    Variable(
        "GATEWAY_DB_ACQUIRE_TIMEOUT_MS",
        "db_acquire_timeout_ms",
        "integer",
        5_000,
        low=10,
        high=600_000,
        unit="milliseconds",
        doc="How long a request waits for one of those connections (or for Postgres to accept "
        "a new one) before it is refused with `503`, code `database_busy`, and "
        "`Retry-After: 1`; nothing was sent to Postgres, so the request may be retried as "
        "it is.",
    ),
    Variable(
        "GATEWAY_DB_CONNECT_TIMEOUT_MS",
        "db_connect_timeout_ms",
        "integer",
        2_000,
        low=100,
        high=600_000,
        unit="milliseconds",
        doc="How long each host of a `DATABASE_URL` (or `GATEWAY_DIRECT_DATABASE_URL`) that "
        "names several hosts may take to accept a new connection "
        "(`postgresql://...@10.0.0.1:5432,10.0.0.2:5432/db?target_session_attrs=read-write`; "
        "such a URL must say `target_session_attrs=read-write` or `primary`). A host that "
        "does not answer within this time, or answers with an error, or is not what "
        "`target_session_attrs` asks for, is passed over for the next, and the host that "
        "took the last connection is tried first. It must be less than "
        "`GATEWAY_DB_ACQUIRE_TIMEOUT_MS`. A URL of one host has nothing to pass on to: "
        "a new connection to it may take up to `GATEWAY_DB_ACQUIRE_TIMEOUT_MS`. See "
        "[Failover](operations/failover.md).",
    ),
    Variable(
        "GATEWAY_DB_QUEUE_BUDGET_MS",
        "db_queue_budget_ms",
        "number",
        250.0,
        low=1,
        high=600_000,
        unit="milliseconds",
        doc="Load shedding: the longest an enqueue, claim or read may expect to wait for a "
        "database connection (its place in line times the mean hold). Past it, it is "
        "refused at once with `503 database_busy` (`429 overloaded` for a claim) and "
        "`Retry-After`. Completes, fails, heartbeats and releases go first, never shed.",
    ),
    Variable(
        "GATEWAY_DB_STATEMENT_CACHE_SIZE",
        "db_statement_cache_size",
        "integer",
        100,
        low=0,
        high=100_000,
        unit="statements",
        doc="The cache of prepared statements asyncpg keeps per connection; `0` turns it off, as a "
        "transaction pooler requires.",
    ),
    Variable(
        "GATEWAY_SHUTDOWN_GRACE_SECONDS",
        "shutdown_grace_seconds",
        "number",
        25.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="How long SIGTERM waits for in-flight requests.",
    ),
    Variable(
        "GATEWAY_STARTUP_RETRY_SECONDS",
        "startup_retry_seconds",
        "number",
        0.0,
        low=0,
        high=3600,
        unit="seconds",
        doc="How long `gateway serve` waits at start for Postgres to answer and its schema "
        "to be current, for a pod that starts before its database. Meanwhile it listens: "
        "`/healthz` answers `200`, `/readyz` `503` saying what it waits for. When the time "
        "runs out it exits as it would have at once. `0`: no waiting; see "
        "[Starting the gateway](operations/startup.md).",
    ),
    # orjson writes at most ~254 levels: what is accepted must be answerable.
    Variable(
        "GATEWAY_MAX_JSON_DEPTH",
        "max_json_depth",
        "integer",
        64,
        low=1,
        high=MAX_JSON_DEPTH_LIMIT,
        unit="levels",
        doc="Deepest nesting of a `payload`, `result` or webhook body; deeper is `422` naming "
        "the field.",
    ),
    Variable(
        "GATEWAY_READ_TIMEOUT_SECONDS",
        "read_timeout_seconds",
        "number",
        30.0,
        low=0.1,
        high=3600,
        unit="seconds",
        doc="Time for a request's head and body to arrive (then `408` and the connection is "
        "closed), and how long an answer may wait for its client with less than 16 KiB "
        "leaving (then the connection is cut).",
    ),
    Variable(
        "GATEWAY_MAX_PARKED_POLLS",
        "max_parked_polls",
        "integer",
        10_000,
        low=0,
        high=10_000_000,
        unit="requests",
        doc="Requests that may wait at once on one instance (claims waiting for work, and "
        "waits for a task's result); beyond, a request that would wait gets `429`.",
    ),
    Variable(
        "GATEWAY_DEGRADED_POLL_SECONDS",
        "degraded_poll_seconds",
        "number",
        1.0,
        low=0.05,
        high=60,
        unit="seconds",
        doc="While wake-ups may be lost (Redis failing, pub/sub down), how often a parked "
        "poll (or a wait for a task's result) checks Postgres instead; also how soon they "
        "re-check once Redis starts failing.",
    ),
    Variable(
        "GATEWAY_LOG_FORMAT",
        "log_format",
        "choice",
        "text",
        choices=LOG_FORMATS,
        doc="`gateway serve`'s log lines: `text` for people, `json` (one object per line, "
        "uvicorn's lines included) for a log collector; see "
        "[Logs and metrics](operations/metrics.md).",
    ),
    Variable(
        "GATEWAY_ACCESS_LOG_SAMPLE",
        "access_log_sample",
        "number",
        0.1,
        low=0,
        high=1,
        unit="share of requests",
        doc="The share of successful requests (status below 400, answered within a second) "
        "that get an access line, spread evenly: 0.1 is every tenth. Every error and every "
        "slower request always gets one; `1` logs every request. See "
        "[Logs and metrics](operations/metrics.md) for what a line costs.",
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
    Variable(
        "GATEWAY_SYNC_MATCH",
        "sync_match_enabled",
        "switch",
        True,
        choices=SWITCH,
        doc="An enqueue (`POST /v1/runtimes/{rt}/tasks`) of a task due now, on an instance "
        "with polls parked for its runtime, writes the task already leased to the oldest of "
        "them in its own statement: no claim statement, no bump, no Redis round trip. It "
        "falls back to the usual path (bump, wake-up, claim) when runtime controls apply to "
        "the runtime, a wake-up is pending, or no poll is parked; a poll that left meanwhile "
        "gets nothing and the task goes back to the queue. `off`: every enqueue takes the "
        "usual path.",
    ),
)
ENV_NAMES = frozenset(variable.name for variable in VARIABLES)
