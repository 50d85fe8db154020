"""The statements of store/tasks.py (TaskStatements): enqueue, one task or a batch in one
statement (and the JSON of new tasks that Postgres writes for a batch's answer), and a
task's statements outside any lease: get, cancel, retry, the listing and a runtime's
stats.
"""

from __future__ import annotations

from .fragments import CANCEL_TRANSITION, EFFECTIVE_STATUS, RETRY_TRANSITION, TASK_COLUMNS

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
                   idempotency_key, request_hash, trace_parent, trace_state)
SELECT $1, CASE WHEN due.t > clock_timestamp() THEN 'scheduled' ELSE 'queued' END,
       $2, $3, $4, due.t,
       due.t + make_interval(secs => $7::float8), $8, $9, $10, $11 FROM due
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

# ENQUEUE for a task due now, written already leased to a poll parked on this instance
# (sync match, claim/claimer.py) as leases.CLAIM would lease it: one attempt, the poll's worker and
# lease length ($8, $9). The task and lease ids ($10, $11) come from the caller, so
# that an enqueue whose answer is lost can give the task back (UNCLAIM_LEASE). No task
# becomes claimable, so no bump follows (I1).
ENQUEUE_LEASED = f"""
WITH due AS (SELECT clock_timestamp() AS t)
INSERT INTO tasks (id, runtime_id, status, priority, payload, max_attempts, run_at,
                   expires_at, idempotency_key, request_hash, attempts, lease_id,
                   lease_expires_at, worker_id, updated_at, trace_parent, trace_state)
SELECT $10, $1, 'claimed', $2, $3, $4, due.t, due.t + make_interval(secs => $5::float8), $6,
       $7, 1, $11, due.t + make_interval(secs => $9::float8), $8, due.t, $12, $13 FROM due
ON CONFLICT (runtime_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {TASK_COLUMNS}, request_hash
"""

# The task an idempotency key already made, for a replay or a key-reuse refusal.
GET_BY_IDEMPOTENCY_KEY = f"""
SELECT {TASK_COLUMNS}, request_hash FROM tasks WHERE runtime_id = $1 AND idempotency_key = $2
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

# The stored trace contexts of some tasks, for their lease spans (read only while
# tracing is on; by primary key).
TRACE_CONTEXTS = """
SELECT id, trace_parent, trace_state FROM tasks
 WHERE id = ANY($1::uuid[]) AND trace_parent IS NOT NULL
"""

# Whose task this is, for a token limited to some runtimes.
TASK_RUNTIME = "SELECT runtime_id FROM tasks WHERE id = $1"


def _json_time(column: str) -> str:
    """SQL for a timestamptz column as api/render.format_time writes it, quoted, or null."""
    spelled = f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
    return f"""COALESCE('"' || {spelled} || '"', 'null')"""


# A task's `trace` member as api/render.task_json writes it (after its other members),
# or nothing for a task without one.
_TRACE_JSON = """COALESCE(',"trace":{"traceparent":' || to_json(trace_parent)
    || COALESCE(',"tracestate":' || to_json(trace_state), '') || '}', '')"""


# A new task's JSON object, byte for byte what api/render.task_bytes makes of the row (a
# new task is never claimed, completed or failed, so only TASK_FIELDS appear), written
# by Postgres in the INSERT's RETURNING: a batch's answer then costs the gateway one
# text column per task instead of seventeen decoded ones, a row object and a render.
# The payload is the text Postgres writes for the jsonb, as every answer embeds it.
# tests/integration/test_enqueue_round_trips.py holds it to api/render.task_bytes.
NEW_TASK_JSON = (
    """'{"id":"' || id || '","runtime_id":' || to_json(runtime_id) || ',"status":"' || """
    f"""({EFFECTIVE_STATUS}) || '","priority":' || priority || ',"payload":' || payload::text """
    """|| ',"attempts":' || attempts || ',"max_attempts":' || max_attempts || ',"run_at":' """
    f"""|| {_json_time("run_at")} || ',"expires_at":' || {_json_time("expires_at")} """
    f"""|| ',"created_at":' || {_json_time("created_at")} """
    f"""|| ',"updated_at":' || {_json_time("updated_at")} || {_TRACE_JSON} || '}}'"""
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
                   expires_at, idempotency_key, request_hash, created_at, trace_parent,
                   trace_state)
SELECT i.id, $1, {_BATCH_ROW}, i.idempotency_key, i.request_hash, {_BATCH_CREATED_AT},
       i.trace_parent, i.trace_state
  FROM base,
       ROWS FROM (unnest($2::uuid[]), unnest($3::text::int[]), json_array_elements($4::json),
                  unnest($5::text::int[]), unnest($6::timestamptz[]), unnest($7::float8[]),
                  unnest($8::float8[]), unnest($9::text[]), unnest($10::text[]),
                  unnest($11::text[]), unnest($12::text[]))
       WITH ORDINALITY
       AS i(id, priority, payload, max_attempts, run_at, delay, ttl, idempotency_key,
            request_hash, trace_parent, trace_state, ord),
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
                   expires_at, created_at, trace_parent, trace_state)
SELECT $1, {_BATCH_ROW}, {_BATCH_CREATED_AT}, i.trace_parent, i.trace_state
  FROM base,
       ROWS FROM (unnest($2::text::int[]), json_array_elements($3::json),
                  unnest($4::text::int[]), unnest($5::timestamptz[]), unnest($6::float8[]),
                  unnest($7::float8[]), unnest($8::text[]), unnest($9::text[]))
       WITH ORDINALITY
       AS i(priority, payload, max_attempts, run_at, delay, ttl, trace_parent, trace_state,
            ord),
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
   SET {CANCEL_TRANSITION}
 WHERE id = $1 AND {EFFECTIVE_STATUS} IN ('queued', 'claimed')
RETURNING {TASK_COLUMNS}
"""

# A dead, expired or cancelled task runs again at once (RETRY_TRANSITION).
RETRY = f"""
UPDATE tasks
   SET {RETRY_TRANSITION}
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

# LIST_TASKS for the tasks one schedule ($6) made: a statement of its own, so that its
# plan walks tasks_schedule_idx (only scheduled tasks have entries) whatever the
# runtime's other tasks.
LIST_SCHEDULE_TASKS = f"""
SELECT {TASK_COLUMNS} FROM tasks
 WHERE runtime_id = $1 AND schedule = $6 AND schedule IS NOT NULL
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
