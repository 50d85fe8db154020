"""The statements of store/credentials.py (CredentialStatements): API tokens, stored as
the hash of their secret, and webhook signing secrets, stored with their key.
"""

from __future__ import annotations

TOKEN_COLUMNS = "id, name, scopes, runtimes, created_at, revoked_at"

# A name already held by a live token violates api_tokens_live_name_idx.
CREATE_TOKEN = f"""
INSERT INTO api_tokens (name, secret_hash, scopes, runtimes) VALUES ($1, $2, $3, $4)
RETURNING {TOKEN_COLUMNS}
"""

# The authenticator's lookup, by the unique index on secret_hash.
LIVE_TOKEN_BY_HASH = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE secret_hash = $1 AND revoked_at IS NULL
"""

# A page of live tokens, or of every token when $1, oldest first: at most $4 after
# (created_at, id) = ($2, $3), keyset paged on api_tokens_listing_idx (migration 0010).
# The first page passes NULLs, which start before any token; the row comparison stays a
# range of the index under a generic plan too.
LIST_TOKENS = f"""
SELECT {TOKEN_COLUMNS} FROM api_tokens
 WHERE ($1 OR revoked_at IS NULL)
   AND (created_at, id) > (COALESCE($2::timestamptz, '-infinity'),
                           COALESCE($3::uuid, '00000000-0000-0000-0000-000000000000'))
 ORDER BY created_at, id
 LIMIT $4
"""

# Revoking twice keeps the first revoked_at, so a repeated revoke is harmless.
REVOKE_TOKEN_BY_ID = f"""
UPDATE api_tokens SET revoked_at = COALESCE(revoked_at, clock_timestamp())
 WHERE id = $1
RETURNING {TOKEN_COLUMNS}
"""

# Names repeat among revoked tokens: a name means the live token that holds it.
REVOKE_TOKEN_BY_NAME = f"""
UPDATE api_tokens SET revoked_at = clock_timestamp()
 WHERE name = $1 AND revoked_at IS NULL
RETURNING {TOKEN_COLUMNS}
"""

WEBHOOK_SECRET_COLUMNS = "id, name, runtimes, created_at, revoked_at"

CREATE_WEBHOOK_SECRET = f"""
INSERT INTO webhook_secrets (name, signing_key, runtimes) VALUES ($1, $2, $3)
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

LIST_WEBHOOK_SECRETS = f"""
SELECT {WEBHOOK_SECRET_COLUMNS} FROM webhook_secrets
 WHERE $1 OR revoked_at IS NULL
 ORDER BY created_at, id
"""

REVOKE_WEBHOOK_SECRET_BY_ID = f"""
UPDATE webhook_secrets SET revoked_at = COALESCE(revoked_at, clock_timestamp())
 WHERE id = $1
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

REVOKE_WEBHOOK_SECRET_BY_NAME = f"""
UPDATE webhook_secrets SET revoked_at = clock_timestamp()
 WHERE name = $1 AND revoked_at IS NULL
RETURNING {WEBHOOK_SECRET_COLUMNS}
"""

# The keys of live secrets with a pattern covering runtime $1. A pattern's * becomes
# LIKE's %, and its _ (a plain character in runtime ids) is escaped; patterns cannot
# hold % or \ (auth.principals.RUNTIME_PATTERN_RE), so this matches exactly what
# auth.principals.glob_match matches. The table is small (one row per sender): a scan
# of the live rows is fine.
WEBHOOK_KEYS_FOR_RUNTIME = """
SELECT signing_key FROM webhook_secrets
 WHERE revoked_at IS NULL
   AND EXISTS (SELECT 1 FROM unnest(runtimes) AS p(pattern)
                WHERE $1 LIKE replace(replace(p.pattern, '_', '\\_'), '*', '%'))
 ORDER BY created_at DESC
"""
