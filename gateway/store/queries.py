"""Every SQL statement the gateway runs, by name. No SQL lives anywhere else.

Hot-path statements (CLAIM, NEXT_DUE) have EXPLAIN tests that pin their index.
"""

from __future__ import annotations

# A queued task past its expires_at is expired already: the janitor only writes it
# down later. Every read and filter goes through this, so none shows it as queued.
# A `scheduled` task (stored so while its run_at was in the future; design section 4)
# is `queued` to the API: the stored status only keeps it out of the claim index.
EFFECTIVE_STATUS = (
    "CASE WHEN status IN ('queued', 'scheduled') AND expires_at <= now() THEN 'expired'"
    " WHEN status = 'scheduled' THEN 'queued' ELSE status END"
)

# The lease that holds a task now: its lease_id while it is claimed, else none (a
# finished task keeps the lease_id that finished it, for replays). One expression, not
# `status = 'claimed' AND lease_id = ...`: a bare condition on status lets the planner
# walk every claimed task (tasks_lease_idx) instead of probing the primary key.
HOLDING_LEASE = "CASE WHEN tasks.status = 'claimed' THEN tasks.lease_id END"

TASK_COLUMNS = f"""
    id, runtime_id, {EFFECTIVE_STATUS} AS status, priority, payload, attempts, max_attempts,
    run_at, expires_at, created_at, updated_at, lease_id, lease_expires_at, worker_id,
    cancel_requested, result, last_error
"""

# run_at and expires_at come from Postgres's clock, as created_at, leases and backoff
# do: delay_seconds ($6) and ttl_seconds ($7) count from the insert, not from the
# gateway's clock. An explicit run_at ($5) wins over a delay (the parser allows one).
# A task not due yet is stored `scheduled`, out of the claim index; clock_timestamp()
# is read after due.t, so a task without delay or run_at is always `queued`.
ENQUEUE = f"""
WITH due AS (
    SELECT COALESCE($5::timestamptz,
                    clock_timestamp() + make_interval(secs => COALESCE($6::float8, 0))) AS t
)
INSERT INTO tasks (runtime_id, status, priority, payload, max_attempts, run_at, expires_at,
                   idempotency_key, request_hash)
SELECT $1, CASE WHEN due.t > clock_timestamp() THEN 'scheduled' ELSE 'queued' END,
       $2, $3, $4, due.t,
       due.t + make_interval(secs => $7::float8), $8, $9 FROM due
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

# ENQUEUE for a task due now, written already leased to a poll parked on this instance
# (sync match, claim.py) as CLAIM would lease it: one attempt, the poll's worker and
# lease length ($8, $9). The task and lease ids ($10, $11) come from the caller, so
# that an enqueue whose answer is lost can give the task back (UNCLAIM_LEASE). No task
# becomes claimable, so no bump follows (I1).
ENQUEUE_LEASED = f"""
WITH due AS (SELECT clock_timestamp() AS t)
INSERT INTO tasks (id, runtime_id, status, priority, payload, max_attempts, run_at,
                   expires_at, idempotency_key, request_hash, attempts, lease_id,
                   lease_expires_at, worker_id, updated_at)
SELECT $10, $1, 'claimed', $2, $3, $4, due.t, due.t + make_interval(secs => $5::float8), $6,
       $7, 1, $11, due.t + make_interval(secs => $9::float8), $8, due.t FROM due
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

# The task an idempotency key already made, for a replay or a key-reuse refusal.
GET_BY_IDEMPOTENCY_KEY = f"""
SELECT {TASK_COLUMNS}, request_hash FROM tasks WHERE runtime_id = $1 AND idempotency_key = $2
"""

# Seconds until the earliest run_at among a runtime's scheduled tasks not due yet: a
# verdict must not outlive it (I4). One probe of tasks_scheduled_idx. Part of CLAIM, so
# that now() is the scan's own instant and no task can come due unseen in between.
NEXT_DUE = """
SELECT extract(epoch FROM min(run_at) - now())::float8 AS due_in FROM tasks
 WHERE runtime_id = $1 AND status = 'scheduled' AND run_at > now()
"""

