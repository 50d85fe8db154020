"""The statements of store/history.py (HistoryStatements): the janitor's rollup of the
per-runtime history (the bucket width, the fold, the depth of the bucket that just
ended, retention) and the history's reads (a runtime's points, the fleet's points and
top lists, the listing's sparklines). The counts themselves are written by the triggers
of migration 0015, in the transaction of each statement that changes a task.
"""

from __future__ import annotations

from .acks import RUNTIME_COVERED
from .runtimes import QUEUED_LATERALS

# The bucket width the triggers read (history_settings), when it differs from $1: the
# janitor's leader writes GATEWAY_HISTORY_INTERVAL_SECONDS there every pass.
SET_INTERVAL = """
UPDATE history_settings SET interval_seconds = $1 WHERE interval_seconds <> $1
"""

_COUNTERS = ("enqueued", "claimed", "completed", "failed", "dead", "expired", "cancelled")
_SUMS = ", ".join(f"sum({c})::bigint AS {c}" for c in _COUNTERS)
# The rows' `waits` summed element by element: 14 plain sums (one per wait bucket of
# migration 0015), which cost a fraction of an aggregate over unnested arrays.
WAIT_BUCKETS = 14
_WAITS_SUM = (
    "ARRAY["
    + ", ".join(f"sum(waits[{i}])::bigint" for i in range(1, WAIT_BUCKETS + 1))
    + "]::bigint[]"
)
_ADDED = ",\n    ".join(f"{c} = h.{c} + EXCLUDED.{c}" for c in _COUNTERS)

# Folds up to $1 per-backend rows of buckets that have ended into their backend-0 rows,
# so that a bucket keeps one row per runtime however many backends wrote to it. Rows of
# the current bucket are still being written and wait for its end. A row a transaction
# is still changing is skipped (SKIP LOCKED) and folded at a later pass; so is a row
# written late into an ended bucket (by a transaction that began in it). The upsert
# goes in key order, as the triggers write theirs, and only the fold writes backend 0.
# Walks task_history_unfolded_idx.
FOLD = f"""
WITH picked AS (
    SELECT runtime_id, at, backend FROM task_history
     WHERE backend <> 0 AND at < history_bucket()
     ORDER BY at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM task_history h USING picked p
     WHERE (h.runtime_id, h.at, h.backend) = (p.runtime_id, p.at, p.backend)
    RETURNING h.*
)
INSERT INTO task_history AS h (runtime_id, at, backend, {", ".join(_COUNTERS)}, waits)
SELECT runtime_id, at, 0, {_SUMS}, {_WAITS_SUM} FROM moved
 GROUP BY runtime_id, at
 ORDER BY runtime_id, at
ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
    {_ADDED},
    waits = history_waits_add(h.waits, EXCLUDED.waits)
"""

# The start of the bucket before the current one: a scalar subquery, which Postgres
# runs once and then probes task_history_at_idx with (joined as a CTE, the planner may
# sort and merge the whole table against it).
_ENDED = "SELECT history_bucket() - make_interval(secs => interval_seconds) FROM history_settings"

# The queue depth and the oldest queued age of up to $1 runtimes with activity in the
# bucket that has just ended (the one before the current), read now, shortly after its
# end, into their folded rows. Only that bucket: a depth read later would be another
# moment's. A runtime without activity has no row, and its depth is the one of its last
# point. The depth is counted as the runtimes listing counts `queued` (QUEUED_LATERALS:
# queued and not yet due, not expired), for each runtime from its own partial indexes:
# the cost follows the queued tasks of the runtimes that had activity, never the
# history.
FILL_DEPTH = f"""
WITH r AS (
    SELECT h.runtime_id FROM task_history h
     WHERE h.at = ({_ENDED}) AND h.backend = 0 AND h.depth IS NULL
     ORDER BY h.runtime_id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
), counted AS (
    SELECT r.runtime_id, q.n + s.n AS depth,
           extract(epoch FROM clock_timestamp() - least(q.oldest, s.oldest))::float8 AS oldest
      FROM r
{QUEUED_LATERALS}
)
UPDATE task_history h
   SET depth = counted.depth, oldest_queued_age_seconds = counted.oldest
  FROM counted
 WHERE (h.runtime_id, h.at, h.backend) = (counted.runtime_id, ({_ENDED}), 0)
"""

