-- The history's rollups (docs/guides/history.md, "Every runtime at once"): what
-- GET /v1/history reads instead of every runtime's rows of its window.
--
--   task_history_fleet     one row per bucket, summed over every runtime: the fleet's
--                          points for a token that covers every runtime;
--   task_history_runtimes  one row per runtime with folded history: its last bucket,
--                          and its last depth read (the top runtimes by depth), and
--                          the list a token limited to patterns picks its runtimes from;
--   task_history_failures  one row per runtime and hour (UTC) in which it had failed or
--                          dead tasks, none for the others: the top runtimes by
--                          failures over a day or a week.
--
-- They are written by the janitor's leader only, in the statements that write the
-- folded rows of task_history (store/sql/history.py: FOLD adds what it moves, FILL_DEPTH
-- the depths it reads), so each count reaches them exactly once, in the transaction
-- that moves it. The triggers on tasks write nothing more.
--
-- Runs in one transaction and reads the folded rows of task_history once, to start the
-- rollups from the history already kept: under three minutes for 10 million rows on a
-- shared 2-core machine (docs/capacity.md). It only reads task_history, and the tables
-- are new, so no statement on tasks waits for it meanwhile. Upgrade every instance together:
-- a janitor of an earlier version that folds after this migration leaves its folds out
-- of the rollups (the runtimes' own histories keep them).

-- The fleet's point of each bucket, as FLEET_POINTS summed the folded rows of every
-- runtime: the counts and the claim waits added, `depth` the sum of the depths read
-- in that bucket (null until one is read), `oldest_queued_age_seconds` the greatest.
CREATE TABLE task_history_fleet (
    at                        timestamptz PRIMARY KEY,
    enqueued                  bigint      NOT NULL DEFAULT 0,
    claimed                   bigint      NOT NULL DEFAULT 0,
    completed                 bigint      NOT NULL DEFAULT 0,
    failed                    bigint      NOT NULL DEFAULT 0,
    dead                      bigint      NOT NULL DEFAULT 0,
    expired                   bigint      NOT NULL DEFAULT 0,
    cancelled                 bigint      NOT NULL DEFAULT 0,
    waits                     bigint[]    NOT NULL,
    depth                     bigint,
    oldest_queued_age_seconds float8
);

-- `last_at`: the runtime's last bucket folded (retention deletes the runtime once it
-- is past GATEWAY_HISTORY_DAYS). `depth_at`, `depth`: its last depth read, and the
-- bucket it was read for (null until one is read).
CREATE TABLE task_history_runtimes (
    runtime_id text        PRIMARY KEY,
    last_at    timestamptz NOT NULL,
    depth_at   timestamptz,
    depth      bigint
);
-- Retention walks the runtimes by their last bucket.
CREATE INDEX task_history_runtimes_last_at_idx ON task_history_runtimes (last_at);
-- The deepest runtimes first, for the top list: the read stops after ten in the window.
CREATE INDEX task_history_runtimes_depth_idx ON task_history_runtimes (depth DESC, runtime_id)
    WHERE depth > 0;

-- `hour`: the start of the hour (UTC) of the buckets counted (history_hour). Only hours
-- with a failed or dead task have a row.
CREATE TABLE task_history_failures (
    runtime_id text        NOT NULL,
    hour       timestamptz NOT NULL,
    failed     bigint      NOT NULL,
    dead       bigint      NOT NULL,
    PRIMARY KEY (runtime_id, hour)
);
-- The window's hours of every runtime (a token covering every runtime), and retention.
CREATE INDEX task_history_failures_hour_idx ON task_history_failures (hour);

-- The start of the UTC hour that holds `at`: date_trunc('hour', at) would follow the
-- session's time zone, whose hours need not start on the hour of UTC.
CREATE FUNCTION history_hour(at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(floor(extract(epoch FROM at) / 3600) * 3600)
$$;

INSERT INTO task_history_fleet (at, enqueued, claimed, completed, failed, dead, expired,
                                cancelled, waits, depth, oldest_queued_age_seconds)
SELECT at, sum(enqueued), sum(claimed), sum(completed), sum(failed), sum(dead),
       sum(expired), sum(cancelled),
       ARRAY[sum(waits[1]), sum(waits[2]), sum(waits[3]), sum(waits[4]), sum(waits[5]),
             sum(waits[6]), sum(waits[7]), sum(waits[8]), sum(waits[9]), sum(waits[10]),
             sum(waits[11]), sum(waits[12]), sum(waits[13]), sum(waits[14])]::bigint[],
       sum(depth), max(oldest_queued_age_seconds)
  FROM task_history
 WHERE backend = 0
 GROUP BY at;

INSERT INTO task_history_runtimes (runtime_id, last_at, depth_at, depth)
SELECT last.runtime_id, last.at, read.at, read.depth
  FROM (SELECT runtime_id, max(at) AS at FROM task_history WHERE backend = 0
         GROUP BY runtime_id) AS last
  LEFT JOIN (SELECT DISTINCT ON (runtime_id) runtime_id, at, depth FROM task_history
              WHERE backend = 0 AND depth IS NOT NULL
              ORDER BY runtime_id, at DESC) AS read USING (runtime_id);

INSERT INTO task_history_failures (runtime_id, hour, failed, dead)
SELECT runtime_id, history_hour(at), sum(failed), sum(dead)
  FROM task_history
 WHERE backend = 0 AND failed + dead > 0
 GROUP BY runtime_id, history_hour(at);