# Claims up to cardinality($2) tasks for a list of slots, one slot per wanted task,
# oldest waiter's slots first. Row number k goes to slot k, which carries the
# waiter's worker_id and lease length. One statement, one round trip, no explicit
# transaction: pick, lock, number, lease, and report the next due time (NEXT_DUE).
#
# Due tasks are in two places: `queued` rows, in tasks_claim_idx order, and `scheduled`
# rows whose run_at has passed but that the janitor has not yet made `queued` (a few:
# it does so every pass), from the due end of tasks_scheduled_idx, sorted. Delayed
# rows are never read. The two are merged by priority, then age, and each candidate in
# turn is locked (SKIP LOCKED; its conditions are checked again on the locked row)
# until enough are held, so that every row locked is leased: a row locked but left
# would be skipped by a concurrent claim, which could then record an empty verdict
# over it. FOR UPDATE cannot sit on a UNION, hence the lock per candidate.
#
# Each source offers at most $4 candidates (the window), so that Postgres plans it as
# the short ordered index walk it is; rows other claims hold count against it. When a
# source's window was used up and slots are still free, `more` is true and the caller
# runs the statement again with a wider window for the remaining slots.
#
# It always returns at least one row: with nothing leased, one whose slot is NULL,
# carrying due_in and more.
CLAIM = f"""
WITH candidates AS (
    SELECT id, priority, created_at, queued FROM (
        (SELECT id, priority, created_at, true AS queued FROM tasks
          WHERE runtime_id = $1 AND status = 'queued' AND run_at <= now()
            AND (expires_at IS NULL OR expires_at > now())
          ORDER BY priority DESC, created_at ASC
          LIMIT $4)
        UNION ALL
        (SELECT id, priority, created_at, false AS queued FROM tasks
          WHERE runtime_id = $1 AND status = 'scheduled' AND run_at <= now()
            AND (expires_at IS NULL OR expires_at > now())
          ORDER BY priority DESC, created_at ASC
          LIMIT $4)
    ) due
     ORDER BY priority DESC, created_at ASC
), picked AS (
    SELECT locked.id, c.priority, c.created_at
      FROM candidates c
     CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
         WHERE t.id = c.id AND t.status IN ('queued', 'scheduled') AND t.run_at <= now()
           AND (t.expires_at IS NULL OR t.expires_at > now())
           FOR UPDATE SKIP LOCKED
     ) locked
     LIMIT cardinality($2::text[])
), leased AS (
    UPDATE tasks t
       SET status = 'claimed',
           attempts = t.attempts + 1,
           lease_id = gen_random_uuid(),
           lease_expires_at = clock_timestamp() + make_interval(secs => s.lease_seconds),
           worker_id = s.worker_id,
           cancel_requested = false,
           updated_at = clock_timestamp()
      -- The picked ids in claim order, zipped with the slots: the k-th picked task goes
      -- to slot k, and the slots past the last picked task get no id. One pass, no
      -- join: numbered and joined to the slots on their number, the slots were read
      -- once per picked row under a generic plan.
      FROM unnest(ARRAY(SELECT id FROM picked ORDER BY priority DESC, created_at ASC),
                  $2::text[], $3::float8[])
           WITH ORDINALITY AS s(id, worker_id, lease_seconds, slot)
     -- Each picked id as a one-element array: a join the planner cannot hash, so it
     -- probes the primary key once per leased row whatever the slots. Joined on
     -- t.id = s.id, a claim of 120 slots on a table under about 40,000 rows was a
     -- hash join over a sequential scan of the whole table (3 ms of a 9 ms statement
     -- at 20,000 rows).
     WHERE s.id IS NOT NULL AND t.id = ANY (ARRAY[s.id])
    RETURNING s.slot, t.*
), next_due AS ({NEXT_DUE})
SELECT leased.*, next_due.due_in,
       -- Only read when slots are left, and then the candidates were all read anyway.
       CASE WHEN (SELECT count(*) FROM picked) < cardinality($2::text[])
            THEN (SELECT count(*) FILTER (WHERE queued) >= $4
                         OR count(*) FILTER (WHERE NOT queued) >= $4 FROM candidates)
            ELSE false END AS more
  FROM next_due LEFT JOIN leased ON true
"""

# Gives back leases that were never delivered (the waiter left mid-claim). The claim
# did not reach anyone, so it does not count as an attempt. By task and lease ($1, $2):
# a give-back that comes after the lease lapsed and the task was claimed again leaves
# the new holder's lease alone.
#
# Each task by its id and lease as one-element arrays (as _LEASE_HELD): probed by
# primary key, whatever the plan. With plain equalities and `status = 'claimed'`, a
# generic plan walked every claimed task of every runtime (tasks_lease_idx) and tested
# each against every item: 94 ms for 1,000 items against 9 ms.
UNCLAIM = f"""
UPDATE tasks
   SET status = 'queued', attempts = greatest(attempts - 1, 0), lease_id = NULL,
       lease_expires_at = NULL, worker_id = NULL, updated_at = clock_timestamp()
  FROM unnest($1::uuid[], $2::uuid[]) AS given(task_id, lease_id)
 WHERE tasks.id = ANY (ARRAY[given.task_id])
   AND {HOLDING_LEASE} = ANY (ARRAY[given.lease_id])
RETURNING tasks.id
"""

# A sync-matched enqueue whose answer was lost (it may have committed): its task, if
# written, goes back to the queue, not as an attempt. By id and lease, so that nothing
# else is touched.
UNCLAIM_LEASE = """
UPDATE tasks
   SET status = 'queued', attempts = greatest(attempts - 1, 0), lease_id = NULL,
       lease_expires_at = NULL, worker_id = NULL, updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
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

# The complete transition's SET list, shared by COMPLETE, COMPLETE_GROUP and
# BATCH_COMPLETE; {result} is the result's JSON. A cancel requested while the task was
# held wins over the holder's report.
COMPLETE_TRANSITION = """status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'completed' END,
       result = {result}, lease_expires_at = NULL, finished_at = clock_timestamp(),
       updated_at = clock_timestamp()"""

# The gateway's requests complete through COMPLETE_GROUP (below), the same transition for
# several tasks at once; this one-task form is Store.complete's, for the capacity
# bench and the tests that drive one statement.
COMPLETE = f"""
UPDATE tasks
   SET {COMPLETE_TRANSITION.format(result="$3")}
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

