-- Finished-task counts kept once per statement, not once per row (docs/design.md,
-- "5.1 Stats").
--
-- Migration 0005 counted transitions with a row trigger: one upsert of the backend's
-- counter row per task that entered or left a finished status. A statement that
-- finishes many tasks of one runtime (a batch complete or fail, the janitor's expiry
-- and reclaim batches, a bulk cancel) updated that one counter row once per task in
-- one transaction, and each update walked the row versions the earlier ones left:
-- time quadratic in the batch (about 75 ms more for 1,000 tasks of one runtime).
--
-- Now one AFTER UPDATE trigger per statement reads the statement's old and new rows
-- and writes one net delta per runtime and finished status: +1 for each new row in a
-- finished status, -1 for each old row in one. A row whose status did not change
-- nets to zero and writes nothing, so claims and heartbeats cost a trigger call that
-- finds no finished rows, and no counter write.
--
-- Inserts keep 0005's row trigger: no gateway path inserts a finished task, so it
-- never runs in practice, and its WHEN clause keeps it off the enqueue path. (A bulk
-- load of finished rows should go with triggers off and its counts written as 0005's
-- backfill writes them.)
--
-- Runs in one transaction. DROP TRIGGER and CREATE TRIGGER take a brief exclusive
-- lock on tasks; there is no scan. No count is lost or doubled across the switch: a
-- statement runs entirely under one trigger or the other.

DROP TRIGGER task_counts_update ON tasks;

CREATE FUNCTION task_counts_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (runtime_id, status, backend, n)
    SELECT runtime_id, status, pg_backend_pid(), sum(delta) FROM (
        SELECT runtime_id, status, 1 AS delta FROM new_rows
         WHERE status IN ('completed', 'dead', 'expired', 'cancelled')
        UNION ALL
        SELECT runtime_id, status, -1 FROM old_rows
         WHERE status IN ('completed', 'dead', 'expired', 'cancelled')
    ) AS moved
     GROUP BY runtime_id, status
    HAVING sum(delta) <> 0
     -- Key order, as the other writers of task_counts (the delete trigger, the fold).
     ORDER BY runtime_id, status
    ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

-- Transition tables rule out a column list (UPDATE OF status): the trigger runs after
-- every UPDATE statement on tasks, and the WHERE clauses above do the filtering.
CREATE TRIGGER task_counts_moved AFTER UPDATE ON tasks
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_moved();

-- The row function now serves inserts only.
CREATE OR REPLACE FUNCTION task_counts_track() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (runtime_id, status, backend, n)
    VALUES (NEW.runtime_id, NEW.status, pg_backend_pid(), 1)
    ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + 1;
    RETURN NULL;
END
$$;
