-- Runtime controls (docs/design.md, "5.2 Runtime controls"): pause, max_in_flight and
-- claims_per_second per runtime. A runtime without a row has no controls. The row is
-- also the lock that serialises a limited runtime's claims, and it holds the runtime's
-- token bucket (`tokens`, as of `refilled_at`), refilled by the claim that reads it.
CREATE TABLE runtime_controls (
    runtime_id        text             PRIMARY KEY,
    paused            boolean          NOT NULL DEFAULT false,
    max_in_flight     integer          CHECK (max_in_flight BETWEEN 1 AND 100000),
    claims_per_second double precision CHECK (claims_per_second > 0
                                              AND claims_per_second <= 100000),
    tokens            double precision NOT NULL DEFAULT 0,
    refilled_at       timestamptz      NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz      NOT NULL DEFAULT clock_timestamp()
);

-- The `control` scope: pause, resume and limit the runtimes a token covers.
ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_scopes_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_scopes_check
    CHECK (cardinality(scopes) > 0
           AND scopes <@ ARRAY['enqueue', 'claim', 'read', 'admin', 'control']);