# The tasks of `items` (item_id, item_lease) that the item's lease holds, locked, in id
# order: two statements naming the same tasks, in any order, wait for each other
# instead of deadlocking. Only those are locked. A lock on a task the lease no longer
# holds (its lease lapsed and the janitor queued it again) would make a claim running
# meanwhile skip the task (CLAIM: SKIP LOCKED) and record the runtime empty over it.
#
# Why the rows found are right: the scan tests HOLDING_LEASE on the row as the
# statement's snapshot shows it, and only a row passing it is locked. When that row was
# changed since (another request reported it, the janitor reclaimed it), the lock waits
# for that change, takes the newest version, and Postgres tests the conditions again on
# it (EvalPlanQual): the row is kept only if the item's lease still holds it, and being
# locked, it holds it until the statement commits. A row that fails the second test is
# left out, yet Postgres keeps the lock it took for the test until the statement ends;
# so a claim can still skip a task re-queued in that very instant, as it can with the
# single-row statements (HEARTBEAT, COMPLETE: an UPDATE does the same). The janitor's
# repair (I6) covers that rare case, which lasts one statement.
#
# Each item's id and lease as one-element arrays (as CLAIM's update): conditions the
# planner can neither hash nor merge, so it probes the primary key once per item.
# Joined on plain equalities, it hashed the items against a sequential scan of the
# whole table.
#
# Each held row carries its item's columns (i.*), so that the update that follows
# reads `held` alone. Joined to `items` again, a generic plan (the one a prepared
# statement settles on after five runs, which estimates any array at ten elements)
# scanned the items once per held row: 1,000 items took 92 ms where a custom plan
# took 12 (tests/e2e/test_batch_explain.py holds every plan to one scan per list).
_LEASE_HELD = f"""
held AS MATERIALIZED (
    SELECT i.*, tasks.id AS held_id
      FROM items i JOIN tasks ON tasks.id = ANY (ARRAY[i.item_id])
     WHERE {HOLDING_LEASE} = ANY (ARRAY[i.item_lease])
     ORDER BY tasks.id
       FOR UPDATE OF tasks
)"""

# COMPLETE for the single completes that arrived together (completions.py): one
# statement, one commit for all of them. $1 task ids (distinct), $2 lease ids, $3
# results (JSON text or NULL). Each task this completes comes back whole, as COMPLETE
# returns it; a task it does not (lease lost, already reported, no such task) is left
# to its own request, which reads it afresh (complete_missed). The rows are locked by
# _LEASE_HELD, so the update needs no condition of its own: a held row is the lease's
# until commit.
COMPLETE_GROUP = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])
           AS i(item_id, item_lease, item_result)
), {_LEASE_HELD.strip()}
UPDATE tasks
   SET {COMPLETE_TRANSITION.format(result="h.item_result::jsonb")}
  FROM held h
 WHERE tasks.id = ANY (ARRAY[h.held_id])
RETURNING {TASK_COLUMNS}
"""

# The fail transition's SET list, shared by FAIL and BATCH_FAIL so that a change to it
# carries to both. {retry}: whether the holder asks for a retry (boolean);
# {retry_after}: seconds before it, NULL for the backoff. Its column names are the
# task's, unqualified: a statement using it names its other columns apart.
# Backoff: retry_after_seconds when given, else min(2^attempts, 3600) s with
# jitter in [50%, 100%]. `dead` once attempts reached max_attempts or retry=false.
# A retry with any backoff is not due yet: `scheduled` (the default backoff is at
# least a second); only retry_after_seconds = 0 queues it for at once.
FAIL_TRANSITION = """
       status = CASE
           WHEN cancel_requested THEN 'cancelled'
           WHEN {retry} AND attempts < max_attempts
           THEN CASE WHEN COALESCE({retry_after}::float8, 1) > 0 THEN 'scheduled' ELSE 'queued' END
           ELSE 'dead' END,
       run_at = CASE
           WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
           THEN clock_timestamp() + make_interval(secs => COALESCE(
                    {retry_after}::float8,
                    least(power(2, attempts), 3600) * (0.5 + random() * 0.5)))
           ELSE run_at END,
       lease_id = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                       THEN NULL ELSE lease_id END,
       worker_id = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                        THEN NULL ELSE worker_id END,
       lease_expires_at = NULL,
       finished_at = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                          THEN NULL ELSE clock_timestamp() END,"""

FAIL = f"""
UPDATE tasks
   SET {FAIL_TRANSITION.format(retry="$4", retry_after="$5")}
       last_error = $3,
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


def _json_time(column: str) -> str:
    """SQL for a timestamptz column as models.format_time writes it, quoted, or null."""
    spelled = f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
    return f"""COALESCE('"' || {spelled} || '"', 'null')"""


# A new task's JSON object, byte for byte what models.task_bytes makes of the row (a
# new task is never claimed, completed or failed, so only TASK_FIELDS appear), written
# by Postgres in the INSERT's RETURNING: a batch's answer then costs the gateway one
# text column per task instead of seventeen decoded ones, a row object and a render.
# The payload is the text Postgres writes for the jsonb, as every answer embeds it.
# tests/integration/test_enqueue_round_trips.py holds it to models.task_bytes.
NEW_TASK_JSON = (
    """'{"id":"' || id || '","runtime_id":' || to_json(runtime_id) || ',"status":"' || """
    f"""({EFFECTIVE_STATUS}) || '","priority":' || priority || ',"payload":' || payload::text """
    """|| ',"attempts":' || attempts || ',"max_attempts":' || max_attempts || ',"run_at":' """
    f"""|| {_json_time("run_at")} || ',"expires_at":' || {_json_time("expires_at")} """
    f"""|| ',"created_at":' || {_json_time("created_at")} """
    f"""|| ',"updated_at":' || {_json_time("updated_at")} || '}}'"""
)

