"""The pieces of SQL that the statements of several modules are built from: a task's
effective status, the lease that holds it, its columns as every task statement returns
them, the complete and fail transitions that the single and batch lease operations
share (leases.py, acks.py), and the cancel and retry transitions that one task's and a
runtime's bulk operations share (tasks.py, bulk.py). Fragments only: no store module
runs anything from here.
"""

from __future__ import annotations

# A queued task past its expires_at is expired already: the janitor only writes it
# down later. Every read and filter goes through this, so none shows it as queued.
# A `scheduled` task (stored so while its run_at was in the future; design section 4)
# is `queued` to the API: the stored status only keeps it out of the claim index.
EFFECTIVE_STATUS = (
    "CASE WHEN status IN ('queued', 'scheduled') AND expires_at <= now() THEN 'expired'"
    " WHEN status = 'scheduled' THEN 'queued' ELSE status END"
)

# The lease that holds a task now: its lease_id while it is claimed, else none (a
# finished task keeps the lease_id that finished it, for replays). One expression, not
# `status = 'claimed' AND lease_id = ...`: a bare condition on status lets the planner
# walk every claimed task (tasks_lease_idx) instead of probing the primary key.
HOLDING_LEASE = "CASE WHEN tasks.status = 'claimed' THEN tasks.lease_id END"

TASK_COLUMNS = f"""
    id, runtime_id, {EFFECTIVE_STATUS} AS status, priority, payload, attempts, max_attempts,
    run_at, expires_at, created_at, updated_at, lease_id, lease_expires_at, worker_id,
    cancel_requested, result, last_error, schedule, scheduled_for, trace_parent, trace_state
"""

# The complete transition's SET list, shared by leases.COMPLETE, leases.COMPLETE_GROUP
# and acks.BATCH_COMPLETE; {result} is the result's JSON. A cancel requested while the
# task was held wins over the holder's report.
COMPLETE_TRANSITION = """status = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'completed' END,
       result = {result}, lease_expires_at = NULL, finished_at = clock_timestamp(),
       updated_at = clock_timestamp()"""

# The fail transition's SET list, shared by leases.FAIL and acks.BATCH_FAIL so that a
# change to it carries to both. {retry}: whether the holder asks for a retry (boolean);
# {retry_after}: seconds before it, NULL for the backoff. Its column names are the
# task's, unqualified: a statement using it names its other columns apart.
# Backoff: retry_after_seconds when given, else min(2^attempts, 3600) s with
# jitter in [50%, 100%]. `dead` once attempts reached max_attempts or retry=false.
# A retry with any backoff is not due yet: `scheduled` (the default backoff is at
# least a second); only retry_after_seconds = 0 queues it for at once.
FAIL_TRANSITION = """
       status = CASE
           WHEN cancel_requested THEN 'cancelled'
           WHEN {retry} AND attempts < max_attempts
           THEN CASE WHEN COALESCE({retry_after}::float8, 1) > 0 THEN 'scheduled' ELSE 'queued' END
           ELSE 'dead' END,
       run_at = CASE
           WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
           THEN clock_timestamp() + make_interval(secs => COALESCE(
                    {retry_after}::float8,
                    least(power(2, attempts), 3600) * (0.5 + random() * 0.5)))
           ELSE run_at END,
       lease_id = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                       THEN NULL ELSE lease_id END,
       worker_id = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                        THEN NULL ELSE worker_id END,
       lease_expires_at = NULL,
       finished_at = CASE WHEN {retry} AND attempts < max_attempts AND NOT cancel_requested
                          THEN NULL ELSE clock_timestamp() END,"""


# A cancel (tasks.CANCEL, bulk.CANCEL_QUEUED, and schedules.CANCEL_PREVIOUS for an
# overlap policy): a queued
# (or scheduled) task ends cancelled at once; a claimed one is flagged, and ends
# `cancelled` when its holder next reports. For the rows whose effective status is
# queued or claimed.
CANCEL_TRANSITION = """status = CASE WHEN status IN ('queued', 'scheduled') THEN 'cancelled'
                     ELSE status END,
       cancel_requested = (status = 'claimed'),
       finished_at = CASE WHEN status IN ('queued', 'scheduled') THEN clock_timestamp()
                          ELSE finished_at END,
       updated_at = clock_timestamp()"""

# A retry (tasks.RETRY, bulk.RETRY_MATCHING) of a dead, expired or cancelled task: queued
# again at once, its attempts reset. An expiry already past is dropped, or the task
# would expire again before any claim. last_error stays: it says why the task had
# ended until a new attempt reports. Its column names are the task's, unqualified.
RETRY_TRANSITION = """status = 'queued', attempts = 0, run_at = clock_timestamp(),
       expires_at = CASE WHEN expires_at <= clock_timestamp() THEN NULL ELSE expires_at END,
       lease_id = NULL, lease_expires_at = NULL, worker_id = NULL,
       cancel_requested = false, finished_at = NULL, result = NULL,
       updated_at = clock_timestamp()"""
