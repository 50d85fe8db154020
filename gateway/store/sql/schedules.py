"""The statements of store/schedules.py (ScheduleStatements): a runtime's schedules
read, written and deleted, the tick pass's batch of due schedules, the one statement
that records ticks and makes their tasks, and the retention of the tick record.

Every statement that decides ticks runs in a transaction that holds the schedule's row
(FOR UPDATE): a PUT, DELETE or pause of it waits for that transaction, so that once it
has answered no tick is decided from the definition it replaced.
"""

from __future__ import annotations

from .fragments import CANCEL_TRANSITION, EFFECTIVE_STATUS

SCHEDULE_COLUMNS = """
    s.id, s.runtime_id, s.name, s.version, s.cron, s.every_seconds, s.timezone, s.payload,
    s.priority, s.ttl_seconds, s.max_attempts, s.overlap, s.catch_up_seconds,
    s.jitter_seconds, s.paused, s.note, s.next_tick_at, s.last_tick_at, s.last_task_id,
    s.created_at, s.updated_at"""

# The schedule's last task's status as the API shows it (null once retention deleted
# the task), read through the task's primary key.
_LAST_TASK_STATUS = f"{EFFECTIVE_STATUS} AS last_task_status"
_FROM = "schedules s LEFT JOIN tasks t ON t.id = s.last_task_id"
# Its earliest tick decided ahead of its time (overlap allow), still to come: the
# next run the API shows, before next_tick_at. One probe of the ticks' primary key.
_DECIDED_AHEAD = """(SELECT min(k.tick_at) FROM schedule_ticks k
        WHERE k.schedule_id = s.id AND k.tick_at > clock_timestamp()) AS decided_ahead"""
_WITH_LAST_TASK = f"{SCHEDULE_COLUMNS}, {_LAST_TASK_STATUS}, {_DECIDED_AHEAD}\n  FROM {_FROM}"

GET_SCHEDULE = f"SELECT {_WITH_LAST_TASK} WHERE s.runtime_id = $1 AND s.name = $2"

# A page of a runtime's schedules in name order, after the name $2 ('' for the first).
LIST_SCHEDULES = f"""
SELECT {_WITH_LAST_TASK}
 WHERE s.runtime_id = $1 AND s.name > $2
 ORDER BY s.name
 LIMIT $3
"""

# Holds the schedule's row until the commit: the first statement of every change,
# manual tick and DELETE (inside its transaction). Only that: a statement that waited
# for the row reads the tables as they were when it began, before the commit it waited
# for (Postgres re-reads only the locked row), and its clock_timestamp() too. So after
# a pass, a trigger read the task the pass had just made as missing (finished: the
# overlap policy enqueued beside it), and after a backfill a PUT read the clock of
# before its wait (a tick due meanwhile looked still to come, and went unrecorded).
LOCK_SCHEDULE_ID = "SELECT id FROM schedules WHERE runtime_id = $1 AND name = $2 FOR UPDATE"

# The schedule as it is once held (the statement after LOCK_SCHEDULE_ID, in its
# transaction), and the database's clock, which every tick is computed against (one
# clock for every instance). FOR UPDATE too, so that it holds the row by itself.
LOCK_SCHEDULE = f"""
SELECT {SCHEDULE_COLUMNS}, {_LAST_TASK_STATUS}, {_DECIDED_AHEAD}, clock_timestamp() AS now
  FROM {_FROM}
 WHERE s.runtime_id = $1 AND s.name = $2
   FOR UPDATE OF s
"""

NOW = "SELECT clock_timestamp()"

_DEFINITION = """cron, every_seconds, timezone, payload, priority, ttl_seconds, max_attempts,
    overlap, catch_up_seconds, jitter_seconds, paused, note, next_tick_at"""

# A new schedule. A name taken meanwhile by a concurrent PUT inserts nothing (the
# caller then locks that row and replaces it).
INSERT_SCHEDULE = f"""
INSERT INTO schedules AS s (runtime_id, name, {_DEFINITION})
VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (runtime_id, name) DO NOTHING
RETURNING {SCHEDULE_COLUMNS}, NULL::text AS last_task_status, NULL::timestamptz AS decided_ahead
"""