# What the batch statements insert, from the unnest()ed columns `i` (ord: the item's
# place in the request) and the CTE `base`: status, run_at and expires_at as ENQUEUE
# writes them, created_at a microsecond apart in request order.
_BATCH_ROW = """CASE WHEN d.run_at > clock_timestamp() THEN 'scheduled' ELSE 'queued' END,
       i.priority, i.payload::jsonb, i.max_attempts, d.run_at,
       d.run_at + make_interval(secs => i.ttl)"""
_BATCH_CREATED_AT = "base.t + (i.ord - 1) * interval '1 microsecond'"
_BATCH_DUE = """LATERAL (SELECT COALESCE(i.run_at,
                                base.t + make_interval(secs => COALESCE(i.delay, 0)))
                       AS run_at) d"""

# A new task's reference, `{"id":"<uuid>"}`: all a batch answers of each task when the
# request says `Prefer: return=minimal`. The *_IDS statements are their namesakes with
# this in place of NEW_TASK_JSON (or of the payload text): Postgres neither writes the
# objects nor sends the payloads back, and the gateway has nothing to decode.
TASK_REF_JSON = """'{"id":"' || id || '"}'"""


# A whole batch in one statement; ids are chosen by the caller so that rows can be
# matched back to request order. Items whose key already exists are skipped here and
# looked up with GET_BY_IDEMPOTENCY_KEYS. Items not due yet are stored `scheduled`.
# Each inserted row comes back as its id and its JSON (`task_json`: NEW_TASK_JSON, or
# TASK_REF_JSON for ENQUEUE_BATCH_IDS).
# An optional column no item sets may be sent as a NULL array: ROWS FROM pads it with
# NULLs. Payloads and integers go as ENQUEUE_BATCH_NEW says.
def _enqueue_batch(task_json: str) -> str:
    return f"""
WITH base AS (SELECT clock_timestamp() AS t)
INSERT INTO tasks (id, runtime_id, status, priority, payload, max_attempts, run_at,
                   expires_at, idempotency_key, request_hash, created_at)
SELECT i.id, $1, {_BATCH_ROW}, i.idempotency_key, i.request_hash, {_BATCH_CREATED_AT}
  FROM base,
       ROWS FROM (unnest($2::uuid[]), unnest($3::text::int[]), json_array_elements($4::json),
                  unnest($5::text::int[]), unnest($6::timestamptz[]), unnest($7::float8[]),
                  unnest($8::float8[]), unnest($9::text[]), unnest($10::text[]))
       WITH ORDINALITY
       AS i(id, priority, payload, max_attempts, run_at, delay, ttl, idempotency_key,
            request_hash, ord),
       {_BATCH_DUE}
 -- Keys in one order for every batch, so that two batches sharing keys wait for each
 -- other instead of deadlocking; created_at keeps the request's order (FIFO).
 ORDER BY i.idempotency_key NULLS LAST, i.ord
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, {task_json} AS task_json
"""


ENQUEUE_BATCH = _enqueue_batch(NEW_TASK_JSON)
ENQUEUE_BATCH_IDS = _enqueue_batch(TASK_REF_JSON)


# A batch without idempotency keys: nothing can conflict, so every item is inserted,
# with an id Postgres picks, and the answer is one row: how many, and the new tasks'
# JSON objects (NEW_TASK_JSON) joined by commas in request order (created_at order).
# Payloads come as one JSON array ($3) and the integer columns as array literals ($2,
# $4): one string each for the driver to encode, which it does for a 1,000-item array
# element by element (0.3 to 0.45 ms each, measured), and one row to decode instead of
# 1,000. The array is split as `json` and each payload cast to jsonb on its own: one
# jsonb value is capped at 256 MiB in Postgres's binary form, which a large body of
# small numbers (about 12 bytes each there, 2 in the text) could pass.
# ENQUEUE_BATCH_NEW_IDS joins TASK_REF_JSON instead.
def _enqueue_batch_new(task_json: str) -> str:
    return f"""
WITH base AS (SELECT clock_timestamp() AS t),
new AS (
INSERT INTO tasks (runtime_id, status, priority, payload, max_attempts, run_at,
                   expires_at, created_at)
SELECT $1, {_BATCH_ROW}, {_BATCH_CREATED_AT}
  FROM base,
       ROWS FROM (unnest($2::text::int[]), json_array_elements($3::json),
                  unnest($4::text::int[]), unnest($5::timestamptz[]), unnest($6::float8[]),
                  unnest($7::float8[]))
       WITH ORDINALITY AS i(priority, payload, max_attempts, run_at, delay, ttl, ord),
       {_BATCH_DUE}
RETURNING created_at, {task_json} AS task_json
)
SELECT count(*)::int AS n, string_agg(task_json, ',' ORDER BY created_at) AS tasks FROM new
"""


ENQUEUE_BATCH_NEW = _enqueue_batch_new(NEW_TASK_JSON)
ENQUEUE_BATCH_NEW_IDS = _enqueue_batch_new(TASK_REF_JSON)

