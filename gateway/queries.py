"""Every SQL statement the gateway runs, by name. No SQL lives anywhere else.

Hot-path statements (CLAIM, NEXT_DUE) have EXPLAIN tests that pin their index.
"""

from __future__ import annotations

# A queued task past its expires_at is expired already: the janitor only writes it
# down later. Every read and filter goes through this, so none shows it as queued.
EFFECTIVE_STATUS = (
    "CASE WHEN status = 'queued' AND expires_at <= now() THEN 'expired' ELSE status END"
)

TASK_COLUMNS = f"""
    id, runtime_id, {EFFECTIVE_STATUS} AS status, priority, payload, attempts, max_attempts,
    run_at, expires_at, created_at, updated_at, lease_id, lease_expires_at, worker_id,
    cancel_requested, result, last_error
"""

# run_at and expires_at come from Postgres's clock, as created_at, leases and backoff
# do: delay_seconds ($6) and ttl_seconds ($7) count from the insert, not from the
# gateway's clock. An explicit run_at ($5) wins over a delay (the parser allows one).
ENQUEUE = f"""
WITH due AS (
    SELECT COALESCE($5::timestamptz,
                    clock_timestamp() + make_interval(secs => COALESCE($6::float8, 0))) AS t
)
INSERT INTO tasks (runtime_id, priority, payload, max_attempts, run_at, expires_at,
                   idempotency_key, request_hash)
SELECT $1, $2, $3, $4, due.t, due.t + make_interval(secs => $7::float8), $8, $9 FROM due
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

# The task an idempotency key already made, for a replay or a key-reuse refusal.
GET_BY_IDEMPOTENCY_KEY = f"""
SELECT {TASK_COLUMNS}, request_hash FROM tasks WHERE runtime_id = $1 AND idempotency_key = $2
"""

# Claims up to cardinality($2) tasks for a list of slots, one slot per wanted task,
# oldest waiter's slots first. Row number k goes to slot k, which carries the
# waiter's worker_id and lease length. One statement: lock, number and lease.
CLAIM = """
WITH picked AS (
    SELECT id, priority, created_at
      FROM tasks
     WHERE runtime_id = $1
       AND status = 'queued'
       AND run_at <= now()
       AND (expires_at IS NULL OR expires_at > now())
     ORDER BY priority DESC, created_at ASC
     LIMIT cardinality($2::text[])
       FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT id, row_number() OVER (ORDER BY priority DESC, created_at ASC) AS slot
      FROM picked
), slots AS (
    SELECT worker_id, lease_seconds, slot
      FROM unnest($2::text[], $3::float8[]) WITH ORDINALITY AS s(worker_id, lease_seconds, slot)
)
UPDATE tasks t
   SET status = 'claimed',
       attempts = t.attempts + 1,
       lease_id = gen_random_uuid(),
       lease_expires_at = clock_timestamp() + make_interval(secs => s.lease_seconds),
       worker_id = s.worker_id,
       cancel_requested = false,
       updated_at = clock_timestamp()
  FROM numbered n JOIN slots s USING (slot)
 WHERE t.id = n.id
RETURNING n.slot, t.*
"""

# Seconds until the earliest future run_at among a runtime's queued tasks: a verdict
# must not outlive it (I4). Runs in the claim's transaction, so now() is the scan's
# instant and no task can come due unseen between the two statements.
NEXT_DUE = """
SELECT extract(epoch FROM min(run_at) - now())::float8 FROM tasks
 WHERE runtime_id = $1 AND status = 'queued' AND run_at > now()
"""

# Gives back leases that were never delivered (the waiter left mid-claim). The claim
# did not reach anyone, so it does not count as an attempt.
UNCLAIM = f"""
UPDATE tasks
   SET status = 'queued', attempts = greatest(attempts - 1, 0), lease_id = NULL,
       lease_expires_at = NULL, worker_id = NULL, updated_at = clock_timestamp()
 WHERE id = ANY($1::uuid[]) AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

GET_TASK = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"

# Whose task this is, for a token limited to some runtimes.
TASK_RUNTIME = "SELECT runtime_id FROM tasks WHERE id = $1"

