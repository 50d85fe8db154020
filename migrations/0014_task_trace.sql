-- A task's trace context (W3C Trace Context): the `traceparent` and `tracestate` its
-- producer sent, stored with the task like its payload and handed to whoever claims
-- or reads it, so that one trace runs from the producer through the queue to the
-- daemon's command. Null for a task enqueued without one.
--
-- Adding a nullable column with no default rewrites nothing: the lock it takes
-- (ACCESS EXCLUSIVE) is held for a moment, but it waits behind any long transaction on
-- the table, and everything else then waits behind it. If the table stays held for
-- more than 5 s, the migration fails instead (nothing applied) and can be run again.
SET LOCAL lock_timeout = '5s';
ALTER TABLE tasks ADD COLUMN trace_parent text, ADD COLUMN trace_state text;