# A keyless batch whose items set no time (no run_at, delay_seconds or ttl_seconds):
# every row is queued, due at the batch's time, with no expiry, created and updated a
# microsecond apart in request order. Postgres sends back only what the gateway cannot
# know: that time, and each task's id and payload as jsonb writes it (one line per
# task, request order; jsonb text has no raw newline). The gateway writes the rest of
# each task's JSON (store.tasks.plain_tasks_json): writing it here cost Postgres about
# 3.5 ms per 1,000 tasks, a quarter of the statement.
_BATCH_PLAIN_INSERT = """
INSERT INTO tasks (runtime_id, status, priority, payload, max_attempts, run_at,
                   created_at, updated_at)
SELECT $1, 'queued', i.priority, i.payload::jsonb, i.max_attempts, base.t,
       base.t + (i.ord - 1) * interval '1 microsecond',
       base.t + (i.ord - 1) * interval '1 microsecond'
  FROM (SELECT clock_timestamp() AS t) base,
       ROWS FROM (unnest($2::text::int[]), json_array_elements($3::json),
                  unnest($4::text::int[]))
       WITH ORDINALITY AS i(priority, payload, max_attempts, ord)"""
ENQUEUE_BATCH_PLAIN = f"""
WITH new AS ({_BATCH_PLAIN_INSERT}
RETURNING created_at, id::text || payload::text AS line
)
SELECT count(*)::int AS n, min(created_at) AS t,
       string_agg(line, E'\n' ORDER BY created_at) AS lines
  FROM new
"""

# ENQUEUE_BATCH_PLAIN for `Prefer: return=minimal`: the same rows, answered as
# ENQUEUE_BATCH_NEW_IDS is (how many, and the TASK_REF_JSON of each joined by commas in
# request order), so that no payload text comes back and no object is written.
ENQUEUE_BATCH_PLAIN_IDS = f"""
WITH new AS ({_BATCH_PLAIN_INSERT}
RETURNING created_at, {TASK_REF_JSON} AS task_json
)
SELECT count(*)::int AS n, string_agg(task_json, ',' ORDER BY created_at) AS tasks FROM new
"""

GET_BY_IDEMPOTENCY_KEYS = f"""
SELECT {TASK_COLUMNS}, request_hash, idempotency_key FROM tasks
 WHERE runtime_id = $1 AND idempotency_key = ANY($2::text[])
"""

# GET_BY_IDEMPOTENCY_KEYS for a batch answered with ids only (ENQUEUE_BATCH_IDS): a
# replayed item needs its task's id and the hash to compare, not its payload or result.
GET_REFS_BY_IDEMPOTENCY_KEYS = """
SELECT id, request_hash, idempotency_key FROM tasks
 WHERE runtime_id = $1 AND idempotency_key = ANY($2::text[])
"""

# A queued (or scheduled) task is cancelled at once; a claimed one is flagged, and ends
# `cancelled` when its holder next reports.
CANCEL = f"""
UPDATE tasks
   SET status = CASE WHEN status IN ('queued', 'scheduled') THEN 'cancelled' ELSE status END,
       cancel_requested = (status = 'claimed'),
       finished_at = CASE WHEN status IN ('queued', 'scheduled') THEN clock_timestamp()
                          ELSE finished_at END,
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

# -- batch lease operations --

# Whether a token's runtime patterns ({patterns}, a text[]; NULL: every runtime) cover
# the runtime in {runtime}. A pattern's * becomes LIKE's %, its _ is escaped, as in
# WEBHOOK_KEYS_FOR_RUNTIME: it matches exactly what auth.principals.glob_match matches.
RUNTIME_COVERED = """({patterns}::text[] IS NULL OR EXISTS (
           SELECT 1 FROM unnest({patterns}::text[]) AS p(pattern)
            WHERE {runtime} LIKE replace(replace(p.pattern, '_', '\\_'), '*', '%')))"""

# The tasks a batch names. `seen`: each item with its task as the statement's snapshot
# shows it (seen_*, NULL when there is no such task). Tasks of runtimes the caller
# cannot see are left out (NULL): to the caller they do not exist. Columns are named
# apart from the task's, which the SET lists name unqualified.
#
# `locked`: the tasks the snapshot shows held by their item's lease, locked in id
# order (two statements naming the same tasks, in any order, wait for each other
# instead of deadlocking), as they are once locked (now_*). Only those are locked: a
# lock on a task the lease no longer holds (its lease lapsed and the janitor queued it
# again) would make a claim running meanwhile skip it (CLAIM: SKIP LOCKED) and record
# the runtime empty over it. When such a row was changed since the snapshot (another
# request reported it, the janitor reclaimed it), the lock waits for that change and
# reads the newest version: `now_holder` tells whether the item's lease still holds
# it. A locked row the lease holds is the lease's until commit, and the statement
# changes it (`done`); one it no longer holds is answered as that change left it, as a
# repeat is answered as the first was. The lock on such a row lasts one statement; a
# claim that skips it in that instant is what the janitor's repair (I6) covers, as
# for the single-row statements (HEARTBEAT, COMPLETE: an UPDATE does the same).
#
# The others are read without a lock, as the snapshot shows them: the answer for
# such an item (lease_lost with the task's status, a replay, not found) is the one it
# had when the statement began.
#
# Each step reads the one before it once and probes the primary key once per item
# (one-element arrays, as _LEASE_HELD), and the answer is the three kinds of item put
# together (_BATCH_ANSWER): no step joins two lists of items, which a generic plan
# would do by scanning one of them once per row of the other (see _LEASE_HELD).
_BATCH_HELD = f"""
seen AS MATERIALIZED (
    SELECT i.*, tasks.id AS seen_id, tasks.runtime_id AS seen_runtime,
           tasks.lease_id AS seen_lease, {EFFECTIVE_STATUS} AS seen_status,
           {HOLDING_LEASE} AS seen_holder
      FROM items i
      LEFT JOIN tasks ON tasks.id = ANY (ARRAY[i.item_id])
           AND {RUNTIME_COVERED.format(patterns="$2", runtime="tasks.runtime_id")}
), locked AS MATERIALIZED (
    SELECT s.*, tasks.runtime_id AS now_runtime, tasks.lease_id AS now_lease,
           {EFFECTIVE_STATUS} AS now_status, {HOLDING_LEASE} AS now_holder
      FROM seen s JOIN tasks ON tasks.id = ANY (ARRAY[s.seen_id])
     WHERE s.seen_holder = s.item_lease
     ORDER BY tasks.id
       FOR UPDATE OF tasks
)"""

# The rows `done` changes: those of `locked` that their item's lease still holds.
_BATCH_DONE = """
      FROM locked l
     WHERE tasks.id = ANY (ARRAY[l.seen_id]) AND l.now_holder = l.item_lease
    RETURNING l.ord, l.item_id, l.item_lease, l.now_runtime AS found_runtime,
              'claimed' AS found_status, l.item_lease AS found_lease,"""

# One row per item, in the request's order: the task as found (found_*; no runtime
# means not found) and, when this statement changed it, its new state (new_*, NULL
# otherwise: {nulls} is one NULL per new_* column `done` returns). A task that the
# snapshot showed held by its item's lease but that was gone once locked (deleted
# meanwhile) has no row: the caller counts a missing item as not found.
_BATCH_ANSWER = """
SELECT * FROM done
UNION ALL
SELECT ord, item_id, item_lease, now_runtime, now_status, now_lease, {nulls}
  FROM locked WHERE now_holder IS DISTINCT FROM item_lease
