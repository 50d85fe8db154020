"""The statements of store/history.py (HistoryStatements): the janitor's rollup of the
per-runtime history (the bucket width, the fold, the depth of the bucket that just
ended, retention), which also keeps the rollups of migration 0017 (the fleet's buckets,
the runtimes' last depths, their hourly failures), and the history's reads (a
runtime's points, the fleet's points and top lists, from the rollups for a token that
covers every runtime and from the covered runtimes' own rows for another, the
listing's sparklines). The counts themselves are written by the triggers of migration
0015, in the transaction of each statement that changes a task.
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
_ZEROS = "'{" + ",".join("0" * WAIT_BUCKETS) + "}'::bigint[]"


def _added(alias: str, columns: tuple[str, ...] = _COUNTERS) -> str:
    """An upsert's SET list adding the proposed row's `columns` to the stored row's."""
    return ",\n    ".join(f"{c} = {alias}.{c} + EXCLUDED.{c}" for c in columns)


# Folds up to $1 per-backend rows of buckets that have ended into their backend-0 rows,
# so that a bucket keeps one row per runtime however many backends wrote to it; returns
# how many it moved. Rows of the current bucket are still being written and wait for
# its end. A row a transaction is still changing is skipped (SKIP LOCKED) and folded at
# a later pass; so is a row written late into an ended bucket (by a transaction that
# began in it). The upsert goes in key order, as the triggers write theirs, and only
# the fold writes backend 0. Walks task_history_unfolded_idx.
#
# The same statement adds what it moves to the rollups of migration 0017: the bucket's
# fleet row, each runtime's failures of the hour (only when it had some) and each
# runtime's last bucket. Every count reaches backend 0 through here once, so adding it
# here, in the transaction that deletes the per-backend row, keeps the rollups exact
# without reading a bucket again, also for a row folded late into a bucket folded
# before: recomputing the touched buckets instead would read every runtime's row of
# each (10,000 a minute for 10,000 active runtimes) at every pass. A re-run moves
# nothing and adds nothing.
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
), folded AS (
    INSERT INTO task_history AS h (runtime_id, at, backend, {", ".join(_COUNTERS)}, waits)
    SELECT runtime_id, at, 0, {_SUMS}, {_WAITS_SUM} FROM moved
     GROUP BY runtime_id, at
     ORDER BY runtime_id, at
    ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
        {_added("h")},
        waits = history_waits_add(h.waits, EXCLUDED.waits)
), fleet AS (
    INSERT INTO task_history_fleet AS f (at, {", ".join(_COUNTERS)}, waits)
    SELECT at, {_SUMS}, {_WAITS_SUM} FROM moved
     GROUP BY at
     ORDER BY at
    ON CONFLICT (at) DO UPDATE SET
        {_added("f")},
        waits = history_waits_add(f.waits, EXCLUDED.waits)
), failures AS (
    INSERT INTO task_history_failures AS f (runtime_id, hour, failed, dead)
    SELECT runtime_id, history_hour(at), sum(failed), sum(dead) FROM moved
     WHERE failed + dead > 0
     GROUP BY runtime_id, history_hour(at)
     ORDER BY runtime_id, history_hour(at)
    ON CONFLICT (runtime_id, hour) DO UPDATE SET
        {_added("f", ("failed", "dead"))}
), runtimes AS (
    INSERT INTO task_history_runtimes AS r (runtime_id, last_at)
    SELECT runtime_id, max(at) FROM moved
     GROUP BY runtime_id
     ORDER BY runtime_id
    ON CONFLICT (runtime_id) DO UPDATE SET last_at = EXCLUDED.last_at
     WHERE r.last_at < EXCLUDED.last_at
)
SELECT count(*) FROM moved
"""

# The start of the bucket before the current one: a scalar subquery, which Postgres
# runs once and then probes task_history_at_idx with (joined as a CTE, the planner may
# sort and merge the whole table against it).
_ENDED = "SELECT history_bucket() - make_interval(secs => interval_seconds) FROM history_settings"

# The queue depth and the oldest queued age of up to $1 runtimes with activity in the
# bucket that has just ended (the one before the current), read now, shortly after its
# end, into their folded rows; returns how many. Only that bucket: a depth read later
# would be another moment's. A runtime without activity has no row, and its depth is
# the one of its last point. The depth is counted as the runtimes listing counts
# `queued` (QUEUED_LATERALS: queued and not yet due, not expired), for each runtime from
# its own partial indexes: the cost follows the queued tasks of the runtimes that had
# activity, never the history.
#
# The same statement carries the depths into the rollups of migration 0017: it adds
# them to the bucket's fleet row (its depth is the sum of the depths read in it, its
# age the greatest) and makes them each runtime's last depth read. A row's depth is
# written once (only rows still without one are picked), so each depth is added once;
# the depth arrives a pass or more after the fold brought the bucket's counts, and the
# fleet row's depth stays null until then, as the sum of no depth read.
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
), filled AS (
    UPDATE task_history h
       SET depth = counted.depth, oldest_queued_age_seconds = counted.oldest
      FROM counted
     WHERE (h.runtime_id, h.at, h.backend) = (counted.runtime_id, ({_ENDED}), 0)
    RETURNING h.runtime_id, h.at, h.depth, h.oldest_queued_age_seconds
), fleet AS (
    INSERT INTO task_history_fleet AS f (at, waits, depth, oldest_queued_age_seconds)
    SELECT at, {_ZEROS}, sum(depth), max(oldest_queued_age_seconds) FROM filled
     GROUP BY at
    ON CONFLICT (at) DO UPDATE SET
        depth = coalesce(f.depth, 0) + EXCLUDED.depth,
        oldest_queued_age_seconds =
            greatest(f.oldest_queued_age_seconds, EXCLUDED.oldest_queued_age_seconds)
), latest AS (
    INSERT INTO task_history_runtimes AS l (runtime_id, last_at, depth_at, depth)
    SELECT runtime_id, at, at, depth FROM filled
     ORDER BY runtime_id
    ON CONFLICT (runtime_id) DO UPDATE SET
        last_at = greatest(l.last_at, EXCLUDED.last_at),
        depth_at = EXCLUDED.depth_at,
        depth = EXCLUDED.depth
     WHERE l.depth_at IS NULL OR l.depth_at <= EXCLUDED.depth_at
)
SELECT count(*) FROM filled
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

# Retention of the rollups (migration 0017), a bounded batch each, oldest first, by
# their own indexes: the fleet's buckets past $1 days; the failures' hours that ended
# before the hour holding the cutoff (that hour is kept whole, as a 7d read starts at
# it); the runtimes whose last bucket is past it (their history is gone). The outer
# DELETE repeats the cutoff so that it too reads the old rows by the index, not the
# whole table to join them.
_OLD = "now() - make_interval(days => $1)"
PURGE_ROLLUPS = {
    "fleet": f"""
