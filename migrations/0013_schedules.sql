-- Schedules: recurring tasks per runtime (docs/guides/schedules.md), and the record of
-- every tick, which is what makes a tick's task exactly one.
--
-- A schedule's definition is its timing (cron or every_seconds, in a time zone), its
-- task template and its policies. `version` grows with every change of the definition:
-- the statement that makes a tick's task joins the schedule at the version the tick was
-- computed from, so a definition replaced or deleted makes no task once the PUT or
-- DELETE has answered (docs/design.md, "Schedules").
--
-- Live tables: runs in one transaction. Creating the two tables takes no lock on
-- another table. The two columns added to tasks are nullable without a default, which
-- Postgres records in its catalog without rewriting the table; the index build reads
-- the whole task table while writes to it wait (reads go on). On a large busy table,
-- build it by hand first with CREATE INDEX CONCURRENTLY (same name and definition): IF
-- NOT EXISTS then skips the build. If a long transaction holds the table for more than
-- 5 s, the migration fails instead (nothing applied) and can be run again.
SET LOCAL lock_timeout = '5s';

CREATE TABLE schedules (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    runtime_id       text        NOT NULL,
    name             text        NOT NULL,
    version          integer     NOT NULL DEFAULT 1,
    -- The timing: exactly one of cron (5 or 6 fields) and every_seconds.
    cron             text,
    every_seconds    integer     CHECK (every_seconds >= 1),
    timezone         text        NOT NULL DEFAULT 'UTC',
    -- The task template.
    payload          jsonb       NOT NULL,
    priority         integer     NOT NULL DEFAULT 50 CHECK (priority BETWEEN 0 AND 1000),
    ttl_seconds      float8,
    max_attempts     integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    -- The policies.
    overlap          text        NOT NULL DEFAULT 'skip'
                     CHECK (overlap IN ('allow', 'skip', 'buffer_one', 'cancel_previous')),
    catch_up_seconds float8      NOT NULL DEFAULT 60 CHECK (catch_up_seconds >= 0),
    jitter_seconds   float8      NOT NULL DEFAULT 0 CHECK (jitter_seconds >= 0),
    paused           boolean     NOT NULL DEFAULT false,
    note             text,
    -- The next tick not yet decided: the tick pass takes schedules whose time has come.
    next_tick_at     timestamptz NOT NULL,
    last_tick_at     timestamptz,
    last_task_id     uuid,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (runtime_id, name),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

-- The tick pass's scan: due schedules, oldest tick first, in bounded batches.
CREATE INDEX schedules_due_idx ON schedules (next_tick_at) WHERE NOT paused;

-- One row per decided tick. The primary key is the guarantee: the task of a tick is
-- inserted in the statement that inserts its row, so a second instance, a retried pass
-- or a backfill over the same range finds the key taken and makes no second task.
CREATE TABLE schedule_ticks (
    schedule_id bigint      NOT NULL REFERENCES schedules (id) ON DELETE CASCADE,
    tick_at     timestamptz NOT NULL,
    outcome     text        NOT NULL
                CHECK (outcome IN ('enqueued', 'skipped_overlap', 'skipped_late', 'failed')),
    task_id     uuid,
    -- The definition's version the tick was decided with, and what decided it.
    version     integer     NOT NULL,
    source      text        NOT NULL CHECK (source IN ('schedule', 'trigger', 'backfill')),
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (schedule_id, tick_at),
    CHECK ((outcome = 'enqueued') = (task_id IS NOT NULL))
);

-- Retention (GATEWAY_SCHEDULE_TICKS_DAYS): the janitor deletes the oldest ticks.
CREATE INDEX schedule_ticks_age_idx ON schedule_ticks (tick_at);

-- The schedule that made a task, and its tick's time; null for every other task.
ALTER TABLE tasks ADD COLUMN schedule text, ADD COLUMN scheduled_for timestamptz;

-- `GET /v1/runtimes/{rt}/tasks?schedule=NAME`: a schedule's tasks oldest first, keyset
-- pagination as tasks_runtime_created_idx serves the unfiltered listing. Only tasks made
-- by a schedule have an entry, so other enqueues write nothing to it.
CREATE INDEX IF NOT EXISTS tasks_schedule_idx ON tasks (runtime_id, schedule, created_at, id)
    WHERE schedule IS NOT NULL;
