"""API tokens and webhook signing secrets as rows (auth/credentials.py's storage): a
token is stored as the hash of its secret, a webhook secret with its key, each under a
name that one live credential holds at a time. The secrets and keys come made by
auth/credentials.py, which also keeps their rules and shapes their answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from ..errors import AlreadyExists, NotFound
from .base import Row, StoreBase
from .sql import credentials as sql


class CredentialStatements(StoreBase):
    """Tokens and webhook secrets: created, listed, revoked, and looked up for
    authentication (by a token's hash) and for verifying webhooks (a runtime's keys).
    Nothing is cached here (auth.principals.Authenticator and auth.webhooks.Verifier
    cache). The rows are records of the credential tables, never holding a secret or a
    key but where a statement says so."""

    async def _insert_credential(self, kind: str, name: str, query: str, *args: object) -> Row:
        """A new credential's row; AlreadyExists when a live one of the kind has the name."""

        async def insert(c: asyncpg.Connection) -> Row:
            try:
                row: Row = await c.fetchrow(query, *args)
            except asyncpg.UniqueViolationError:
                # Only the live-name index can collide: a secret hash repeating is
                # a 2^-256 event.
                raise AlreadyExists(f"a live {kind} named {name!r} exists", field="name") from None
            return row

        return await self._run(insert)

    async def _revoke_credential(
        self, kind: str, ref: uuid.UUID | str, by_id: str, by_name: str
    ) -> Row:
        """Revoke by id, or by the name of a live one; NotFound when nothing matches."""
        query = by_id if isinstance(ref, uuid.UUID) else by_name
        row: Row | None = await self._run(lambda c: c.fetchrow(query, ref))
        if row is None:
            what = f"id {ref}" if isinstance(ref, uuid.UUID) else f"a live one named {ref!r}"
            raise NotFound(f"no {kind} with {what}")
        return row

    async def insert_token(
        self,
        name: str,
        secret_hash: bytes,
        scopes: Sequence[str],
        runtimes: Sequence[str] | None,
    ) -> Row:
        """Store a token by the SHA-256 of its secret; returns its row (no secret).
        `runtimes` None: every runtime. AlreadyExists when a live token has the name."""
        patterns = None if runtimes is None else list(runtimes)
        return await self._insert_credential(
            "token", name, sql.CREATE_TOKEN, name, secret_hash, list(scopes), patterns
        )

    async def list_tokens(
        self, include_revoked: bool, limit: int, after: tuple[datetime, uuid.UUID] | None
    ) -> list[Row]:
        """A page of live tokens (or all), oldest first: at most `limit`, after the
        (created_at, id) of the last one of the previous page (None: from the first);
        rows hold no secret."""
        since, last_id = after or (None, None)
        rows: list[Row] = await self._run(
            lambda c: c.fetch(sql.LIST_TOKENS, include_revoked, since, last_id, limit)
        )
        return rows

    async def revoke_token(self, ref: uuid.UUID | str) -> Row:
        """Revoke by id (idempotent: a revoked token keeps its first revoked_at) or by
        the name of a live token; NotFound when nothing matches."""
        return await self._revoke_credential(
            "token", ref, sql.REVOKE_TOKEN_BY_ID, sql.REVOKE_TOKEN_BY_NAME
        )

    async def live_token_by_hash(self, secret_hash: bytes) -> Row | None:
        """The live token whose secret hashes to `secret_hash`, or None."""
        row: Row | None = await self._run(lambda c: c.fetchrow(sql.LIVE_TOKEN_BY_HASH, secret_hash))
        return row

    async def insert_webhook_secret(
        self, name: str, signing_key: bytes, runtimes: Sequence[str]
    ) -> Row:
        """Store a webhook secret's signing key (in clear: verifying an HMAC needs the
        key itself); returns its row, without the key. AlreadyExists as insert_token."""
        return await self._insert_credential(
            "webhook secret",
            name,
            sql.CREATE_WEBHOOK_SECRET,
            name,
            signing_key,
            list(runtimes),
        )

    async def list_webhook_secrets(self, include_revoked: bool) -> list[Row]:
        """Live webhook secrets (or all), oldest first, without their keys."""
        rows: list[Row] = await self._run(
            lambda c: c.fetch(sql.LIST_WEBHOOK_SECRETS, include_revoked)
        )
        return rows

    async def revoke_webhook_secret(self, ref: uuid.UUID | str) -> Row:
        """As revoke_token, for webhook secrets."""
        return await self._revoke_credential(
            "webhook secret",
            ref,
            sql.REVOKE_WEBHOOK_SECRET_BY_ID,
            sql.REVOKE_WEBHOOK_SECRET_BY_NAME,
        )

    async def webhook_keys(self, runtime_id: str) -> tuple[bytes, ...]:
        """The signing keys of every live secret covering the runtime, newest first."""
        rows = await self._run(lambda c: c.fetch(sql.WEBHOOK_KEYS_FOR_RUNTIME, runtime_id))
        return tuple(bytes(r["signing_key"]) for r in rows)
