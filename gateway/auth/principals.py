"""Who is calling, and what they may do.

A request carries `Authorization: Bearer <token>`. The token resolves to a
`Principal`: a set of scopes and, optionally, the runtime patterns it is limited to.
`GATEWAY_ADMIN_TOKEN` is the bootstrap admin; every other token is looked up by the
SHA-256 of its secret (gateway.credentials stores them), through a per-process cache
whose entries live at most TOKEN_CACHE_TTL_SECONDS, so that a revoked token stops
working on every instance within that time. `GATEWAY_AUTH=off` (local development
only) makes every request an admin.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..admission import releasing
from ..api.credential_bodies import Scope
from ..errors import Forbidden, Unauthorized
from ..settings import Settings


def glob_match(pattern: str, runtime_id: str) -> bool:
    """True when `runtime_id` matches `pattern`, in which `*` matches any run of
    characters. Linear time: a regex with several `*` backtracks exponentially, and a
    token holder chooses both the pattern's shape (at creation) and the runtime id."""
    if "*" not in pattern:
        return pattern == runtime_id
    first, *middle, last = pattern.split("*")
    if len(first) + len(last) > len(runtime_id):
        return False
    if not (runtime_id.startswith(first) and runtime_id.endswith(last)):
        return False
    # Each middle part at its leftmost place leaves the most room for the rest.
    position, end = len(first), len(runtime_id) - len(last)
    for part in middle:
        found = runtime_id.find(part, position, end)
        if found < 0:
            return False
        position = found + len(part)
    return True


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `runtimes` None means every runtime. `token_id` is the
    issued token's id; None for the bootstrap admin (GATEWAY_ADMIN_TOKEN, or anyone
    with GATEWAY_AUTH=off)."""

    name: str
    scopes: frozenset[Scope]
    runtimes: tuple[str, ...] | None = None
    token_id: uuid.UUID | None = None

    @property
    def identity(self) -> bytes:
        """Who this is, as bytes that differ between any two tokens (ids, not names,
        since a revoked token's name may be given again); what a sealed cursor is bound
        to (cursors.py)."""
        if self.token_id is not None:
            return b"token:" + self.token_id.bytes
        return b"principal:" + self.name.encode()

    @property
    def all_runtimes(self) -> bool:
        return self.runtimes is None

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    def covers(self, runtime_id: str) -> bool:
        """True when the token may act on this runtime."""
        return self.runtimes is None or any(glob_match(p, runtime_id) for p in self.runtimes)

    def require(self, scope: Scope) -> None:
        """Raises Forbidden (403) unless the principal holds `scope`."""
        if not self.allows(scope):
            raise Forbidden(f"this token lacks the '{scope}' scope needed here")

    def require_runtime(self, runtime_id: str) -> None:
        """Raises Forbidden (403) unless the principal's patterns cover the runtime."""
        if not self.covers(runtime_id):
            raise Forbidden(f"this token does not cover runtime {runtime_id!r}")


ADMIN = Principal("admin", frozenset({Scope.ADMIN}))

# Every issued token starts with this, so that a leaked one is recognisable (secret
# scanners) and a bearer without it is refused without a database lookup.
TOKEN_PREFIX = "gwt_"
MAX_TOKEN_CHARS = 200
# How long one process trusts what it read about a token, present or absent, in
# seconds. A revocation reaches every instance within this (well inside 5 s).
TOKEN_CACHE_TTL_SECONDS = 2.0
TOKEN_CACHE_ENTRIES = 10_000


def hash_token(secret: str) -> bytes:
    """What the database keeps of a token: the SHA-256 of its secret (32 bytes). The
    secret has 256 random bits, so a plain hash is enough; no salt or stretching."""
    return hashlib.sha256(secret.encode()).digest()


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LocalCache(Generic[K, V]):
    """A small in-process cache of lookups, misses included: at most `max_entries`
    (least recently used dropped first), each kept at most `ttl_seconds` from the
    moment its load began. Concurrent lookups of one key share one load; a load that
    fails is not cached. Owned by whoever builds it; holds no connection."""

    def __init__(
        self,
        ttl_seconds: float,
        max_entries: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._loading: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: K, load: Callable[[K], Awaitable[V]]) -> V:
        """The cached value of `key`, or `load(key)`'s, which is then cached."""
        entry = self._entries.get(key)
        if entry is not None:
            if entry[0] > self._clock():
                self._entries.move_to_end(key)
                return entry[1]
            del self._entries[key]
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(key, load))
            # Retrieve a failure even if every waiter was cancelled meanwhile.
            pending.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._loading[key] = pending
        # One waiter leaving must not cancel the load the others wait for.
        return await asyncio.shield(pending)

    async def _load(self, key: K, load: Callable[[K], Awaitable[V]]) -> V:
        # The age counts from before the read, so a slow read cannot stretch it.
        expires = self._clock() + self.ttl_seconds
        try:
            # Shared by every request of the key, whatever their kind: a load is never
            # shed for one of them (gateway/admission.py), nor fails the others with it.
            with releasing():
                value = await load(key)
        finally:
            self._loading.pop(key, None)
        self._entries[key] = (expires, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def peek(self, key: K) -> tuple[bool, V | None]:
        """(True, value) when `key` holds a live entry, as `get` would answer it without
        loading; (False, None) otherwise."""
        entry = self._entries.get(key)
        if entry is None or entry[0] <= self._clock():
            return False, None
        self._entries.move_to_end(key)
        return True, entry[1]

    def clear(self) -> None:
        """Forget every entry (a load under way still stores its answer)."""
        self._entries.clear()


# Resolves the hash of a token's secret to its principal, or None for no live token.
TokenLookup = Callable[[bytes], Awaitable[Principal | None]]


class Authenticator:
    """Resolves the Authorization header to a Principal. Runs on every request.
    `lookup` finds issued tokens (None: only the admin token is accepted)."""

    def __init__(self, settings: Settings, lookup: TokenLookup | None = None) -> None:
        self.enabled = settings.auth_enabled
        self._admin_token = (settings.admin_token or "").encode()
        self._lookup = lookup
        self.cache: LocalCache[bytes, Principal | None] = LocalCache(
            TOKEN_CACHE_TTL_SECONDS, TOKEN_CACHE_ENTRIES
        )

    def known(self, authorization: str | None) -> Principal | None:
        """The caller when it is known without a lookup: authentication is off, the
        admin token, or an issued token whose principal this process's cache holds.
        None when `authenticate` must answer (a lookup, or a refusal). Raises
        Unauthorized as `authenticate` does for a header that holds no bearer token.
        Every request asks this first: most are answered here, with no coroutine."""
        if not self.enabled:
            return ADMIN
        token = bearer_token(authorization)
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
        if token.startswith(TOKEN_PREFIX) and len(token) <= MAX_TOKEN_CHARS:
            return self.cache.peek(hash_token(token))[1]
        return None

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller, or Unauthorized (401); StoreUnavailable (503) when an issued
        token must be looked up and the database cannot answer."""
        if not self.enabled:
            return ADMIN
        token = bearer_token(authorization)
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
        if (
            self._lookup is not None
            and token.startswith(TOKEN_PREFIX)
            and len(token) <= MAX_TOKEN_CHARS
        ):
            # Looked up by hash, so no comparison of secrets happens here at all.
            principal = await self.cache.get(hash_token(token), self._lookup)
            if principal is not None:
                return principal
        raise Unauthorized("the bearer token is not valid", invalid_token=True)


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header, or Unauthorized."""
    if not authorization:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization header must be 'Bearer <token>'", invalid_token=True)
    return token