UNION ALL
SELECT ord, item_id, item_lease, seen_runtime, seen_status, seen_lease, {nulls}
  FROM seen WHERE seen_holder IS DISTINCT FROM item_lease
 ORDER BY ord
"""

# $1 task ids (distinct), $2 runtime patterns or NULL, $3 lease ids, $4 results (JSON
# text or NULL). As COMPLETE: a cancel requested while held ends the task cancelled.
BATCH_COMPLETE = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::text[])
           WITH ORDINALITY AS i(item_id, item_lease, item_result, ord)
), {_BATCH_HELD.strip()}, done AS (
    UPDATE tasks
       SET {COMPLETE_TRANSITION.format(result="l.item_result::jsonb")}
      {_BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status
)
{_BATCH_ANSWER.format(nulls="NULL").strip()}
"""

# $1 task ids, $2 patterns, $3 lease ids, $4 errors, $5 retry flags, $6 retry delays
# in seconds (NULL: the backoff). The transition is FAIL's (FAIL_TRANSITION).
BATCH_FAIL = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::text[], $5::bool[], $6::float8[])
           WITH ORDINALITY AS i(item_id, item_lease, item_error, item_retry, item_delay, ord)
), {_BATCH_HELD.strip()}, done AS (
    UPDATE tasks
       SET {FAIL_TRANSITION.format(retry="l.item_retry", retry_after="l.item_delay")}
           last_error = l.item_error,
           updated_at = clock_timestamp()
      {_BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status, run_at AS new_run_at
)
{_BATCH_ANSWER.format(nulls="NULL, NULL").strip()}
"""

# $1 task ids, $2 patterns, $3 lease ids, $4 lease lengths in seconds. As HEARTBEAT.
BATCH_HEARTBEAT = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::float8[])
           WITH ORDINALITY AS i(item_id, item_lease, item_seconds, ord)
), {_BATCH_HELD.strip()}, done AS (
    UPDATE tasks
       SET lease_expires_at = clock_timestamp() + make_interval(secs => l.item_seconds),
           updated_at = clock_timestamp()
      {_BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status,
              lease_expires_at AS new_lease_expires_at,
              cancel_requested AS new_cancel_requested
)
{_BATCH_ANSWER.format(nulls="NULL, NULL, NULL").strip()}
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
RETURNING t.runtime_id, t.status, t.id
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

# A page of live tokens, or of every token when $1, oldest first: at most $4 after
# (created_at, id) = ($2, $3), keyset paged on api_tokens_listing_idx (migration 0010).
# The first page passes NULLs, which start before any token; the row comparison stays a
# range of the index under a generic plan too.
LIST_TOKENS = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens
 WHERE ($1 OR revoked_at IS NULL)
   AND (created_at, id) > (COALESCE($2::timestamptz, '-infinity'),
                           COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000'))
 ORDER BY created_at, id
 LIMIT $4
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
# hold % or \ (auth.principals.RUNTIME_PATTERN_RE), so this matches exactly what
# auth.principals.glob_match matches. The table is small (one row per sender): a scan
# of the live rows is fine.
WEBHOOK_KEYS_FOR_RUNTIME = """
SELECT signing_key FROM webhook_secrets
 WHERE revoked_at IS NULL
   AND EXISTS (SELECT 1 FROM unnest(runtimes) AS p(pattern)
                WHERE $1 LIKE replace(replace(p.pattern, '_', '\\_'), '*', '%'))
 ORDER BY created_at DESC
"""

# -- the runtimes listing (GET /v1/runtimes, the console) --
#
# A runtime is listed while it holds tasks (live ones, or finished ones retention has
# not removed yet) or has controls set. Both statements read only the partial indexes
# of live rows, the finished-task counters and the controls, so their cost never
# follows the finished history. `scheduled` (a not-yet-due task, which the API reports
# as queued) has its own partial index (runtime_id, run_at); each status is probed on
# its own because a partial index serves `status = 'x'`, not `IN (...)`.

# Up to $2 runtime ids after $1, in id order. Queued and scheduled: a loose index scan,
# one probe per runtime (as CLAIMABLE_RUNTIMES), at most $2 probes. Claimed: the
# leases' partial index, so at most the live leases. Finished and controlled: the
# primary keys of task_counts and runtime_controls. $3, the literal prefixes of a
# token's patterns (NULL: any runtime), skips the runtimes before the smallest one: a
# string never sorts before its own prefix, in any collation.
RUNTIMES_WALK = """
WITH RECURSIVE start(id) AS (
    SELECT COALESCE((SELECT min(p) FROM unnest($3::text[]) AS p), '')
), queued(runtime_id, n) AS (
    (SELECT runtime_id, 1 FROM tasks, start
      WHERE status = 'queued' AND runtime_id > $1 AND runtime_id >= start.id
      ORDER BY runtime_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.runtime_id FROM tasks t
             WHERE t.status = 'queued' AND t.runtime_id > q.runtime_id
             ORDER BY t.runtime_id LIMIT 1), q.n + 1
      FROM queued q
     WHERE q.runtime_id IS NOT NULL AND q.n < $2
), scheduled(runtime_id, n) AS (
    (SELECT runtime_id, 1 FROM tasks, start
      WHERE status = 'scheduled' AND runtime_id > $1 AND runtime_id >= start.id
      ORDER BY runtime_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.runtime_id FROM tasks t
             WHERE t.status = 'scheduled' AND t.runtime_id > s.runtime_id
             ORDER BY t.runtime_id LIMIT 1), s.n + 1
      FROM scheduled s
     WHERE s.runtime_id IS NOT NULL AND s.n < $2
), claimed AS (
    SELECT DISTINCT runtime_id FROM tasks, start
     WHERE status = 'claimed' AND runtime_id > $1 AND runtime_id >= start.id
     ORDER BY runtime_id LIMIT $2
), finished AS (
    -- Finished tasks still stored, from their counters (a few rows per runtime), so
    -- that a runtime whose work is all done stays in view until retention removes it.
    SELECT DISTINCT runtime_id FROM task_counts, start
     WHERE runtime_id > $1 AND runtime_id >= start.id
     ORDER BY runtime_id LIMIT $2
), controlled AS (
    SELECT runtime_id FROM runtime_controls, start
     WHERE runtime_id > $1 AND runtime_id >= start.id
     ORDER BY runtime_id LIMIT $2
)
SELECT runtime_id FROM queued WHERE runtime_id IS NOT NULL
UNION
SELECT runtime_id FROM scheduled WHERE runtime_id IS NOT NULL
UNION
SELECT runtime_id FROM claimed
UNION
SELECT runtime_id FROM finished
UNION
SELECT runtime_id FROM controlled
ORDER BY runtime_id
LIMIT $2
"""

# Counts for a page of runtimes ($1): queued (queued and scheduled, not expired),
# claimed, the age of the oldest due queued task (as OLDEST_QUEUED_AGE), and dead from
# task_counts (as STATS_COUNTS: its per-backend rows of the runtime, never the history). Claimed is
# grouped over the leases' partial index alone: filtering it by runtime would let the
# planner walk a runtime's whole history through (runtime_id, created_at, id).
RUNTIMES_SUMMARY = """
WITH claimed AS MATERIALIZED (
    SELECT runtime_id, count(*) AS n FROM tasks WHERE status = 'claimed' GROUP BY runtime_id
)
SELECT r.runtime_id,
       q.n + s.n AS queued,
       COALESCE(c.n, 0) AS claimed,
       extract(epoch FROM clock_timestamp() - least(q.oldest, s.oldest))::float8
           AS oldest_queued_age_seconds,
       d.n AS dead
  FROM unnest($1::text[]) AS r(runtime_id)
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE t.expires_at IS NULL OR t.expires_at > now()) AS n,
              min(t.created_at) FILTER (WHERE t.run_at <= now()
                                          AND (t.expires_at IS NULL OR t.expires_at > now()))
                  AS oldest
         FROM tasks t WHERE t.runtime_id = r.runtime_id AND t.status = 'queued') q
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE t.expires_at IS NULL OR t.expires_at > now()) AS n,
              min(t.created_at) FILTER (WHERE t.run_at <= now()
                                          AND (t.expires_at IS NULL OR t.expires_at > now()))
                  AS oldest
         FROM tasks t WHERE t.runtime_id = r.runtime_id AND t.status = 'scheduled') s
 CROSS JOIN LATERAL (
       SELECT COALESCE(sum(k.n), 0)::bigint AS n
         FROM task_counts k WHERE k.runtime_id = r.runtime_id AND k.status = 'dead') d
  LEFT JOIN claimed c ON c.runtime_id = r.runtime_id
 ORDER BY r.runtime_id