HEARTBEAT = f"""
UPDATE tasks
   SET lease_expires_at = clock_timestamp() + make_interval(secs => $3),
       updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

# A cancel requested while the task was held wins over the holder's report.
COMPLETE = f"""
UPDATE tasks
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'completed' END,
       result = $3, lease_expires_at = NULL, finished_at = clock_timestamp(),
       updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

# Backoff: retry_after_seconds when given, else min(2^attempts, 3600) s with
# jitter in [50%, 100%]. `dead` once attempts reached max_attempts or retry=false.
FAIL = f"""
UPDATE tasks
   SET status = CASE
           WHEN cancel_requested THEN 'cancelled'
           WHEN $4 AND attempts < max_attempts THEN 'queued'
           ELSE 'dead' END,
       run_at = CASE
           WHEN $4 AND attempts < max_attempts AND NOT cancel_requested
           THEN clock_timestamp() + make_interval(secs => COALESCE(
                    $5::float8,
                    least(power(2, attempts), 3600) * (0.5 + random() * 0.5)))
           ELSE run_at END,
       lease_id = CASE WHEN $4 AND attempts < max_attempts AND NOT cancel_requested
                       THEN NULL ELSE lease_id END,
       worker_id = CASE WHEN $4 AND attempts < max_attempts AND NOT cancel_requested
                        THEN NULL ELSE worker_id END,
       lease_expires_at = NULL,
       last_error = $3,
       finished_at = CASE WHEN $4 AND attempts < max_attempts AND NOT cancel_requested
                          THEN NULL ELSE clock_timestamp() END,
       updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

RELEASE = f"""
UPDATE tasks
   SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
       run_at = clock_timestamp(),
       lease_id = CASE WHEN cancel_requested THEN lease_id END,
       worker_id = CASE WHEN cancel_requested THEN worker_id END,
       lease_expires_at = NULL,
       finished_at = CASE WHEN cancel_requested THEN clock_timestamp() END,
       updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

# A claimed task that cannot be delivered (its row cannot be turned into an answer):
# ended dead under the lease that won it, so it is neither lost nor handed out forever.
BURY = """
UPDATE tasks
   SET status = 'dead', last_error = $3, lease_expires_at = NULL,
       finished_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
"""

# Every transaction the gateway opens starts with this, one simple query: the statement
# timeout holds for this transaction only and costs no round trip of its own. A startup
# parameter is refused by PgBouncer, and a session SET would stay on a server
# connection that a transaction pooler shares with other clients.
BEGIN_WITH_TIMEOUT = "BEGIN; SET LOCAL statement_timeout = {timeout_ms:d}"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"

# -- migrations (gateway.migrate) --

MIGRATIONS_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
MIGRATIONS_SELECT_APPLIED = "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
MIGRATIONS_INSERT_APPLIED = (
    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
)
MIGRATIONS_LOCK = "SELECT pg_advisory_lock($1)"
MIGRATIONS_UNLOCK = "SELECT pg_advisory_unlock($1)"

# -- task lifecycle (producers and operators) --

# A whole batch in one statement; ids are chosen by the caller so that rows can be
# matched back to request order. Items whose key already exists are skipped here and
# looked up with GET_BY_IDEMPOTENCY_KEYS.
ENQUEUE_BATCH = f"""
WITH base AS (SELECT clock_timestamp() AS t)
INSERT INTO tasks (id, runtime_id, priority, payload, max_attempts, run_at, expires_at,
                   idempotency_key, request_hash, created_at)
SELECT i.id, $1, i.priority, i.payload::jsonb, i.max_attempts, d.run_at,
       d.run_at + make_interval(secs => i.ttl), i.idempotency_key,
       i.request_hash, base.t + (i.ord - 1) * interval '1 microsecond'
  FROM base,
       unnest($2::uuid[], $3::int[], $4::text[], $5::int[], $6::timestamptz[],
              $7::float8[], $8::float8[], $9::text[], $10::text[])
       WITH ORDINALITY
       AS i(id, priority, payload, max_attempts, run_at, delay, ttl, idempotency_key,
            request_hash, ord),
       LATERAL (SELECT COALESCE(i.run_at, base.t + make_interval(secs => COALESCE(i.delay, 0)))
                       AS run_at) d
 -- Keys in one order for every batch, so that two batches sharing keys wait for each
 -- other instead of deadlocking; created_at keeps the request's order (FIFO).
 ORDER BY i.idempotency_key NULLS LAST, i.ord
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

GET_BY_IDEMPOTENCY_KEYS = f"""
SELECT {TASK_COLUMNS}, request_hash, idempotency_key FROM tasks
 WHERE runtime_id = $1 AND idempotency_key = ANY($2::text[])
