-- Per-runtime history: what happened to a runtime's tasks in each bucket of time
-- (docs/guides/history.md), kept by the statements that change the tasks, in their
-- own transaction, as task_counts is (0005, 0008, 0011).
--
-- One statement-level trigger per kind of statement (insert, update) reads the
-- statement's transition tables and writes one row per runtime it touched, into the
-- row of its own backend (pg_backend_pid()) for the current bucket: concurrent
-- statements never wait on one counter row, and a statement that changes no task's
-- status (a heartbeat, an idempotent replay) writes nothing. The janitor's leader folds
-- the per-backend rows of ended buckets into the backend-0 row, writes the queue depth
-- and the oldest queued age of the bucket that just ended into it, and deletes buckets
-- past GATEWAY_HISTORY_DAYS.
--
-- Runs in one transaction. CREATE TRIGGER takes a brief exclusive lock on tasks; there
-- is no scan, so the table's size does not matter. If a long transaction holds the
-- table for more than 5 s, the migration fails instead (nothing applied) and can be
-- run again. Tasks changed before it are not in the history.
SET LOCAL lock_timeout = '5s';

-- The bucket width, GATEWAY_HISTORY_INTERVAL_SECONDS, as the janitor's leader last
-- wrote it: the triggers run inside Postgres and read it from here (one row).
CREATE TABLE history_settings (
    one              boolean PRIMARY KEY DEFAULT true CHECK (one),
    interval_seconds integer NOT NULL DEFAULT 60 CHECK (interval_seconds > 0)
);
INSERT INTO history_settings DEFAULT VALUES;

