"""Scoped API tokens and webhook signing secrets: their rules, their secrets, their rows.

A token is stored as the SHA-256 of its secret (`gwt_...`), shown once at creation. A
webhook secret (`whsec_<base64 key>`) is also shown once, but its key is stored in
clear: verifying an HMAC needs the key itself. Their rows are kept by the store
(store/credentials.py); this module keeps no connection and no cache of its own
(principals.Authenticator and webhooks.Verifier cache).
"""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..api.credential_bodies import (
    MAX_PATTERNS,
    MAX_TOKENS_PAGE,
    NAME_RE,
    RUNTIME_PATTERN_RE,
    Scope,
)
from ..api.render import format_time
from ..errors import ValidationFailed
from ..store import Store
from ..store.base import Row
from .principals import TOKEN_PREFIX, Principal, hash_token

WEBHOOK_SECRET_PREFIX = "whsec_"
WEBHOOK_KEY_BYTES = 32  # Standard Webhooks asks for 24 to 64 random bytes
TOKEN_SECRET_BYTES = 32
TOKEN_FIELDS = frozenset({"name", "scopes", "runtimes"})
WEBHOOK_SECRET_FIELDS = frozenset({"name", "runtimes"})


# -- rules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenSpec:
    """A token to create. `runtimes` None: every runtime."""

    name: str
    scopes: tuple[Scope, ...]
    runtimes: tuple[str, ...] | None


@dataclass(frozen=True)
class WebhookSecretSpec:
    """A webhook secret to create; it signs deliveries to the runtimes it covers."""

    name: str
    runtimes: tuple[str, ...]


def _unknown_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    # A misspelt "runtime" must not silently make a token for every runtime.
    for key in body:
        if key not in allowed:
            raise ValidationFailed(
                f"unknown field {key!r}; expected {', '.join(sorted(allowed))}", field=key
            )


def _name(body: Mapping[str, Any]) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValidationFailed(
            "name is required: 1-100 letters, digits and . _ : @ -, starting with a "
            "letter or digit",
            field="name",
        )
    try:
        uuid.UUID(name)
    except ValueError:
        return name
    # Revoke takes an id or a name: a name shaped like an id would be ambiguous.
    raise ValidationFailed("name must not look like an id (a UUID)", field="name")


def _patterns(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_PATTERNS:
        raise ValidationFailed(
            f"runtimes must be a list of 1 to {MAX_PATTERNS} runtime patterns", field="runtimes"
        )
    out: list[str] = []
    for pattern in raw:
        if not isinstance(pattern, str) or not RUNTIME_PATTERN_RE.fullmatch(pattern):
            raise ValidationFailed(
                f"runtime pattern {pattern!r} is not valid: 1-128 letters, digits and "
                ". _ : - or *, where * matches any run of characters",
                field="runtimes",
            )
        if pattern not in out:
            out.append(pattern)
    return tuple(out)


def parse_token_spec(body: Mapping[str, Any]) -> TokenSpec:
    """A token request (`name`, `scopes`, optional `runtimes`), or ValidationFailed
    naming the field."""
    _unknown_fields(body, TOKEN_FIELDS)
    name = _name(body)
    raw_scopes = body.get("scopes")
    values = [s.value for s in Scope]
    known = ", ".join(values)
    if not isinstance(raw_scopes, list) or not raw_scopes:
        raise ValidationFailed(f"scopes must be a non-empty list of {known}", field="scopes")
    scopes: list[Scope] = []
    for raw in raw_scopes:
        if not isinstance(raw, str) or raw not in values:
            raise ValidationFailed(f"unknown scope {raw!r}; scopes are {known}", field="scopes")
        if Scope(raw) not in scopes:
            scopes.append(Scope(raw))
    runtimes = None if body.get("runtimes") is None else _patterns(body["runtimes"])
    if runtimes is not None and Scope.ADMIN in scopes:
        # An admin can mint tokens for any runtime, so a limit on it would be a fiction.
        raise ValidationFailed(
            "an admin token covers every runtime; drop runtimes or the admin scope",
            field="runtimes",
        )
    return TokenSpec(name, tuple(scopes), runtimes)


def parse_webhook_secret_spec(body: Mapping[str, Any]) -> WebhookSecretSpec:
    """A webhook secret request (`name`, `runtimes` required), or ValidationFailed."""
    _unknown_fields(body, WEBHOOK_SECRET_FIELDS)
    name = _name(body)
    if body.get("runtimes") is None:
        raise ValidationFailed(
            "runtimes is required: the runtime patterns this secret may enqueue into",
            field="runtimes",
        )
    return WebhookSecretSpec(name, _patterns(body["runtimes"]))


def new_token_secret() -> str:
    """A fresh token secret: the prefix and 256 random bits, URL-safe."""
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_SECRET_BYTES)