# A locked schedule ($1: its id) written anew; its version grows by $16 (1 when the
# definition changed, 0 for a pause or a note), which makes every tick computed from
# the old one fail to join it (RECORD_TICKS).
UPDATE_SCHEDULE = f"""
WITH s AS (
    UPDATE schedules SET ({_DEFINITION}) =
        ($3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11, $12, $13, $14, $15),
        version = version + $16, updated_at = clock_timestamp()
     WHERE id = $1 AND runtime_id = $2
    RETURNING *
)
SELECT {SCHEDULE_COLUMNS}, {_LAST_TASK_STATUS}, {_DECIDED_AHEAD}
  FROM s LEFT JOIN tasks t ON t.id = s.last_task_id
"""

# A schedule's ticks decided ahead of their time (overlap allow) whose time has not
# come, withdrawn with their tasks, as if never decided: a PUT that changes the
# definition, a pause and a DELETE run it in their transaction, so that no task of the
# old definition runs after they answer, and the new one decides those ticks afresh.
# Only a task still waiting for its time goes (a claim that took it first keeps it, and
# so does its tick). Answers the earliest tick withdrawn (or null) and the tasks
# deleted, whose result waits the caller wakes after the commit.
WITHDRAW_AHEAD = """
WITH withdrawn AS (
    DELETE FROM tasks t USING schedule_ticks k
     WHERE k.schedule_id = $1 AND k.tick_at > clock_timestamp() AND t.id = k.task_id
       AND t.status = 'scheduled' AND t.run_at > clock_timestamp()
    RETURNING k.tick_at, t.id
), ticks AS (
    DELETE FROM schedule_ticks k USING withdrawn w
     WHERE k.schedule_id = $1 AND k.tick_at = w.tick_at
    RETURNING k.tick_at
)
SELECT (SELECT min(tick_at) FROM ticks) AS earliest,
       (SELECT coalesce(array_agg(id), '{}') FROM withdrawn) AS tasks
"""

# After WITHDRAW_AHEAD took ticks away ($1: the schedule): its last tick and last task
# are those of the latest tick it still has (null when none is left), not a withdrawn
# one. The overlap policy reads the last task's status; a withdrawn task is deleted,
# so it would read as finished, and a new skip, buffer_one or cancel_previous would
# enqueue beside the previous task still queued or running.
RESTORE_LAST_TICK = """
UPDATE schedules s
   SET last_tick_at = (SELECT max(k.tick_at) FROM schedule_ticks k WHERE k.schedule_id = s.id),
       last_task_id = (SELECT k.task_id FROM schedule_ticks k
                        WHERE k.schedule_id = s.id AND k.task_id IS NOT NULL
                        ORDER BY k.tick_at DESC LIMIT 1)
 WHERE s.id = $1
"""

DELETE_SCHEDULE = "DELETE FROM schedules WHERE id = $1"

# The tick pass's batch: up to $1 unpaused schedules whose next tick has come, or
# comes within $2 seconds for those with overlap allow (their ticks are decided ahead),
# oldest first (schedules_due_idx), each with its last task's status for the overlap
# policy, locked until the pass's commit. SKIP LOCKED: a schedule another transaction
# holds (a PUT, a manual trigger, another instance's pass) is left to the next pass.
# statement_timestamp(), not clock_timestamp(): a stable bound is an index condition,
# and the scan reads the due rows only.
DUE_SCHEDULES = f"""
SELECT {SCHEDULE_COLUMNS}, {_LAST_TASK_STATUS}, clock_timestamp() AS now
  FROM {_FROM}
 WHERE NOT s.paused
   AND s.next_tick_at <= statement_timestamp() + make_interval(secs => $2)
   AND (s.overlap = 'allow' OR s.next_tick_at <= statement_timestamp())
 ORDER BY s.next_tick_at
 LIMIT $1
   FOR UPDATE OF s SKIP LOCKED
"""

# Seconds from now until the earliest unpaused schedule's next tick (negative: due
# already; null: no schedule), by the database's clock: how long the pass may rest.
# One probe of schedules_due_idx.
NEXT_DUE_IN = """
SELECT extract(epoch FROM min(next_tick_at) - clock_timestamp())::float8
  FROM schedules
 WHERE NOT paused
"""

# How a tick already decided answers a second decision of it: nothing, except that a
# backfill ($8 true) turns a skipped tick into an enqueued one. Without this clause
# and the key it names, a second instance or a second backfill would make a second
# task for the same tick (tests/integration/test_schedule_ticks.py shows it does).
TICK_KEY = """ON CONFLICT (schedule_id, tick_at) DO UPDATE
    SET outcome = EXCLUDED.outcome, task_id = EXCLUDED.task_id, source = EXCLUDED.source,
        version = EXCLUDED.version, recorded_at = clock_timestamp()
  WHERE $8 AND k.outcome <> 'enqueued' AND EXCLUDED.outcome = 'enqueued'"""