DELETE FROM task_history_fleet WHERE at < {_OLD} AND at IN (
    SELECT at FROM task_history_fleet WHERE at < {_OLD} ORDER BY at LIMIT $2
)
""",
    "failures": f"""
DELETE FROM task_history_failures
 WHERE hour < history_hour({_OLD}) AND (runtime_id, hour) IN (
    SELECT runtime_id, hour FROM task_history_failures
     WHERE hour < history_hour({_OLD}) ORDER BY hour LIMIT $2
)
""",
    "runtimes": f"""
DELETE FROM task_history_runtimes WHERE last_at < {_OLD} AND runtime_id IN (
    SELECT runtime_id FROM task_history_runtimes WHERE last_at < {_OLD} ORDER BY last_at LIMIT $2
)
""",
}

# One bucket's point, summed over the rows grouped (backends, or runtimes too).
_POINT = f"""at, {_SUMS}, {_WAITS_SUM} AS waits"""
_ROW = f"at, {', '.join(_COUNTERS)}, waits, depth, oldest_queued_age_seconds"
_FLEET_POINT = f"""{_POINT}, sum(depth)::bigint AS depth,
       max(oldest_queued_age_seconds) AS oldest_queued_age_seconds"""

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

# The fleet's reads run in a transaction of their own with this first: Postgres compiles
# a statement whose estimated cost passes jit_above_cost, and a limited token's reads
# over a week (their estimate guesses half the runtimes covered) spent 0.3 to 0.7 s
# compiling where they ran in 0.3 s. The transaction also gives the three reads one
# now(), so they cover the same window.
NO_JIT = "SET LOCAL jit = off"

_SINCE = "now() - make_interval(secs => $1)"
# The first hour a top list by failures over a day or a week counts: the whole hour
# (UTC) in which the window begins.
_FIRST_HOUR = f"history_hour({_SINCE})"
_COVERED = RUNTIME_COVERED.format(patterns="$2", runtime="runtime_id")

# The fleet's points over the last $1 seconds, for a token covering every runtime: the
# fleet rows of the window (one per bucket, task_history_fleet's primary key), with the
# per-backend rows not folded yet added in (task_history_unfolded_idx: the current
# bucket and the last, a few rows per active runtime), which is what summing every
# runtime's rows gives. The cost follows the buckets of the window, not the runtimes.
FLEET_POINTS = f"""
SELECT {_FLEET_POINT}
  FROM (SELECT {_ROW} FROM task_history_fleet WHERE at > {_SINCE}
        UNION ALL
        SELECT {_ROW} FROM task_history WHERE backend <> 0 AND at > {_SINCE}) AS rows
 GROUP BY at
 ORDER BY at