"""

# A queued task is cancelled at once; a claimed one is flagged, and ends `cancelled`
# when its holder next reports.
CANCEL = f"""
UPDATE tasks
   SET status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
       cancel_requested = (status = 'claimed'),
       finished_at = CASE WHEN status = 'queued' THEN clock_timestamp() ELSE finished_at END,
       updated_at = clock_timestamp()
 WHERE id = $1 AND {EFFECTIVE_STATUS} IN ('queued', 'claimed')
RETURNING {TASK_COLUMNS}
"""

# A dead, expired or cancelled task runs again at once, its attempts reset. An
# expiry already past is dropped, or the task would expire again before any claim.
RETRY = f"""
UPDATE tasks
   SET status = 'queued', attempts = 0, run_at = clock_timestamp(),
       expires_at = CASE WHEN expires_at <= clock_timestamp() THEN NULL ELSE expires_at END,
       lease_id = NULL, lease_expires_at = NULL, worker_id = NULL,
       cancel_requested = false, finished_at = NULL, result = NULL,
       updated_at = clock_timestamp()
 WHERE id = $1 AND {EFFECTIVE_STATUS} IN ('dead', 'expired', 'cancelled')
RETURNING {TASK_COLUMNS}
"""

# Keyset pagination, oldest first: (created_at, id) after the cursor.
LIST_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
 WHERE runtime_id = $1
   AND ($2::text IS NULL OR {EFFECTIVE_STATUS} = $2)
   AND ($3::timestamptz IS NULL OR (created_at, id) > ($3, $4::uuid))
 ORDER BY created_at, id
 LIMIT $5
"""

# Stats in time that does not grow with the runtime's history (docs/design.md, 5.1):
# live tasks are counted from tasks_live_idx (index-only, proportional to the runtime's
# live rows), finished ones from task_counts, which triggers keep in the same
# transaction as each change (migration 0005). One statement, one snapshot: a task
# moving from claimed to completed is counted once. A stored 'scheduled' task reads as
# queued, and a queued one past expires_at as expired (as EFFECTIVE_STATUS says).
STATS_COUNTS = """
SELECT status, sum(n)::bigint AS n FROM (
    SELECT CASE WHEN status = 'claimed' THEN 'claimed'
                WHEN expires_at <= now() THEN 'expired'
                ELSE 'queued' END AS status,
           1::bigint AS n
      FROM tasks
     WHERE runtime_id = $1 AND status IN ('queued', 'scheduled', 'claimed')
    UNION ALL
    SELECT status, n FROM task_counts WHERE runtime_id = $1
) AS c
GROUP BY status
"""

# Over the live rows only (tasks_live_idx), never the runtime's finished history. The
# OFFSET 0 keeps the planner from answering min() by walking tasks_runtime_created_idx
# in created_at order: on a runtime with a long history that walk reads every finished
# row created before the oldest queued one.
OLDEST_QUEUED_AGE = """
SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8
  FROM (SELECT created_at FROM tasks
         WHERE runtime_id = $1 AND status IN ('queued', 'scheduled') AND run_at <= now()
           AND (expires_at IS NULL OR expires_at > now())
        OFFSET 0) AS live
"""

# -- janitor --

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
# bounded batches. The old lease_id stays on the row for the error message, but
# every lease operation also requires status = 'claimed', so it is refused.
RECLAIM_LEASES = """
WITH lapsed AS (
    SELECT id FROM tasks
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
RETURNING t.runtime_id, t.status
"""

