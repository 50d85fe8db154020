-- Finished tasks inserted by one statement are counted once per statement, as 0008
-- counts updates and 0005 counts deletes (docs/design.md, "5.1 Stats").
--
-- Migration 0005's insert trigger ran once per row: a statement inserting finished
-- tasks (an import, a restore, a test's load) upserted the backend's counter row once
-- per inserted row in one transaction, and each upsert walked the row versions the
-- earlier ones left behind: time quadratic in the rows. 200,000 finished rows of one
-- runtime did not finish within 60 s; a load of 1,000,000 was stopped after 7 minutes.
--
-- Now one AFTER INSERT trigger per statement reads the statement's new rows (its
-- transition table), groups the finished ones by runtime and status, and writes one
-- delta for each: a load of N finished rows costs one pass over them and one counter
-- write per runtime and status, whatever N is. An INSERT of live tasks (every enqueue,
-- a sync match's already-leased task) and one that inserts nothing (an idempotent
-- replay) finds no finished row and writes no counter. The price is on those inserts:
-- Postgres keeps a copy of each statement's new rows for the trigger and calls it once.
-- Measured with EXPLAIN ANALYZE on 2 cores: the call took 0.02 ms of a single enqueue's
-- 0.1 ms and 0.2 ms of a 1,000-task batch's 11 to 16 ms (small payloads); a batch
-- whose rows exceed work_mem (4 MB by default; 1,000 payloads of 10 kB) spills that
-- copy to a temporary file, and took 59 ms where it took 46.
--
-- Lock order: the counter rows are written in key order (runtime_id, status), as the
-- update and delete triggers (0008, 0005) and the janitor's fold write them, so that two
-- writers of task_counts that meet on the same rows wait for each other instead of
-- deadlocking. (The rows a trigger writes are its backend's own, so only the fold, which
-- takes per-backend rows with SKIP LOCKED and writes the backend-0 rows, can meet it.)
--
-- The trigger keeps its name, task_counts_insert, so that a tool that turns it off for
-- a bulk load (ALTER TABLE tasks DISABLE TRIGGER task_counts_insert) still finds it.
--
-- Runs in one transaction. DROP TRIGGER and CREATE TRIGGER take a brief exclusive lock
-- on tasks; there is no scan, so the table's size does not matter. Every enqueue and
-- claim queues behind that lock while the migration waits for it: if a long transaction
-- holds the table for more than 5 s, the migration fails instead (nothing applied) and
-- can be run again. No count is lost or doubled across the switch: a statement runs
-- entirely under one trigger or the other.
SET LOCAL lock_timeout = '5s';

DROP TRIGGER task_counts_insert ON tasks;

CREATE FUNCTION task_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_counts AS c (runtime_id, status, backend, n)
    SELECT runtime_id, status, pg_backend_pid(), count(*) FROM new_rows
     WHERE status IN ('completed', 'dead', 'expired', 'cancelled')
     GROUP BY runtime_id, status
     -- Key order, as the other writers of task_counts (the update and delete
     -- triggers, the fold).
     ORDER BY runtime_id, status
    ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

-- Transition tables rule out a WHEN clause: the trigger runs after every INSERT
-- statement on tasks, and the WHERE clause above does the filtering.
CREATE TRIGGER task_counts_insert AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION task_counts_inserted();

-- 0005's row function served inserts alone since 0008; nothing calls it now.
DROP FUNCTION task_counts_track();
