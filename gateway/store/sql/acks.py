"""The statements of store/acks.py (BatchAckStatements): complete, fail and heartbeat many
tasks, each item under its own lease, in one statement whatever the batch's size.
"""

from __future__ import annotations

from .fragments import COMPLETE_TRANSITION, EFFECTIVE_STATUS, FAIL_TRANSITION, HOLDING_LEASE

# Whether a token's runtime patterns ({patterns}, a text[]; NULL: every runtime) cover
# the runtime in {runtime}. A pattern's * becomes LIKE's %, its _ is escaped, as in
# credentials.WEBHOOK_KEYS_FOR_RUNTIME: it matches exactly what auth.principals.glob_match matches.
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
# again) would make a claim running meanwhile skip it (leases.CLAIM: SKIP LOCKED) and record
# the runtime empty over it. When such a row was changed since the snapshot (another
# request reported it, the janitor reclaimed it), the lock waits for that change and
# reads the newest version: `now_holder` tells whether the item's lease still holds
# it. A locked row the lease holds is the lease's until commit, and the statement
# changes it (`done`); one it no longer holds is answered as that change left it, as a
# repeat is answered as the first was. The lock on such a row lasts one statement; a
# claim that skips it in that instant is what the janitor's repair (I6) covers, as
# for the single-row statements (leases.HEARTBEAT, leases.COMPLETE: an UPDATE does the
# same).
#
# The others are read without a lock, as the snapshot shows them: the answer for
# such an item (lease_lost with the task's status, a replay, not found) is the one it
# had when the statement began.
#
# Each step reads the one before it once and probes the primary key once per item
# (one-element arrays, as leases._LEASE_HELD), and the answer is the three kinds of item put
# together (BATCH_ANSWER): no step joins two lists of items, which a generic plan
# would do by scanning one of them once per row of the other (see leases._LEASE_HELD).
def batch_held(patterns: str) -> str:
    """`seen` and `locked` over `items`, for callers whose runtime patterns are the SQL
    expression `patterns` (a text[]; NULL: every runtime): a parameter when the batch is
    one caller's, a column of the items when each item comes with its caller's
    (leases.CLAIM_ACKED)."""
    return f"""
seen AS MATERIALIZED (
    SELECT i.*, tasks.id AS seen_id, tasks.runtime_id AS seen_runtime,
           tasks.lease_id AS seen_lease, {EFFECTIVE_STATUS} AS seen_status,
           {HOLDING_LEASE} AS seen_holder
      FROM items i
      LEFT JOIN tasks ON tasks.id = ANY (ARRAY[i.item_id])
           AND {RUNTIME_COVERED.format(patterns=patterns, runtime="tasks.runtime_id")}
), locked AS MATERIALIZED (
    SELECT s.*, tasks.runtime_id AS now_runtime, tasks.lease_id AS now_lease,
           {EFFECTIVE_STATUS} AS now_status, {HOLDING_LEASE} AS now_holder
      FROM seen s JOIN tasks ON tasks.id = ANY (ARRAY[s.seen_id])
     WHERE s.seen_holder = s.item_lease
     ORDER BY tasks.id
       FOR UPDATE OF tasks
)"""


_BATCH_HELD = batch_held("$2")

# The rows `done` changes: those of `locked` that their item's lease still holds.
BATCH_DONE = """
      FROM locked l
     WHERE tasks.id = ANY (ARRAY[l.seen_id]) AND l.now_holder = l.item_lease
    RETURNING l.ord, l.item_id, l.item_lease, l.now_runtime AS found_runtime,
              'claimed' AS found_status, l.item_lease AS found_lease,"""

# One row per item, in the request's order: the task as found (found_*; no runtime
# means not found) and, when this statement changed it, its new state (new_*, NULL
# otherwise: {nulls} is one NULL per new_* column `done` returns). A task that the
# snapshot showed held by its item's lease but that was gone once locked (deleted
# meanwhile) has no row: the caller counts a missing item as not found.
BATCH_ANSWER = """
SELECT * FROM done
UNION ALL
SELECT ord, item_id, item_lease, now_runtime, now_status, now_lease, {nulls}
  FROM locked WHERE now_holder IS DISTINCT FROM item_lease
UNION ALL
SELECT ord, item_id, item_lease, seen_runtime, seen_status, seen_lease, {nulls}
  FROM seen WHERE seen_holder IS DISTINCT FROM item_lease
 ORDER BY ord
"""


# complete's `done` over `items` (item_id, item_lease, item_result, ord), for callers
# whose runtime patterns are the SQL expression `patterns` (batch_held): the CTEs of
# BATCH_COMPLETE, and of leases.CLAIM_ACKED, which answers a claim's carried completes
# in the same statement as the claim. As leases.COMPLETE: a cancel requested while
# held ends the task cancelled.
def complete_ctes(items: str, patterns: str) -> str:
    return f"""items AS ({items.strip()}
), {batch_held(patterns).strip()}, done AS (
    UPDATE tasks
       SET {COMPLETE_TRANSITION.format(result="l.item_result::jsonb")}
      {BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status
)"""


# $1 task ids (distinct), $2 runtime patterns or NULL, $3 lease ids, $4 results (JSON
# text or NULL).
_COMPLETE_ITEMS = """
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::text[])
           WITH ORDINALITY AS i(item_id, item_lease, item_result, ord)"""
BATCH_COMPLETE = f"""
WITH {complete_ctes(_COMPLETE_ITEMS, "$2")}
{BATCH_ANSWER.format(nulls="NULL").strip()}
"""

# $1 task ids, $2 patterns, $3 lease ids, $4 errors, $5 retry flags, $6 retry delays
# in seconds (NULL: the backoff). The transition is leases.FAIL's
# (FAIL_TRANSITION).
BATCH_FAIL = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::text[], $5::bool[], $6::float8[])
           WITH ORDINALITY AS i(item_id, item_lease, item_error, item_retry, item_delay, ord)
), {_BATCH_HELD.strip()}, done AS (
    UPDATE tasks
       SET {FAIL_TRANSITION.format(retry="l.item_retry", retry_after="l.item_delay")}
           last_error = l.item_error,
           updated_at = clock_timestamp()
      {BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status, run_at AS new_run_at
)
{BATCH_ANSWER.format(nulls="NULL, NULL").strip()}
"""

# $1 task ids, $2 patterns, $3 lease ids, $4 lease lengths in seconds. As
# leases.HEARTBEAT.
BATCH_HEARTBEAT = f"""
WITH items AS (
    SELECT * FROM unnest($1::uuid[], $3::uuid[], $4::float8[])
           WITH ORDINALITY AS i(item_id, item_lease, item_seconds, ord)
), {_BATCH_HELD.strip()}, done AS (
    UPDATE tasks
       SET lease_expires_at = clock_timestamp() + make_interval(secs => l.item_seconds),
           updated_at = clock_timestamp()
      {BATCH_DONE.strip()}
              {EFFECTIVE_STATUS} AS new_status,
              lease_expires_at AS new_lease_expires_at,
              cancel_requested AS new_cancel_requested
)
{BATCH_ANSWER.format(nulls="NULL, NULL, NULL").strip()}
"""
