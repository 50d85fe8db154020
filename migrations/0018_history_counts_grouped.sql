-- The history trigger on updates counts each statement's moved tasks once per kind of
-- move, not 25 times per task (docs/guides/history.md).
--
-- Migration 0015's task_history_moved evaluated 25 filtered counts (seven kinds of
-- move and fourteen wait buckets, each a FILTER) over every task a statement moved. A
-- claim of 63 tasks spent 0.77 ms of its 2.3 to 2.7 ms in that trigger, most of it in
-- those counts: the same statement alone, on a scratch database, 2026-11-29. Now the
-- moved tasks are grouped first by what the counts read (runtime, old and new status,
-- given back, wait bucket), a handful of groups for any statement, and the filtered
-- sums run over the groups: the aggregate took 0.14 ms for those 63 tasks, against
-- 0.39. The counts are the same: each sum is over the same tasks as its count was,
-- and 0 where none moved that way, as count() gave.
--
-- Replaces the function only: the trigger (migration 0015) calls it by name. Runs in
-- one transaction; a statement on tasks runs entirely under one version or the other.

CREATE OR REPLACE FUNCTION task_history_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_history AS h (runtime_id, at, backend, enqueued, claimed, completed,
                                   failed, dead, expired, cancelled, waits)
    SELECT runtime_id, history_bucket(), pg_backend_pid(),
           coalesce(sum(moves) FILTER (WHERE new_status IN ('queued', 'scheduled')
                                AND old_status IN ('completed', 'dead', 'expired', 'cancelled')),
                    0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status = 'claimed'), 0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status = 'completed'), 0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status IN ('queued', 'scheduled')
                                AND old_status = 'claimed' AND NOT given_back),
                    0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status = 'dead'), 0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status = 'expired'), 0)::bigint,
           coalesce(sum(moves) FILTER (WHERE new_status = 'cancelled'), 0)::bigint,
           ARRAY[coalesce(sum(moves) FILTER (WHERE w = 1), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 2), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 3), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 4), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 5), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 6), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 7), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 8), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 9), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 10), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 11), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 12), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 13), 0)::bigint,
                 coalesce(sum(moves) FILTER (WHERE w = 14), 0)::bigint]
      FROM (
        SELECT n.runtime_id, o.status AS old_status, n.status AS new_status,
               n.attempts < o.attempts AS given_back,
               -- The wait bucket of a first claim, else null.
               CASE WHEN n.status = 'claimed' AND n.attempts = 1
                    THEN history_wait_bucket(extract(epoch FROM
                             n.updated_at - greatest(n.created_at, n.run_at))::float8)
               END AS w,
               count(*) AS moves
          FROM old_rows o JOIN new_rows n ON n.id = o.id
         -- A promotion (scheduled -> queued) changes the status and counts nothing.
         WHERE n.status <> o.status
           AND NOT (n.status IN ('queued', 'scheduled') AND o.status IN ('queued', 'scheduled'))
         GROUP BY 1, 2, 3, 4, 5
      ) AS moved
     GROUP BY runtime_id
     -- Key order, as every writer of task_history.
     ORDER BY runtime_id
    ON CONFLICT (runtime_id, at, backend) DO UPDATE SET
        enqueued = h.enqueued + EXCLUDED.enqueued,
        claimed = h.claimed + EXCLUDED.claimed,
        completed = h.completed + EXCLUDED.completed,
        failed = h.failed + EXCLUDED.failed,
        dead = h.dead + EXCLUDED.dead,
        expired = h.expired + EXCLUDED.expired,
        cancelled = h.cancelled + EXCLUDED.cancelled,
        waits = history_waits_add(h.waits, EXCLUDED.waits);
    RETURN NULL;
END
$$;
