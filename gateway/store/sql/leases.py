"""The statements of store/leases.py (LeaseStatements): the claim (CLAIM, with NEXT_DUE
inside it), the give-back of leases never delivered, and one task's operations under its
lease: heartbeat, complete (alone, or grouped), fail, release, bury.
"""

from __future__ import annotations

from .acks import BATCH_ANSWER, complete_ctes
from .fragments import COMPLETE_TRANSITION, FAIL_TRANSITION, HOLDING_LEASE, TASK_COLUMNS

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
_CLAIM_CTES = f"""
candidates AS (
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
           -- Time-ordered (migration 0009): the lease id says when the lease began,
           -- which the lease's span reads when it ends (gateway/tracing/spans.py).
           lease_id = time_ordered_uuid(),
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
"""
_CLAIM_SELECT = """
SELECT leased.*, next_due.due_in,
       -- Only read when slots are left, and then the candidates were all read anyway.
       CASE WHEN (SELECT count(*) FROM picked) < cardinality($2::text[])
            THEN (SELECT count(*) FILTER (WHERE queued) >= $4
                         OR count(*) FILTER (WHERE NOT queued) >= $4 FROM candidates)
            ELSE false END AS more{acks}
  FROM next_due LEFT JOIN leased ON true
"""
CLAIM = f"""
WITH {_CLAIM_CTES.strip()}
{_CLAIM_SELECT.format(acks="").strip()}
"""

# CLAIM with the completes that the claims it serves carry (a claim's `complete` field,
# gathered by the runtime's pump from every waiter it claims for): they are applied in
# the same statement, and so commit with the leases, one commit and one round trip for
# both. $5 task ids (distinct), $6 lease ids, $7 results (JSON text or NULL), $8 each
# item's runtime patterns, space-separated (a pattern holds no space; NULL: every
# runtime). Each item is answered as acks.BATCH_COMPLETE answers it, the answer rows as
# one JSON array in `acks` (in every row; an init plan computes it once).
#
# The completes cannot meet the claim's rows: a task they complete is `claimed` in the
# statement's snapshot, which the claim's candidates never read; and the tasks the
# claim locks (SKIP LOCKED) are `queued` or `scheduled`, which no complete holds.
_CARRIED_ITEMS = """
    SELECT * FROM unnest($5::uuid[], $6::uuid[], $7::text[], $8::text[])
           WITH ORDINALITY AS i(item_id, item_lease, item_result, item_patterns, ord)"""
_ACKS_COLUMN = """,
       (SELECT json_agg(answer ORDER BY ord) FROM answer)::text AS acks"""
CLAIM_ACKED = f"""
WITH {complete_ctes(_CARRIED_ITEMS, "string_to_array(i.item_patterns, ' ')")}, answer AS (
{BATCH_ANSWER.format(nulls="NULL").strip()}
), {_CLAIM_CTES.strip()}
{_CLAIM_SELECT.format(acks=_ACKS_COLUMN).strip()}
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

HEARTBEAT = f"""
UPDATE tasks
   SET lease_expires_at = clock_timestamp() + make_interval(secs => $3),
       updated_at = clock_timestamp()
 WHERE id = $1 AND lease_id = $2 AND status = 'claimed'
RETURNING {TASK_COLUMNS}
"""

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
