"""The statements of store/runtimes.py (RuntimeListStatements): the runtimes listing
(GET /v1/runtimes, the console), a page of runtime ids and their live counts.
"""

from __future__ import annotations

# A runtime is listed while it holds tasks (live ones, or finished ones retention has
# not removed yet) or has controls set. Both statements read only the partial indexes
# of live rows, the finished-task counters and the controls, so their cost never
# follows the finished history. `scheduled` (a not-yet-due task, which the API reports
# as queued) has its own partial index (runtime_id, run_at); each status is probed on
# its own because a partial index serves `status = 'x'`, not `IN (...)`.

# Up to $2 runtime ids after $1, in id order. Queued and scheduled: a loose index scan,
# one probe per runtime (as janitor.CLAIMABLE_RUNTIMES), at most $2 probes. Claimed: the
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

# A runtime's queued tasks (queued and scheduled, not expired) and its oldest due one's
# created_at, as `q` and `s` (add q.n and s.n; the least of q.oldest and s.oldest), for
# the runtime in r.runtime_id: one walk of each status's partial index. Shared by
# RUNTIMES_SUMMARY and the history's depth (history.FILL_DEPTH), so that the listing and
# the history count a queue alike.
QUEUED_LATERALS = """ CROSS JOIN LATERAL (
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
         FROM tasks t WHERE t.runtime_id = r.runtime_id AND t.status = 'scheduled') s"""

# Counts for a page of runtimes ($1): queued (queued and scheduled, not expired),
# claimed, the age of the oldest due queued task (as tasks.OLDEST_QUEUED_AGE), and dead
# from task_counts (as tasks.STATS_COUNTS: its per-backend rows of the runtime, never the
# history). Claimed is grouped over the leases' partial index alone: filtering it by
# runtime would let the planner walk a runtime's whole history through (runtime_id,
# created_at, id).
RUNTIMES_SUMMARY = f"""
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
{QUEUED_LATERALS}
 CROSS JOIN LATERAL (
       SELECT COALESCE(sum(k.n), 0)::bigint AS n
         FROM task_counts k WHERE k.runtime_id = r.runtime_id AND k.status = 'dead') d
  LEFT JOIN claimed c ON c.runtime_id = r.runtime_id
 ORDER BY r.runtime_id
"""
