-- gateway: no-transaction
-- The token listing (GET /v1/admin/tokens, `gateway token list`) pages oldest first by
-- (created_at, id): each page starts where the last ended, through this index, instead
-- of sorting every token. Built without blocking token creation and revocation.
CREATE INDEX CONCURRENTLY IF NOT EXISTS api_tokens_listing_idx ON api_tokens (created_at, id);
