-- A stored status `scheduled` for tasks whose run_at was in the future when written
-- (a delay, an explicit run_at, a retry backoff), kept out of the claim index: a claim
-- no longer walks delayed rows of a higher priority to reach the due ones. The API
-- shows them as `queued`; the claim also takes scheduled rows that have come due, and
-- the janitor moves those to `queued` in batches.
--
-- Live tables: runs in one transaction. The two index builds each read the whole
-- table while writes to tasks wait (reads go on); the constraint change then locks the
-- table until the commit, while the delayed rows move. Fine on a small table or in a
-- quiet minute; on a large busy table, build the indexes by hand first with
-- CREATE INDEX CONCURRENTLY (same names and definitions): IF NOT EXISTS then skips the
-- builds, and only the short part runs under the lock. The new CHECK is NOT VALID, so
-- it does not scan the table: every existing row met the narrower old check.

-- Scheduled tasks of a runtime by due time: the claim takes due ones from it, the
-- verdict's TTL comes from its earliest run_at (I4), and the janitor finds due ones.
CREATE INDEX IF NOT EXISTS tasks_scheduled_idx ON tasks (runtime_id, run_at)
    WHERE status = 'scheduled';

-- TTL expiry covers scheduled tasks too: a retry backoff can push run_at past expires_at.
CREATE INDEX IF NOT EXISTS tasks_waiting_expiry_idx ON tasks (expires_at)
    WHERE status IN ('queued', 'scheduled') AND expires_at IS NOT NULL;

ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('queued', 'scheduled', 'claimed', 'completed', 'dead', 'expired',
                      'cancelled')) NOT VALID;

UPDATE tasks SET status = 'scheduled' WHERE status = 'queued' AND run_at > now();

-- Replaced by tasks_waiting_expiry_idx, which covers queued rows as well.
DROP INDEX IF EXISTS tasks_expiry_idx;

-- Served the verdict's due time, which tasks_scheduled_idx serves now; queued rows are
-- due when written, so it would only cost every enqueue and claim a write.
DROP INDEX IF EXISTS tasks_due_idx;