"""

# -- runtime controls (docs/design.md 5.2; gateway/controls.py) --

CONTROLS_COLUMNS = (
    "runtime_id, paused, max_in_flight, claims_per_second, updated_at, paused_reason, "
    "paused_at, paused_until"
)

GET_CONTROLS = f"SELECT {CONTROLS_COLUMNS} FROM runtime_controls WHERE runtime_id = $1"

# Every runtime with a row: the per-process copy is reloaded from this on a timer.
# Small: a row exists only for a runtime someone paused or limited.
ALL_CONTROLS = f"SELECT {CONTROLS_COLUMNS} FROM runtime_controls"

# $2..$4 are the new values; $5..$7 say which of them the request sets (a PATCH may
# leave a field as it is). A new or changed claims_per_second starts with a full bucket.
# A pause ($5 and $2 true) stores its reason $8 and end $9 (or nulls); paused_at keeps
# the time of a pause still in force, so a second pause changes its reason and end but
# not since when the runtime is paused. A resume clears all three.
SET_CONTROLS = f"""
INSERT INTO runtime_controls AS c (runtime_id, paused, max_in_flight, claims_per_second,
                                   tokens, paused_reason, paused_at, paused_until)
VALUES ($1, COALESCE(CASE WHEN $5 THEN $2::boolean END, false),
        CASE WHEN $6 THEN $3::integer END, CASE WHEN $7 THEN $4::float8 END,
        greatest(COALESCE(CASE WHEN $7 THEN $4::float8 END, 0), 1),
        CASE WHEN $5 AND $2::boolean THEN $8::text END,
        CASE WHEN $5 AND $2::boolean THEN clock_timestamp() END,
        CASE WHEN $5 AND $2::boolean THEN $9::timestamptz END)