EXPIRE_TASKS = """
WITH due AS (
    SELECT id FROM tasks
     WHERE status = 'queued' AND expires_at IS NOT NULL AND expires_at <= now()
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

# One page of the runtimes with a queued task: up to $1 of them, after $2 in runtime_id
# order, each with whether it has a task claimable for at least a second. A loose index
# (skip) scan finds each queued runtime with one index probe, then one probe checks for
# a due, unexpired task. The page counts runtimes visited, not runtimes found
# claimable, so that a page costs at most 2 * $1 probes even when most queued runtimes
# hold only delayed tasks; the caller pages through all of them, one bounded page after
# another, with the last runtime visited as the cursor.
CLAIMABLE_RUNTIMES = """
WITH RECURSIVE queued(runtime_id, visited) AS (
    (SELECT runtime_id, 1 FROM tasks
      WHERE status = 'queued' AND runtime_id > $2
      ORDER BY runtime_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.runtime_id FROM tasks t
             WHERE t.status = 'queued' AND t.runtime_id > q.runtime_id
             ORDER BY t.runtime_id LIMIT 1),
           q.visited + 1
      FROM queued q
     WHERE q.runtime_id IS NOT NULL AND q.visited < $1
)
SELECT runtime_id,
       EXISTS (SELECT 1 FROM tasks t
                WHERE t.runtime_id = q.runtime_id AND t.status = 'queued'
                  AND t.run_at <= now() - interval '1 second'
                  AND (t.expires_at IS NULL OR t.expires_at > now())) AS claimable
  FROM queued q
 WHERE runtime_id IS NOT NULL
 ORDER BY runtime_id
"""

# -- credentials --

TOKEN_COLUMNS = "id, name, scopes, runtimes, created_at, revoked_at"

# A name already held by a live token violates api_tokens_live_name_idx.
CREATE_TOKEN = f"""
INSERT INTO api_tokens (name, secret_hash, scopes, runtimes) VALUES ($1, $2, $3, $4)
RETURNING {TOKEN_COLUMNS}
"""

# The authenticator's lookup, by the unique index on secret_hash.
LIVE_TOKEN_BY_HASH = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE secret_hash = $1 AND revoked_at IS NULL
"""

# Live tokens, or every token when $1, oldest first.
LIST_TOKENS = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE $1 OR revoked_at IS NULL ORDER BY created_at, id
"""

# Revoking twice keeps the first revoked_at, so a repeated revoke is harmless.
REVOKE_TOKEN_BY_ID = f"""
UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, clock_timestamp())
 WHERE id = $1
RETURNING {TOKEN_COLUMNS}
"""

# Names repeat among revoked tokens: a name means the live token that holds it.
REVOKE_TOKEN_BY_NAME = f"""
UPDATE api_tokens SET revoked_at = clock_timestamp()
 WHERE name = $1 AND revoked_at IS NULL
RETURNING {TOKEN_COLUMNS}
"""

WEBHOOK_SECRET_COLUMNS = "id, name, runtimes, created_at, revoked_at"

CREATE_WEBHOOK_SECRET = f"""
INSERT INTO webhook_secrets (name, signing_key, runtimes) VALUES ($1, $2, $3)
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

LIST_WEBHOOK_SECRETS = f"""
SELECT {WEBHOOK_SECRET_COLUMNS} FROM webhook_secrets
 WHERE $1 OR revoked_at IS NULL
 ORDER BY created_at, id
"""

REVOKE_WEBHOOK_SECRET_BY_ID = f"""
UPDATE webhook_secrets SET revoked_at = COALESCE(revoked_at, clock_timestamp())
 WHERE id = $1
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

REVOKE_WEBHOOK_SECRET_BY_NAME = f"""
UPDATE webhook_secrets SET revoked_at = clock_timestamp()
 WHERE name = $1 AND revoked_at IS NULL
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

# The keys of live secrets with a pattern covering runtime $1. A pattern's * becomes
# LIKE's %, and its _ (a plain character in runtime ids) is escaped; patterns cannot
# hold % or \ (auth.RUNTIME_PATTERN_RE), so this matches exactly what auth.glob_match
# matches. The table is small (one row per sender): a scan of the live rows is fine.
WEBHOOK_KEYS_FOR_RUNTIME = """
SELECT signing_key FROM webhook_secrets
 WHERE revoked_at IS NULL
   AND EXISTS (SELECT 1 FROM unnest(runtimes) AS p(pattern)
                WHERE $1 LIKE replace(replace(p.pattern, '_', '\\_'), '*', '%'))
 ORDER BY created_at DESC
"""
