"""The variables of maintenance: the janitor's passes, the retention of finished
tasks and schedule ticks, and the per-runtime history."""

from __future__ import annotations

from ..variable import Variable

TITLE = "Maintenance: the janitor, retention and history"
MAINTENANCE: tuple[Variable, ...] = (
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
        "GATEWAY_JANITOR_BATCH_SIZE",
        "janitor_batch_size",
        "integer",
        1000,
        low=10,
        high=50_000,
        unit="rows",
        doc="Rows one janitor statement handles: lapsed leases taken back, tasks expired "
        "or made due, finished tasks and old ticks deleted, counts and history folded, "
        "runtimes per page of the verdict repair's walk. A pass runs at most ten batches "
        "of each step and leaves the rest "
        "to the next, so a fleet whose history or retention falls behind raises it (or "
        "shortens GATEWAY_JANITOR_INTERVAL_SECONDS); each batch is one statement, held to "
        "GATEWAY_DB_STATEMENT_TIMEOUT_MS.",
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
)
