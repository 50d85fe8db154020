-- gateway: no-transaction
-- Retention finds finished rows by age without scanning the table.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_finished_idx ON tasks (finished_at)
    WHERE finished_at IS NOT NULL;
