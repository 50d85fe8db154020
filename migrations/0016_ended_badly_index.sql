-- gateway: no-transaction
-- A runtime's tasks that ended dead, expired or cancelled, newest first: what a bulk
-- retry (POST /v1/runtimes/{rt}/tasks:retry) and the error groups
-- (GET /v1/runtimes/{rt}/errors) read. Without it they could only walk the runtime's
-- newest tasks of every status, and a dead task behind many completed ones was out of
-- their reach. Only those three statuses are indexed, so the claim path, enqueues and
-- completions write nothing more to it; built without blocking writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS tasks_ended_badly_idx
    ON tasks (runtime_id, status, created_at)
    WHERE status IN ('dead', 'expired', 'cancelled');