# Retention (GATEWAY_HISTORY_DAYS): one bounded batch of the oldest buckets' rows.
PURGE = """
DELETE FROM task_history WHERE (runtime_id, at, backend) IN (
    SELECT runtime_id, at, backend FROM task_history
     WHERE at < now() - make_interval(days => $1)
     ORDER BY at
     LIMIT $2
)
"""

# One bucket's point, summed over the rows grouped (backends, or runtimes too).
_POINT = f"""at, {_SUMS}, {_WAITS_SUM} AS waits"""

# A runtime's points over the last $2 seconds, oldest first: one range of the primary
# key. Rows of backends not folded yet are added in. The window is a row comparison,
# which only the primary key (runtime_id, at, ...) serves: with `at > ...` alone, the
# planner walked task_history_at_idx over every runtime's rows of the window for a
# runtime with a long history (its estimate of the window's share is a guess).
RUNTIME_POINTS = f"""
SELECT {_POINT}, max(depth) AS depth,
       max(oldest_queued_age_seconds) AS oldest_queued_age_seconds
  FROM task_history
 WHERE runtime_id = $1 AND (runtime_id, at) > ($1, now() - make_interval(secs => $2))
 GROUP BY at
 ORDER BY at
"""

# The fleet's points over the last $1 seconds, summed over the runtimes that the
# patterns $2 cover (NULL: every runtime): the depth is the sum of the depths read in
# that bucket (of the runtimes with activity in it), the oldest age the greatest. Walks
# task_history_at_idx over the window.
_COVERED = RUNTIME_COVERED.format(patterns="$2", runtime="runtime_id")
FLEET_POINTS = f"""
SELECT {_POINT}, sum(depth)::bigint AS depth,
       max(oldest_queued_age_seconds) AS oldest_queued_age_seconds
  FROM task_history
 WHERE at > now() - make_interval(secs => $1) AND {_COVERED}
 GROUP BY at
 ORDER BY at
"""

# The covered runtimes with the deepest queues: each one's last depth read in the
# window, the 10 deepest (ties by runtime id). A runtime the patterns do not cover is
# never read, so its name cannot leak.
TOP_BY_DEPTH = f"""
SELECT runtime_id, depth FROM (
    SELECT DISTINCT ON (runtime_id) runtime_id, depth FROM task_history
     WHERE at > now() - make_interval(secs => $1) AND backend = 0 AND depth IS NOT NULL
       AND {_COVERED}
     ORDER BY runtime_id, at DESC
) latest
 WHERE depth > 0
 ORDER BY depth DESC, runtime_id
 LIMIT 10
"""

# The covered runtimes with the most failures (failed and dead together) in the window,
# the 10 most.
TOP_BY_FAILURES = f"""
SELECT runtime_id, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead
  FROM task_history
 WHERE at > now() - make_interval(secs => $1) AND {_COVERED}
 GROUP BY runtime_id
HAVING sum(failed) + sum(dead) > 0
 ORDER BY sum(failed) + sum(dead) DESC, runtime_id
 LIMIT 10
"""

# The depth series of a page of runtimes ($1) over the last $2 seconds, for the
# listing's sparklines: one statement for the page, a range of the primary key each.
SPARKLINES = """
SELECT runtime_id, at, depth FROM task_history
 WHERE runtime_id = ANY ($1::text[]) AND at > now() - make_interval(secs => $2)
   AND backend = 0 AND depth IS NOT NULL
 ORDER BY runtime_id, at
"""
