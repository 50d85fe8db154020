"""The statements of store/janitor.py (JanitorStatements): lease reclaim, promotion of due
scheduled tasks, TTL expiry, retention purge, the finished-task counts' fold, the queue
depth, the repair walk's pages, the task table's vacuum, and the leadership's advisory
lock.
"""

from __future__ import annotations

# The janitor leader's gauges: tasks per stored status, and the age of the oldest
# claimable queued task (from run_at, or created_at when later). Live rows are counted
# from tasks_live_idx (time proportional to the live rows, not the history); finished
# ones are the sums of task_counts (one row per runtime and status once folded). The
# janitor runs it at most every tenth of its own run time (janitor.DEPTH_DUTY).
QUEUE_DEPTH = """
SELECT status, count(*) AS n,
       extract(epoch FROM clock_timestamp() - min(greatest(run_at, created_at))
               FILTER (WHERE status = 'queued' AND run_at <= now()
                         AND (expires_at IS NULL OR expires_at > now())))::float8 AS oldest
  FROM tasks
 WHERE status IN ('queued', 'scheduled', 'claimed')
 GROUP BY status
UNION ALL
SELECT status, sum(n)::bigint, NULL FROM task_counts GROUP BY status
"""

# Folds up to $1 per-backend rows of task_counts into the backend-0 rows, so that a
# runtime's counts stay a few rows however many backends have come and gone. A row a
# transaction is still changing is skipped (it is folded next time). The upsert goes in
# key order, so that two folds running at once wait for each other instead of
# deadlocking. Returns the backend-0 rows it wrote, for DROP_ZERO_COUNTS.
FOLD_TASK_COUNTS = """
WITH picked AS (
    SELECT runtime_id, status, backend FROM task_counts
     WHERE backend <> 0
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM task_counts c USING picked p
     WHERE (c.runtime_id, c.status, c.backend) = (p.runtime_id, p.status, p.backend)
    RETURNING c.runtime_id, c.status, c.n
)
INSERT INTO task_counts AS c (runtime_id, status, backend, n)
SELECT runtime_id, status, 0, sum(n) FROM moved
 GROUP BY runtime_id, status
 ORDER BY runtime_id, status
ON CONFLICT (runtime_id, status, backend) DO UPDATE SET n = c.n + EXCLUDED.n
RETURNING c.runtime_id, c.status, c.n
"""

# After a fold, in its transaction: a runtime whose finished tasks were all purged
# leaves no row behind.
DROP_ZERO_COUNTS = """
DELETE FROM task_counts c
 USING unnest($1::text[], $2::text[]) AS z(runtime_id, status)
 WHERE (c.runtime_id, c.status, c.backend) = (z.runtime_id, z.status, 0) AND c.n = 0
"""

JANITOR_TRY_LOCK = "SELECT pg_try_advisory_lock($1)"

