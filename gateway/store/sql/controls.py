"""The statements of store/controls.py (ControlStatements): runtime controls
(docs/design.md 5.2) read and stored, and the steps of a limited runtime's claim, around
the claim itself (leases.CLAIM): its bucket's refill, its leases in flight, its spend.
"""

from __future__ import annotations

CONTROLS_COLUMNS = (
    "runtime_id, paused, max_in_flight, claims_per_second, updated_at, paused_reason, "
    "paused_at, paused_until"
)

GET_CONTROLS = f"SELECT {CONTROLS_COLUMNS} FROM runtime_controls WHERE runtime_id = $1"

# Every runtime with a row: the per-process copy is reloaded from this on a timer.
# Small: a row exists only for a runtime someone paused or limited.
ALL_CONTROLS = f"SELECT {CONTROLS_COLUMNS} FROM runtime_controls"

# $2..$4 are the new values; $5..$7 say which of them the request sets (a PATCH may
# leave a field as it is). A new or changed claims_per_second starts with a full bucket.
# A pause ($5 and $2 true) stores its reason $8 and end $9 (or nulls); paused_at keeps
# the time of a pause still in force, so a second pause changes its reason and end but
# not since when the runtime is paused. A resume clears all three.
SET_CONTROLS = f"""
INSERT INTO runtime_controls AS c (runtime_id, paused, max_in_flight, claims_per_second,
                                   tokens, paused_reason, paused_at, paused_until)
VALUES ($1, COALESCE(CASE WHEN $5 THEN $2::boolean END, false),
        CASE WHEN $6 THEN $3::integer END, CASE WHEN $7 THEN $4::float8 END,
        greatest(COALESCE(CASE WHEN $7 THEN $4::float8 END, 0), 1),
        CASE WHEN $5 AND $2::boolean THEN $8::text END,
        CASE WHEN $5 AND $2::boolean THEN clock_timestamp() END,
        CASE WHEN $5 AND $2::boolean THEN $9::timestamptz END)
ON CONFLICT (runtime_id) DO UPDATE SET
    paused = CASE WHEN $5 THEN $2::boolean ELSE c.paused END,
    max_in_flight = CASE WHEN $6 THEN $3::integer ELSE c.max_in_flight END,
    claims_per_second = CASE WHEN $7 THEN $4::float8 ELSE c.claims_per_second END,
    tokens = CASE WHEN $7 AND $4::float8 IS DISTINCT FROM c.claims_per_second
                  THEN greatest(COALESCE($4::float8, 0), 1) ELSE c.tokens END,
    refilled_at = CASE WHEN $7 AND $4::float8 IS DISTINCT FROM c.claims_per_second
                       THEN clock_timestamp() ELSE c.refilled_at END,
    paused_reason = CASE WHEN NOT $5 THEN c.paused_reason
                         WHEN $2::boolean THEN $8::text END,
    paused_at = CASE WHEN NOT $5 THEN c.paused_at
                     WHEN NOT $2::boolean THEN NULL
                     WHEN c.paused AND (c.paused_until IS NULL
                                        OR c.paused_until > clock_timestamp())
                     THEN COALESCE(c.paused_at, clock_timestamp())
                     ELSE clock_timestamp() END,
    paused_until = CASE WHEN NOT $5 THEN c.paused_until
                        WHEN $2::boolean THEN $9::timestamptz END,
    updated_at = clock_timestamp()
RETURNING {CONTROLS_COLUMNS}
"""

# The first statement of a limited runtime's claim (inside its transaction): locks the
# runtime's control row, which serialises the runtime's claims across every instance,
# and refills its bucket up to now. The burst is one second of claims (at least one).
# The SET expressions are evaluated once the lock is held (after a wait, on the row the
# claim before left), so the refill counts from that claim's refilled_at. A pause whose
# paused_until has passed reads as not paused.
CONTROLS_REFILL = """
UPDATE runtime_controls SET
    tokens = CASE WHEN claims_per_second IS NULL THEN tokens
                  ELSE least(greatest(claims_per_second, 1),
                             tokens + claims_per_second * greatest(
                                 extract(epoch FROM clock_timestamp() - refilled_at)::float8,
                                 0))
             END,
    refilled_at = clock_timestamp()
WHERE runtime_id = $1
RETURNING paused AND (paused_until IS NULL OR paused_until > clock_timestamp()) AS paused,
          max_in_flight, claims_per_second, tokens
"""

# The runtime's tasks leased now. A statement of its own, after CONTROLS_REFILL: its
# snapshot is taken once the lock is held, so it sees the leases of the claim that held
# the lock before (a subquery of CONTROLS_REFILL would use the snapshot from before the
# wait). An index-only scan of tasks_live_idx: its cost follows max_in_flight.
CONTROLS_IN_FLIGHT = """
SELECT count(*) AS n FROM tasks WHERE runtime_id = $1 AND status = 'claimed'
"""

# The bucket after a claim leased $2 tasks: one token each.
CONTROLS_SPEND = """
UPDATE runtime_controls SET tokens = tokens - $2::float8 WHERE runtime_id = $1
"""
