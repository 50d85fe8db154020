-- Autovacuum settings of the task table's own, for a queue's churn.
--
-- Every task leaves dead row versions behind: its queued one when claimed, its claimed
-- one when completed, the finished one when retention deletes it. Until a VACUUM removes
-- them (and their index entries), a claim on that runtime walks them, and its stats
-- read the table's pages where the index alone would do. By default autovacuum waits
-- for a fifth of the table to be dead (2 million rows of 10 million); here it starts
-- after 1% (100,000 rows of 10 million), and it is not slowed down by the cost-based
-- delay, so that one pass over a large table ends in seconds, not minutes. ANALYZE
-- follows the same 1%: after a burst the planner's counts of each status are wrong too.
-- The gateway's janitor also runs a VACUUM itself after a burst
-- (GATEWAY_JANITOR_VACUUM_DEAD_ROWS), without waiting for autovacuum's next round;
-- docs/capacity.md, "After a burst", has the measurements.
--
-- Server-wide autovacuum settings (autovacuum_naptime, the workers) stay the operator's.
-- These are storage parameters: ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE lock,
-- which lets reads and writes go on, rewrites nothing and returns at once, but it waits
-- for a VACUUM of the table in progress. If one holds the table for more than 5 s, the
-- migration fails instead (nothing applied) and can be run again.
SET LOCAL lock_timeout = '5s';

ALTER TABLE tasks SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
