-- The task table and the indexes the claim path, leases and idempotency rely on.
CREATE TABLE tasks (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    runtime_id       text        NOT NULL,
    status           text        NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'claimed', 'completed', 'dead', 'expired', 'cancelled')),
    priority         integer     NOT NULL DEFAULT 50 CHECK (priority BETWEEN 0 AND 1000),
    payload          jsonb       NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    run_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at       timestamptz,
    -- clock_timestamp(), not now(): rows of one batch keep their order (FIFO within a priority).
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at      timestamptz,
    lease_id         uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    cancel_requested boolean     NOT NULL DEFAULT false,
    result           jsonb,
    last_error       text,
    idempotency_key  text,
    request_hash     text,
    CHECK (status <> 'claimed' OR (lease_id IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- The claim scan: FOR UPDATE SKIP LOCKED in priority, then FIFO order.
CREATE INDEX tasks_claim_idx ON tasks (runtime_id, priority DESC, created_at ASC)
    WHERE status = 'queued';

-- Earliest run_at of a runtime's delayed or backing-off tasks (verdict TTL, I4).
CREATE INDEX tasks_due_idx ON tasks (runtime_id, run_at) WHERE status = 'queued';

-- Lease reclaim: claimed tasks by lease expiry.
CREATE INDEX tasks_lease_idx ON tasks (lease_expires_at) WHERE status = 'claimed';

-- TTL expiry of queued tasks.
CREATE INDEX tasks_expiry_idx ON tasks (expires_at)
    WHERE status = 'queued' AND expires_at IS NOT NULL;

-- Listing a runtime's tasks oldest first, keyset pagination.
CREATE INDEX tasks_runtime_created_idx ON tasks (runtime_id, created_at, id);

-- Idempotency keys are unique per runtime for as long as the row is kept.
CREATE UNIQUE INDEX tasks_idempotency_idx ON tasks (runtime_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