def webhook_secret_text(key: bytes) -> str:
    """The `whsec_<base64>` form senders configure (Standard Webhooks)."""
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(key).decode()


def principal_of(row: Mapping[str, Any]) -> Principal:
    runtimes = row["runtimes"]
    return Principal(
        name=row["name"],
        scopes=frozenset(Scope(s) for s in row["scopes"]),
        runtimes=None if runtimes is None else tuple(runtimes),
        token_id=row["id"],
    )


def token_json(row: Mapping[str, Any], secret: str | None = None) -> dict[str, Any]:
    """The API's token object. Just created (`secret` given): with `token`, the secret,
    and without `revoked_at`; listed: with `revoked_at` (null while live)."""
    out: dict[str, Any] = {
        "id": str(row["id"]),
        "name": row["name"],
        "scopes": list(row["scopes"]),
        "runtimes": None if row["runtimes"] is None else list(row["runtimes"]),
    }
    if secret is not None:
        out["token"] = secret
    out["created_at"] = format_time(row["created_at"])
    if secret is None:
        out["revoked_at"] = format_time(row["revoked_at"])
    return out


def webhook_secret_json(row: Mapping[str, Any], secret: str | None = None) -> dict[str, Any]:
    """The API's webhook secret object, shaped as token_json's, with `secret`."""
    out: dict[str, Any] = {
        "id": str(row["id"]),
        "name": row["name"],
        "runtimes": list(row["runtimes"]),
    }
    if secret is not None:
        out["secret"] = secret
    out["created_at"] = format_time(row["created_at"])
    if secret is None:
        out["revoked_at"] = format_time(row["revoked_at"])
    return out


# -- storage -------------------------------------------------------------------------


class Credentials:
    """Tokens and webhook secrets over the store (store/credentials.py holds their
    statements): this side makes the secrets, hashes tokens, and turns a token's row
    into its Principal."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def create_token(self, spec: TokenSpec) -> tuple[Row, str]:
        """Store a new token; returns its row and its secret, which nothing keeps.
        AlreadyExists when a live token has the name."""
        secret = new_token_secret()
        row = await self._store.insert_token(
            spec.name, hash_token(secret), [s.value for s in spec.scopes], spec.runtimes
        )
        return row, secret

    async def list_tokens(
        self,
        include_revoked: bool = False,
        limit: int = MAX_TOKENS_PAGE,
        after: tuple[datetime, uuid.UUID] | None = None,
    ) -> list[Row]:
        """A page of live tokens (or all), oldest first: at most `limit`, after the
        (created_at, id) of the last one of the previous page (None: from the first);
        rows hold no secret."""
        return await self._store.list_tokens(include_revoked, limit, after)

    async def revoke_token(self, ref: uuid.UUID | str) -> Row:
        """Revoke by id (idempotent: a revoked token keeps its first revoked_at) or by
        the name of a live token; NotFound when nothing matches."""
        return await self._store.revoke_token(ref)

    async def principal_by_hash(self, secret_hash: bytes) -> Principal | None:
        """The live token whose secret hashes to `secret_hash`, or None (auth's lookup)."""
        row = await self._store.live_token_by_hash(secret_hash)
        return None if row is None else principal_of(row)

    async def create_webhook_secret(self, spec: WebhookSecretSpec) -> tuple[Row, str]:
        """Store a new signing key; returns its row and its `whsec_` text, shown once."""
        key = secrets.token_bytes(WEBHOOK_KEY_BYTES)
        row = await self._store.insert_webhook_secret(spec.name, key, spec.runtimes)
        return row, webhook_secret_text(key)

    async def list_webhook_secrets(self, include_revoked: bool = False) -> list[Row]:
        """Live webhook secrets (or all), oldest first, without their keys."""
        return await self._store.list_webhook_secrets(include_revoked)

    async def revoke_webhook_secret(self, ref: uuid.UUID | str) -> Row:
        """As revoke_token, for webhook secrets."""
        return await self._store.revoke_webhook_secret(ref)

    async def webhook_keys(self, runtime_id: str) -> tuple[bytes, ...]:
        """The signing keys of every live secret covering the runtime, newest first."""
        return await self._store.webhook_keys(runtime_id)


def parse_ref(raw: str) -> uuid.UUID | str:
    """An ID_OR_NAME argument: an id when it parses as a UUID, else a name."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        return raw