ON CONFLICT (runtime_id) DO UPDATE SET
    paused = CASE WHEN $5 THEN $2::boolean ELSE c.paused END,
    max_in_flight = CASE WHEN $6 THEN $3::integer ELSE c.max_in_flight END,
    claims_per_second = CASE WHEN $7 THEN $4::float8 ELSE c.claims_per_second END,
    tokens = CASE WHEN $7 AND $4::float8 IS DISTINCT FROM c.claims_per_second
                  THEN greatest(COALESCE($4::float8, 0), 1) ELSE c.tokens END,
    refilled_at = CASE WHEN $7 AND $4::float8 IS DISTINCT FROM c.claims_per_second
                       THEN clock_timestamp() ELSE c.refilled_at END,
    paused_reason = CASE WHEN NOT $5 THEN c.paused_reason
                         WHEN $2::boolean THEN $8::text END,
    paused_at = CASE WHEN NOT $5 THEN c.paused_at
                     WHEN NOT $2::boolean THEN NULL
                     WHEN c.paused AND (c.paused_until IS NULL
                                        OR c.paused_until > clock_timestamp())
                     THEN COALESCE(c.paused_at, clock_timestamp())
                     ELSE clock_timestamp() END,
    paused_until = CASE WHEN NOT $5 THEN c.paused_until
                        WHEN $2::boolean THEN $9::timestamptz END,
    updated_at = clock_timestamp()
RETURNING {CONTROLS_COLUMNS}
"""

# The first statement of a limited runtime's claim (inside its transaction): locks the
# runtime's control row, which serialises the runtime's claims across every instance,
# and refills its bucket up to now. The burst is one second of claims (at least one).
# The SET expressions are evaluated once the lock is held (after a wait, on the row the
# claim before left), so the refill counts from that claim's refilled_at. A pause whose
# paused_until has passed reads as not paused.
CONTROLS_REFILL = """
UPDATE runtime_controls SET
    tokens = CASE WHEN claims_per_second IS NULL THEN tokens
                  ELSE least(greatest(claims_per_second, 1),
                             tokens + claims_per_second * greatest(
                                 extract(epoch FROM clock_timestamp() - refilled_at)::float8,
                                 0))
             END,
    refilled_at = clock_timestamp()
WHERE runtime_id = $1
RETURNING paused AND (paused_until IS NULL OR paused_until > clock_timestamp()) AS paused,
          max_in_flight, claims_per_second, tokens
"""

# The runtime's tasks leased now. A statement of its own, after CONTROLS_LOCK: its
# snapshot is taken once the lock is held, so it sees the leases of the claim that held
# the lock before (a subquery of CONTROLS_LOCK would use the snapshot from before the
# wait). An index-only scan of tasks_live_idx: its cost follows max_in_flight.
CONTROLS_IN_FLIGHT = """
SELECT count(*) AS n FROM tasks WHERE runtime_id = $1 AND status = 'claimed'
"""

# The bucket after a claim leased $2 tasks: one token each.
CONTROLS_SPEND = """
UPDATE runtime_controls SET tokens = tokens - $2::float8 WHERE runtime_id = $1
"""