-- One row per runtime, bucket (`at`, its start) and backend; backend 0 is the folded
-- row, which only the janitor writes, and which alone carries depth and
-- oldest_queued_age_seconds (null until the janitor's rollup read them). `waits`
-- counts the first claims of the bucket by their wait, one element per wait bucket
-- (history_wait_bucket).
CREATE TABLE task_history (
    runtime_id                text        NOT NULL,
    at                        timestamptz NOT NULL,
    backend                   integer     NOT NULL,
    enqueued                  bigint      NOT NULL DEFAULT 0,
    claimed                   bigint      NOT NULL DEFAULT 0,
    completed                 bigint      NOT NULL DEFAULT 0,
    failed                    bigint      NOT NULL DEFAULT 0,
    dead                      bigint      NOT NULL DEFAULT 0,
    expired                   bigint      NOT NULL DEFAULT 0,
    cancelled                 bigint      NOT NULL DEFAULT 0,
    waits                     bigint[]    NOT NULL,
    depth                     bigint,
    oldest_queued_age_seconds float8,
    PRIMARY KEY (runtime_id, at, backend)
);

-- The fleet's reads and retention walk the buckets by time.
CREATE INDEX task_history_at_idx ON task_history (at);
-- The rows the janitor has yet to fold, found without reading the folded ones.
CREATE INDEX task_history_unfolded_idx ON task_history (at) WHERE backend <> 0;

-- The wait buckets' bounds in seconds: element i of `waits` (from 1) counts the
-- waits in [bound i-1, bound i), the first from 0, the last with no upper bound.
-- gateway/store/history.py holds the same list (WAIT_BOUNDS_SECONDS), and a test
-- checks that they agree.
CREATE FUNCTION history_wait_bucket(seconds float8) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT width_bucket(seconds,
        ARRAY[0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]::float8[]) + 1
$$;

-- Two `waits` added element by element (the triggers' upserts). Written out, not
-- unnested and aggregated: a simple SQL function, which Postgres inlines.
CREATE FUNCTION history_waits_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY[a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5],
                 a[6] + b[6], a[7] + b[7], a[8] + b[8], a[9] + b[9], a[10] + b[10],
                 a[11] + b[11], a[12] + b[12], a[13] + b[13], a[14] + b[14]]
$$;

-- The start of the bucket holding the transaction's time. PL/pgSQL, not SQL: a SQL
-- function that reads a table is not inlined, and was planned again at every call,
-- 0.1 ms of every statement on tasks; PL/pgSQL keeps its plan for the session.
CREATE FUNCTION history_bucket() RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
DECLARE
    width integer;
BEGIN
    SELECT interval_seconds INTO width FROM history_settings;
    RETURN to_timestamp(floor(extract(epoch FROM now()) / width) * width);
END
$$;

-- Updates: each task whose status changed, old row beside new (by id). What counts
-- where (docs/guides/history.md):
--   enqueued   a finished task queued again (a retry of a dead, expired or cancelled one)
--   claimed    queued or scheduled -> claimed; its wait counted when it is the first
--              claim (attempts 1): from created_at, or run_at when later
--   completed  -> completed
--   failed     claimed -> queued or scheduled: a failure reported with a retry, a lease
--              that lapsed (the janitor queued it again) or a release; not the give-back
--              of a claim never delivered (attempts go down)
--   dead       -> dead (a last failure, a lapse on the last attempt, an undeliverable task)
--   expired    -> expired
--   cancelled  -> cancelled
CREATE FUNCTION task_history_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_history AS h (runtime_id, at, backend, enqueued, claimed, completed,
                                   failed, dead, expired, cancelled, waits)
    SELECT runtime_id, history_bucket(), pg_backend_pid(),
           count(*) FILTER (WHERE new_status IN ('queued', 'scheduled')
                              AND old_status IN ('completed', 'dead', 'expired', 'cancelled')),
           count(*) FILTER (WHERE new_status = 'claimed'),
           count(*) FILTER (WHERE new_status = 'completed'),
           count(*) FILTER (WHERE new_status IN ('queued', 'scheduled') AND old_status = 'claimed'
                              AND NOT given_back),
           count(*) FILTER (WHERE new_status = 'dead'),
           count(*) FILTER (WHERE new_status = 'expired'),
           count(*) FILTER (WHERE new_status = 'cancelled'),
           ARRAY[count(*) FILTER (WHERE w = 1), count(*) FILTER (WHERE w = 2),
                 count(*) FILTER (WHERE w = 3), count(*) FILTER (WHERE w = 4),
                 count(*) FILTER (WHERE w = 5), count(*) FILTER (WHERE w = 6),
                 count(*) FILTER (WHERE w = 7), count(*) FILTER (WHERE w = 8),
                 count(*) FILTER (WHERE w = 9), count(*) FILTER (WHERE w = 10),
                 count(*) FILTER (WHERE w = 11), count(*) FILTER (WHERE w = 12),
                 count(*) FILTER (WHERE w = 13), count(*) FILTER (WHERE w = 14)]
      FROM (
        SELECT n.runtime_id, o.status AS old_status, n.status AS new_status,
               n.attempts < o.attempts AS given_back,
               -- The wait bucket of a first claim, else null.
               CASE WHEN n.status = 'claimed' AND n.attempts = 1
                    THEN history_wait_bucket(extract(epoch FROM
                             n.updated_at - greatest(n.created_at, n.run_at))::float8)
               END AS w
          FROM old_rows o JOIN new_rows n ON n.id = o.id
         -- A promotion (scheduled -> queued) changes the status and counts nothing.
         WHERE n.status <> o.status
           AND NOT (n.status IN ('queued', 'scheduled') AND o.status IN ('queued', 'scheduled'))
      ) AS moved
     GROUP BY runtime_id
     -- Key order, as every writer of task_history.
     ORDER BY runtime_id
    ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
        enqueued = h.enqueued + EXCLUDED.enqueued,
        claimed = h.claimed + EXCLUDED.claimed,
        completed = h.completed + EXCLUDED.completed,
        failed = h.failed + EXCLUDED.failed,
        dead = h.dead + EXCLUDED.dead,
        expired = h.expired + EXCLUDED.expired,
        cancelled = h.cancelled + EXCLUDED.cancelled,
        waits = history_waits_add(h.waits, EXCLUDED.waits);
    RETURN NULL;
END
$$;

-- Transition tables rule out a column list (UPDATE OF status): the trigger runs after
-- every UPDATE statement on tasks, and the WHERE clause above does the filtering.
CREATE TRIGGER task_history_moved AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_history_moved();

-- Inserts: every new live task is enqueued; one inserted already claimed (a sync
-- match hands it to a parked poll in the same statement) is claimed too, its wait 0.
CREATE FUNCTION task_history_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_history AS h (runtime_id, at, backend, enqueued, claimed, waits)
    SELECT runtime_id, history_bucket(), pg_backend_pid(),
           count(*),
           count(*) FILTER (WHERE status = 'claimed'),
           ARRAY[count(*) FILTER (WHERE w = 1), count(*) FILTER (WHERE w = 2),
                 count(*) FILTER (WHERE w = 3), count(*) FILTER (WHERE w = 4),
                 count(*) FILTER (WHERE w = 5), count(*) FILTER (WHERE w = 6),
                 count(*) FILTER (WHERE w = 7), count(*) FILTER (WHERE w = 8),
                 count(*) FILTER (WHERE w = 9), count(*) FILTER (WHERE w = 10),
                 count(*) FILTER (WHERE w = 11), count(*) FILTER (WHERE w = 12),
                 count(*) FILTER (WHERE w = 13), count(*) FILTER (WHERE w = 14)]
      FROM (
        SELECT runtime_id, status,
               CASE WHEN status = 'claimed'
                    THEN history_wait_bucket(extract(epoch FROM
                             updated_at - greatest(created_at, run_at))::float8)
               END AS w
          FROM new_rows
         WHERE status IN ('queued', 'scheduled', 'claimed')
      ) AS added
     GROUP BY runtime_id
     ORDER BY runtime_id
    ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
        enqueued = h.enqueued + EXCLUDED.enqueued,
        claimed = h.claimed + EXCLUDED.claimed,
        waits = history_waits_add(h.waits, EXCLUDED.waits);
    RETURN NULL;
END
$$;

CREATE TRIGGER task_history_inserted AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_history_inserted();