# Records ticks and makes the tasks of the enqueued ones, in one statement: a tick's
# row and its task commit together or not at all. $1..$6 are the ticks' columns
# (schedule, the definition's version they were computed from, tick time, outcome, the
# new task's id, its run_at); a tick whose schedule is no longer at that version joins
# nothing and is dropped. A tick the key finds decided already comes back not at all,
# and makes no task. Rows are written in key order, so that two writers wait for each
# other instead of deadlocking. Answers each tick decided now, with the runtime of
# its task if it made one, and the clock once the tasks are in.
def record_ticks(tick_key: str) -> str:
    """RECORD_TICKS with `tick_key` as its conflict clause (a test drops it)."""
    return f"""
WITH plan AS (
    SELECT i.*, s.runtime_id, s.name, s.payload, s.priority, s.max_attempts, s.ttl_seconds
      FROM unnest($1::bigint[], $2::int[], $3::timestamptz[], $4::text[], $5::uuid[],
                  $6::timestamptz[]) AS i(schedule_id, version, tick_at, outcome, task_id,
                                          run_at)
      JOIN schedules s ON s.id = i.schedule_id AND s.version = i.version
), decided AS (
    INSERT INTO schedule_ticks AS k (schedule_id, tick_at, outcome, task_id, version, source)
    SELECT schedule_id, tick_at, outcome, task_id, version, $7 FROM plan
     ORDER BY schedule_id, tick_at
    {tick_key}
    RETURNING k.schedule_id, k.tick_at, k.outcome, k.task_id
), made AS (
    INSERT INTO tasks (id, runtime_id, status, priority, payload, max_attempts, run_at,
                       expires_at, schedule, scheduled_for)
    SELECT d.task_id, p.runtime_id,
           CASE WHEN p.run_at > clock_timestamp() THEN 'scheduled' ELSE 'queued' END,
           p.priority, p.payload, p.max_attempts, p.run_at,
           greatest(p.run_at, clock_timestamp()) + make_interval(secs => p.ttl_seconds),
           p.name, d.tick_at
      FROM decided d JOIN plan p ON (p.schedule_id, p.tick_at) = (d.schedule_id, d.tick_at)
     WHERE d.outcome = 'enqueued'
     ORDER BY d.schedule_id, d.tick_at
    RETURNING id, runtime_id
)
SELECT d.schedule_id, d.tick_at, d.outcome, d.task_id, m.runtime_id AS made_in,
       clock_timestamp() AS recorded_at
  FROM decided d LEFT JOIN made m ON m.id = d.task_id
"""


RECORD_TICKS = record_ticks(TICK_KEY)

# After RECORD_TICKS, in its transaction: each schedule's next tick ($2, null: keep
# it), its last tick decided ($3) and its last task made ($4, null: keep it).
ADVANCE_SCHEDULES = """
UPDATE schedules s
   SET next_tick_at = COALESCE(u.next_tick_at, s.next_tick_at),
       last_tick_at = greatest(s.last_tick_at, u.last_tick_at),
       last_task_id = COALESCE(u.last_task_id, s.last_task_id)
  FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::uuid[])
       AS u(id, next_tick_at, last_tick_at, last_task_id)
 WHERE s.id = u.id
"""

# overlap cancel_previous: the tasks a schedule's new ones replace, as a cancel does it
# (tasks.CANCEL): a queued one at once, a claimed one flagged for its holder.
CANCEL_PREVIOUS = f"""
UPDATE tasks
   SET {CANCEL_TRANSITION}
 WHERE id = ANY($1::uuid[]) AND {EFFECTIVE_STATUS} IN ('queued', 'claimed')
RETURNING id, status
"""

# Retention of the tick record (GATEWAY_SCHEDULE_TICKS_DAYS), oldest first, in batches
# of $2 (schedule_ticks_age_idx).
PURGE_TICKS = """
DELETE FROM schedule_ticks WHERE (schedule_id, tick_at) IN (
    SELECT schedule_id, tick_at FROM schedule_ticks
     WHERE tick_at < clock_timestamp() - make_interval(days => $1)
     ORDER BY tick_at
     LIMIT $2
)
"""

# The ticks of one schedule in a range, for tests and the fault checker.
LIST_TICKS = """
SELECT tick_at, outcome, task_id, source FROM schedule_ticks
 WHERE schedule_id = $1 AND tick_at BETWEEN $2 AND $3
 ORDER BY tick_at
"""