# Whether the backend answering still holds the lock (a bigint key is stored as classid
# = high 32 bits, objid = low 32 bits, objsubid = 1). On a direct connection it is the
# backend that took it; through a transaction pooler it may be another one, or the lock
# may have been released by another client's reset on the server connection holding it.
JANITOR_HOLDS_LOCK = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
     WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = ($1::bigint >> 32)::oid
       AND objid = ($1::bigint & 4294967295)::oid
       AND objsubid = 1
)
"""

# Expired leases go back to the queue (or die at max_attempts), oldest first, in
# bounded batches. A late report under the lapsed lease is refused (lease_lost): every
# lease operation requires status = 'claimed' and its lease. The lapsed lease id and the
# task's trace context come back for the lease's span (gateway/tracing/spans.py).
RECLAIM_LEASES = """
WITH lapsed AS (
    SELECT id, lease_id FROM tasks
     WHERE status = 'claimed' AND lease_expires_at < now()
     ORDER BY lease_expires_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE tasks t
   SET status = CASE WHEN t.cancel_requested THEN 'cancelled'
                     WHEN t.attempts >= t.max_attempts THEN 'dead'
                     ELSE 'queued' END,
       run_at = clock_timestamp(),
       lease_id = NULL, lease_expires_at = NULL, worker_id = NULL,
       last_error = COALESCE(t.last_error, 'lease expired'),
       finished_at = CASE WHEN t.cancel_requested OR t.attempts >= t.max_attempts
                          THEN clock_timestamp() END,
       updated_at = clock_timestamp()
  FROM lapsed
 WHERE t.id = lapsed.id
RETURNING t.runtime_id, t.status, t.id, lapsed.lease_id, t.trace_parent, t.trace_state
"""

# Scheduled tasks expire too: a retry's backoff may put run_at past expires_at.
EXPIRE_TASKS = """
WITH due AS (
    SELECT id FROM tasks
     WHERE status IN ('queued', 'scheduled') AND expires_at IS NOT NULL
       AND expires_at <= now()
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE tasks t
   SET status = 'expired', finished_at = clock_timestamp(), updated_at = clock_timestamp()
  FROM due
 WHERE t.id = due.id
"""

# Retention: one bounded batch of finished rows older than the cut-off.
PURGE_FINISHED = """
DELETE FROM tasks WHERE id IN (
    SELECT id FROM tasks
     WHERE finished_at < now() - make_interval(secs => $2)
       AND status = ANY($1::text[])
     LIMIT $3
)
"""

# One page of the runtimes with a queued or scheduled task: up to $1 of them, after $2
# in runtime_id order, each with whether it has a task claimable for at least a second.
# A loose index (skip) scan finds each such runtime with one probe of each status's
# index (the next runtime is the lesser of the two), then scalar probes check for a
# due, unexpired task. The page counts runtimes visited, not runtimes found claimable,
# so that a page costs a bounded number of probes even when most runtimes hold only
# delayed tasks; the caller pages through all of them, one bounded page after another,
# with the last runtime visited as the cursor.
CLAIMABLE_RUNTIMES = """
WITH RECURSIVE waiting(runtime_id, visited) AS (
    SELECT least(
        (SELECT runtime_id FROM tasks
          WHERE status = 'queued' AND runtime_id > $2
          ORDER BY runtime_id LIMIT 1),
        (SELECT runtime_id FROM tasks
          WHERE status = 'scheduled' AND runtime_id > $2
          ORDER BY runtime_id LIMIT 1)), 1
    UNION ALL
    SELECT least(
        (SELECT t.runtime_id FROM tasks t
          WHERE t.status = 'queued' AND t.runtime_id > w.runtime_id
          ORDER BY t.runtime_id LIMIT 1),
        (SELECT t.runtime_id FROM tasks t
          WHERE t.status = 'scheduled' AND t.runtime_id > w.runtime_id
          ORDER BY t.runtime_id LIMIT 1)),
        w.visited + 1
      FROM waiting w
     WHERE w.runtime_id IS NOT NULL AND w.visited < $1
)
SELECT runtime_id,
       -- Scalar probes, not EXISTS under an OR: Postgres may answer that by hashing
       -- every due task of every runtime, which reads the whole backlog each pass.
       COALESCE(
        (SELECT true FROM tasks t
          WHERE t.runtime_id = w.runtime_id AND t.status = 'queued'
            AND t.run_at <= now() - interval '1 second'
            AND (t.expires_at IS NULL OR t.expires_at > now())
          LIMIT 1),
        (SELECT true FROM tasks t
          WHERE t.runtime_id = w.runtime_id AND t.status = 'scheduled'
            AND t.run_at <= now() - interval '1 second'
            AND (t.expires_at IS NULL OR t.expires_at > now())
          LIMIT 1),
        false) AS claimable
  FROM waiting w
 WHERE runtime_id IS NOT NULL
 ORDER BY runtime_id
"""

# Scheduled tasks that came due become queued, one bounded batch, so that the claim's
# scan of due scheduled rows (which sorts them) stays short. Not needed for
# correctness: the claim takes due scheduled rows itself. A loose index scan over
# tasks_scheduled_idx visits each runtime with scheduled tasks with one probe and
# takes its due rows; the walk stops once the batch is full. Returns the runtime of
# each row moved (the caller bumps them: a claim that skipped a row this held found
# it missing, and may have written an empty verdict).
PROMOTE_SCHEDULED = """
WITH RECURSIVE waiting(runtime_id) AS (
    (SELECT runtime_id FROM tasks
      WHERE status = 'scheduled'
      ORDER BY runtime_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.runtime_id FROM tasks t
             WHERE t.status = 'scheduled' AND t.runtime_id > w.runtime_id
             ORDER BY t.runtime_id LIMIT 1)
      FROM waiting w
     WHERE w.runtime_id IS NOT NULL
), due AS (
    SELECT d.id
      FROM waiting w
     CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
         WHERE t.runtime_id = w.runtime_id AND t.status = 'scheduled' AND t.run_at <= now()
         ORDER BY t.run_at
         LIMIT $1
           FOR UPDATE SKIP LOCKED
     ) d
     WHERE w.runtime_id IS NOT NULL
     LIMIT $1
)
UPDATE tasks t
   SET status = 'queued'
  FROM due
 WHERE t.id = due.id
RETURNING t.runtime_id
"""

# The task table's dead row versions as Postgres counts them: the cumulative statistics
# that autovacuum reads too (each backend reports its changes within a second or so of
# its transaction's end). Read from shared memory, not from the table.
TASKS_DEAD_ROWS = """
SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relid = 'tasks'::regclass
"""

# A plain VACUUM takes a SHARE UPDATE EXCLUSIVE lock: reads and writes of the table go on
# (only DDL on it and another VACUUM or ANALYZE of it wait). SKIP_LOCKED: when another
# VACUUM or ANALYZE of the table holds that lock (autovacuum, another replica's janitor),
# this one skips at once with a warning (SQLSTATE 55P03) instead of queueing behind it.
# TRUNCATE false: the last phase of a VACUUM, giving empty pages at the end of the table
# back to the system, takes an ACCESS EXCLUSIVE lock that would stop every claim for its
# duration; the table grows back into those pages anyway. ANALYZE: after a burst the
# planner's picture of the statuses is wrong too. INDEX_CLEANUP ON: left to itself, a
# VACUUM that finds dead rows on under 2% of the table's pages leaves their index
# entries (and the line pointers they point to) for later, and the ANALYZE after it
# counts those as dead rows again: on a 10^7-row table with retention deleting, the
# janitor then saw 100,000 dead rows after every VACUUM and ran one every pass. One
# statement, outside any transaction block, as a transaction pooler allows it.
VACUUM_TASKS = "VACUUM (ANALYZE, SKIP_LOCKED, TRUNCATE false, INDEX_CLEANUP ON) tasks"
LOCK_NOT_AVAILABLE = "55P03"
