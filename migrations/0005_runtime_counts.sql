-- Stats that do not grow with history (docs/design.md, "5.1 Stats").
--
-- Live tasks (queued, scheduled, claimed) are counted exactly from tasks_live_idx, in
-- time proportional to the runtime's live rows. Finished tasks (completed, dead,
-- expired, cancelled) are counted in task_counts, kept by the triggers below in the
-- same transaction as each change, so a read of both is exact and consistent.
--
-- This migration blocks writes to tasks while it builds the index and counts the
-- finished rows already stored (one pass over the table).

-- One row per runtime, finished status and Postgres backend: `n` is that backend's
-- running delta (it can be negative), and the stats add the rows up. A backend runs one
-- transaction at a time, so two transactions never update the same row and concurrent
-- completions of one runtime never wait on each other's counter. The janitor folds the
-- per-backend rows into the backend-0 row (which only it writes), in bounded batches.
CREATE TABLE task_counts (
    runtime_id text    NOT NULL,
    status     text    NOT NULL,
    backend    integer NOT NULL,
    n          bigint  NOT NULL,
    PRIMARY KEY (runtime_id, status, backend)
);

-- The rows the janitor has yet to fold, found without reading the folded ones.
CREATE INDEX task_counts_unfolded_idx ON task_counts (runtime_id, status, backend)
    WHERE backend <> 0;

CREATE FUNCTION task_counts_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Nested IFs, not AND: OLD is null in an INSERT trigger.
    IF TG_OP = 'UPDATE' THEN
        IF OLD.status IN ('completed', 'dead', 'expired', 'cancelled') THEN
            INSERT INTO task_counts AS c (runtime_id, status, backend, n)
            VALUES (OLD.runtime_id, OLD.status, pg_backend_pid(), -1)
            ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n - 1;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.status IN ('completed', 'dead', 'expired', 'cancelled') THEN
            INSERT INTO task_counts AS c (runtime_id, status, backend, n)
            VALUES (NEW.runtime_id, NEW.status, pg_backend_pid(), 1)
            ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + 1;
        END IF;
    END IF;
    RETURN NULL;
END
$$;

-- The WHEN clauses keep the function off the claim and enqueue paths: it runs only
-- when a row enters or leaves a finished status (completion, failure to dead, cancel,
-- expiry, retry).
CREATE TRIGGER task_counts_insert AFTER INSERT ON tasks FOR EACH ROW
    WHEN (NEW.status IN ('completed', 'dead', 'expired', 'cancelled'))
    EXECUTE FUNCTION task_counts_track();
CREATE TRIGGER task_counts_update AFTER UPDATE OF status ON tasks FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (OLD.status IN ('completed', 'dead', 'expired', 'cancelled')
               OR NEW.status IN ('completed', 'dead', 'expired', 'cancelled')))
    EXECUTE FUNCTION task_counts_track();
-- Retention deletes in batches: one upsert per runtime and status for the whole
-- statement, not one per row (row by row, a batch would update one counter row a
-- thousand times in one transaction, each update walking the versions before it).
CREATE FUNCTION task_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (runtime_id, status, backend, n)
    SELECT runtime_id, status, pg_backend_pid(), -count(*) FROM gone
     WHERE status IN ('completed', 'dead', 'expired', 'cancelled')
     GROUP BY runtime_id, status
     ORDER BY runtime_id, status
    ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;
CREATE TRIGGER task_counts_delete AFTER DELETE ON tasks REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_deleted();
-- TRUNCATE skips row triggers: the counts go with the rows.
CREATE FUNCTION task_counts_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM task_counts;
    RETURN NULL;
END
$$;
CREATE TRIGGER task_counts_truncate AFTER TRUNCATE ON tasks FOR EACH STATEMENT
    EXECUTE FUNCTION task_counts_truncate();

-- The finished rows already stored. The triggers exist from here on and CREATE TRIGGER
-- holds off writers until this transaction commits, so no change is missed or counted
-- twice.
INSERT INTO task_counts (runtime_id, status, backend, n)
SELECT runtime_id, status, 0, count(*) FROM tasks
 WHERE status IN ('completed', 'dead', 'expired', 'cancelled')
 GROUP BY runtime_id, status;

-- The live tasks of a runtime, by stored status, with what their reported status
-- depends on (a queued task past expires_at reads as expired): the stats count them
-- with an index-only scan. 'scheduled' (a queued task whose run_at is in the future)
-- is counted as queued.
CREATE INDEX tasks_live_idx ON tasks (runtime_id, status, expires_at)
    WHERE status IN ('queued', 'scheduled', 'claimed');
