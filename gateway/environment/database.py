"""The variables of Postgres: where it is, the pool, its timeouts and the line of work
waiting for a connection (gateway/admission.py)."""

from __future__ import annotations

from ..variable import Variable

TITLE = "Postgres"
DATABASE: tuple[Variable, ...] = (
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
        "GATEWAY_DB_STATEMENT_TIMEOUT_MS",
        "db_statement_timeout_ms",
        "integer",
        10_000,
        low=100,
        high=3_600_000,
        unit="milliseconds",
        doc="How long one statement (or transaction) may run in Postgres before it is "
        "cancelled and its request answered `503`: it bounds what a slow query or a lock "
        "wait can hold. Raise it only for a heavy read you need, such as the fleet's "
        "history over a long window on a large fleet.",
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
        "`Retry-After`. While the line stands (the work given a connection for 100 ms all "
        "waited longer than a tenth of this), work is let in for a tenth of it only. "
        "Completes, fails, heartbeats and releases go first, never shed.",
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
)
