-- Scoped API tokens, and the secrets that sign webhook deliveries.

-- A token is kept as the SHA-256 of its secret only: the secret is shown once, at creation.
CREATE TABLE api_tokens (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    secret_hash bytea       NOT NULL UNIQUE CHECK (length(secret_hash) = 32),
    scopes      text[]      NOT NULL
                CHECK (cardinality(scopes) > 0
                       AND scopes <@ ARRAY['enqueue', 'claim', 'read', 'admin']),
    -- NULL: every runtime. Otherwise runtime id globs in which * matches any run of characters.
    runtimes    text[]      CHECK (runtimes IS NULL OR cardinality(runtimes) > 0),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at  timestamptz
);

-- A name is unique among live tokens; a revoked token's name may be given out again.
CREATE UNIQUE INDEX api_tokens_live_name_idx ON api_tokens (name) WHERE revoked_at IS NULL;

-- The signing key is kept in clear: verifying an HMAC needs the key itself, not a hash.
CREATE TABLE webhook_secrets (
    id          uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text        NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    signing_key bytea       NOT NULL CHECK (length(signing_key) >= 24),
    runtimes    text[]      NOT NULL CHECK (cardinality(runtimes) > 0),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    revoked_at  timestamptz
);

CREATE UNIQUE INDEX webhook_secrets_live_name_idx ON webhook_secrets (name)
    WHERE revoked_at IS NULL;
