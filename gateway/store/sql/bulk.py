"""The statements of store/bulk.py (BulkStatements): a runtime's tasks retried or
cancelled in bulk, a bounded number per statement, and the most common errors among its
recent tasks.

What reads finished tasks (RETRY_MATCHING, ERROR_GROUPS) walks the runtime's tasks in
the status asked for, newest first, through `tasks_ended_badly_idx` (migration 0016),
at most `$3` of them (api/bulk_bodies.HISTORY_ROWS): its cost is bounded whatever the
runtime's history. A retried task leaves the status, so calls made again reach older
ones. A queued task past its expiry is `expired` to readers at once, but is found here
once the janitor has stored it so (within a pass).
"""

from __future__ import annotations

from .fragments import CANCEL_TRANSITION, EFFECTIVE_STATUS, RETRY_TRANSITION


def _recent(columns: str) -> str:
    """The runtime's newest $3 tasks stored in status $2, newest first, as `columns`: a
    backward walk of tasks_ended_badly_idx that stops after $3 entries. A subquery with
    its own LIMIT, so that the conditions put on its rows never make it a longer walk.
    The `status IN (...)` repeats the index's predicate: a generic plan cannot prove
    from `status = $2` alone that the partial index holds the rows."""
    return f"""
    SELECT {columns} FROM tasks
     WHERE runtime_id = $1 AND status = $2::text AND status IN ('dead', 'expired', 'cancelled')
     ORDER BY created_at DESC
     LIMIT $3"""


# A task's error as RETRY_MATCHING's prefix matches it, literally and case-sensitively:
# starts_with() gives `%`, `_` and `\\` no meaning, where LIKE would need them escaped.
# ($4: the prefix; NULL matches every task, with an error or without.)
_PREFIX = "($4::text IS NULL OR starts_with(last_error, $4::text))"

# The effective status ($2: dead, expired or cancelled) and the prefix, on a row.
_MATCHES = f"({EFFECTIVE_STATUS}) = $2 AND {_PREFIX}"

# Up to $5 of the runtime's recent tasks ($3, _recent) whose effective status is $2 and
# whose error starts with $4, retried as one task's retry is (RETRY_TRANSITION). One
# statement, one round trip, no explicit transaction.
#
# The candidates are read without a lock, $5 + 1 of them, the one past the limit telling
# whether more match. Each is then locked in turn (SKIP LOCKED, its conditions tested
# again on the locked row) until $5 are held, so every row locked is retried: none of
# them is claimable before the commit, and a row another statement holds (a single
# retry, the janitor's expiry, a cancel) is skipped, never waited for, so two bulk calls
# never deadlock. A row whose newest version no longer matches stays locked until the
# statement ends all the same (the lock is taken before the test): a claim in that
# instant skips it, so the caller bumps the runtime after every run (store/bulk.py).
#
# Each locked id as a one-element array in the update: probed by primary key whatever
# the plan (leases.CLAIM's reason). `more`: a candidate was left, past the limit or held
# by another statement.
RETRY_MATCHING = f"""
WITH candidates AS (
    SELECT id FROM ({_recent("id, status, expires_at, last_error")}) recent
     WHERE {_MATCHES}
     LIMIT $5 + 1
), picked AS (
    SELECT locked.id
      FROM candidates c
     CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
         WHERE t.id = c.id AND {_MATCHES}
           FOR UPDATE SKIP LOCKED
     ) locked
     LIMIT $5
), retried AS (
    UPDATE tasks
       SET {RETRY_TRANSITION}
      FROM picked
     WHERE tasks.id = ANY (ARRAY[picked.id])
    RETURNING tasks.id
)
SELECT (SELECT count(*) FROM retried)::int AS n,
       (SELECT count(*) FROM candidates) > (SELECT count(*) FROM picked) AS more
"""

# Up to $2 of the runtime's queued tasks (due or not, not expired) cancelled, as one
# queued task's cancel is (CANCEL_TRANSITION), in no particular order. The candidates
# come from tasks_live_idx, so the statement reads at most $2 + 1 of them, however long
# the runtime's history. Locked as RETRY_MATCHING locks: every row locked is cancelled,
# so a claim that skips one (SKIP LOCKED) and finds the runtime empty is right about
# it, once the statement commits. A row a claim holds is skipped: that claim leases it.
# The ids come back, for the waits on their results (a cancel ends a task).
CANCEL_QUEUED = f"""
WITH candidates AS (
    SELECT id FROM tasks
     WHERE runtime_id = $1 AND status IN ('queued', 'scheduled')
       AND (expires_at IS NULL OR expires_at > now())
     LIMIT $2 + 1
), picked AS (
    SELECT locked.id
      FROM candidates c
     CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
         WHERE t.id = c.id AND t.status IN ('queued', 'scheduled')
           AND (t.expires_at IS NULL OR t.expires_at > now())
           FOR UPDATE SKIP LOCKED
     ) locked
     LIMIT $2
), cancelled AS (
    UPDATE tasks
       SET {CANCEL_TRANSITION}
      FROM picked
     WHERE tasks.id = ANY (ARRAY[picked.id])
    RETURNING tasks.id
)
SELECT (SELECT array_agg(id) FROM cancelled) AS ids,
       (SELECT count(*) FROM candidates) > (SELECT count(*) FROM picked) AS more
"""

# A task's error line, as the groups show it and RETRY_MATCHING's prefix takes it back:
# the first line of last_error, at most 200 characters; an error that begins with a
# line break is shown by its first 200 characters. NULL for a task with no error text.
ERROR_LINE = """CASE WHEN last_error = '' THEN NULL
            WHEN split_part(last_error, E'\\n', 1) = '' THEN left(last_error, 200)
            ELSE left(split_part(last_error, E'\\n', 1), 200) END"""

# The $4 most common error lines among the runtime's recent tasks ($3, _recent) whose
# effective status is $2, most common first (then the newest): each with its count, the
# time of its newest occurrence (when that task finished) and that task's id. `read`:
# how many tasks the walk read, in every row; one row with a NULL line when no task
# had an error. Each matching task's line is cut from its error as the walk reads it,
# so that what is kept for the grouping is at most 200 characters a task.
_ERROR_COLUMNS = f"""id, CASE WHEN ({EFFECTIVE_STATUS}) = $2 THEN {ERROR_LINE} END AS line,
           COALESCE(finished_at, updated_at) AS at"""
ERROR_GROUPS = f"""
WITH recent AS ({_recent(_ERROR_COLUMNS)}
), groups AS (
    SELECT line, count(*)::int AS n, max(at) AS last_at,
           (array_agg(id ORDER BY at DESC, id DESC))[1] AS example_id
      FROM recent
     WHERE line IS NOT NULL
     GROUP BY line
     ORDER BY n DESC, last_at DESC, line
     LIMIT $4
)
SELECT r.read, g.line, g.n, g.last_at, g.example_id
  FROM (SELECT count(*)::int AS read FROM recent) r
  LEFT JOIN groups g ON true
 ORDER BY g.n DESC, g.last_at DESC, g.line
"""