"""


def _covered_runtimes(since: str) -> str:
    """The runtimes that the patterns $2 cover with history since `since`: those with
    folded rows there (task_history_runtimes, one row a runtime: its last bucket), and
    those with rows not folded yet. Only their ids, which no answer shows unless they
    have a figure to show."""
    return f"""covered(id) AS (
    SELECT runtime_id FROM task_history_runtimes WHERE last_at >= {since} AND {_COVERED}
    UNION
    SELECT runtime_id FROM task_history WHERE backend <> 0 AND at >= {since} AND {_COVERED}
)"""


# The same for a token limited to patterns: the fleet rows hold every runtime, so the
# covered runtimes' own rows are summed, each runtime's window one range of the primary
# key (a LATERAL probe per runtime): the cost follows the covered runtimes and their
# rows, not the fleet's rows of the window. Listing the covered runtimes reads one small
# row per runtime with history. OFFSET 0 keeps each LATERAL a probe of its own: pulled
# up into a join, the planner may hash the covered runtimes against a walk of the whole
# table when they are a fair share of the runtimes.
COVERED_POINTS = f"""
WITH {_covered_runtimes(_SINCE)}
SELECT {_FLEET_POINT}
  FROM covered c
 CROSS JOIN LATERAL (
    SELECT {_ROW} FROM task_history h
     WHERE h.runtime_id = c.id AND (h.runtime_id, h.at) > (c.id, {_SINCE})
    OFFSET 0
 ) AS rows
 GROUP BY at
 ORDER BY at
"""

# The covered runtimes (NULL: every runtime) with the deepest queues: each one's last
# depth read, when it was read in the window, the 10 deepest (ties by runtime id), from
# task_history_runtimes (FILL_DEPTH keeps each runtime's last one there): one small row
# per runtime, walked deepest first by task_history_runtimes_depth_idx. A runtime the
# patterns do not cover is never read, so its name cannot leak.
TOP_BY_DEPTH = f"""
SELECT runtime_id, depth FROM task_history_runtimes
 WHERE depth > 0 AND depth_at > {_SINCE} AND {_COVERED}
 ORDER BY depth DESC, runtime_id
 LIMIT 10
"""

_TOP = """
 GROUP BY runtime_id
HAVING sum(failed) + sum(dead) > 0
 ORDER BY sum(failed) + sum(dead) DESC, runtime_id
 LIMIT 10"""
_FAILURES = "runtime_id, sum(failed)::bigint AS failed, sum(dead)::bigint AS dead"

# The runtimes with the most failures (failed and dead together) in the last hour, the
# 10 most, from the minute rows, for a token covering every runtime: the window's rows
# by time (task_history_at_idx).
TOP_BY_FAILURES = f"""
SELECT {_FAILURES}
  FROM task_history
 WHERE at > {_SINCE}
{_TOP}
"""

# The same for a token limited to patterns: each covered runtime's range of the
# primary key.
COVERED_FAILURES = f"""
WITH {_covered_runtimes(_SINCE)}
SELECT {_FAILURES}
  FROM covered c
 CROSS JOIN LATERAL (
    SELECT runtime_id, failed, dead FROM task_history h
     WHERE h.runtime_id = c.id AND (h.runtime_id, h.at) > (c.id, {_SINCE})
    OFFSET 0
 ) AS rows
{_TOP}
"""

# Over a day or a week, in whole hours from the one the window begins in: the hourly
# failures (task_history_failures: rows only for a runtime's hours with failures, by
# task_history_failures_hour_idx), with the per-backend rows not folded yet added in.
# For a token covering every runtime.
HOURLY_FAILURES = f"""
SELECT {_FAILURES}
  FROM (SELECT runtime_id, failed, dead FROM task_history_failures
         WHERE hour >= {_FIRST_HOUR}
        UNION ALL
        SELECT runtime_id, failed, dead FROM task_history
         WHERE backend <> 0 AND at >= {_FIRST_HOUR}) AS rows
{_TOP}
"""

# The same for a token limited to patterns: each covered runtime's hours, a range of
# task_history_failures' primary key, with its rows not folded yet.
COVERED_HOURLY_FAILURES = f"""
WITH {_covered_runtimes(_FIRST_HOUR)}
SELECT {_FAILURES}
  FROM covered c
 CROSS JOIN LATERAL (
    SELECT runtime_id, failed, dead FROM task_history_failures f
     WHERE f.runtime_id = c.id AND (f.runtime_id, f.hour) >= (c.id, {_FIRST_HOUR})
    UNION ALL
    SELECT runtime_id, failed, dead FROM task_history h
     WHERE h.runtime_id = c.id AND h.backend <> 0 AND h.at >= {_FIRST_HOUR}
    OFFSET 0
 ) AS rows
{_TOP}
"""

# The depth series of a page of runtimes ($1) over the last $2 seconds, for the
# listing's sparklines: one statement for the page, a range of the primary key each.
SPARKLINES = """
SELECT runtime_id, at, depth FROM task_history
 WHERE runtime_id = ANY ($1::text[]) AND at > now() - make_interval(secs => $2)
   AND backend = 0 AND depth IS NOT NULL
 ORDER BY runtime_id, at
"""
