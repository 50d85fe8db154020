"""Who is calling, and what they may do.

A request carries `Authorization: Bearer <token>`. The token resolves to a
`Principal`: a set of scopes and, optionally, the runtime patterns it is limited to.
`GATEWAY_ADMIN_TOKEN` is the bootstrap admin; `GATEWAY_AUTH=off` (local development
only) makes every request an admin.
"""

from __future__ import annotations

import enum
import hmac
import re
from dataclasses import dataclass
from functools import cached_property

from .errors import Forbidden, Unauthorized
from .settings import Settings


class Scope(enum.StrEnum):
    """What a token may do. `admin` implies every other scope."""

    ENQUEUE = "enqueue"  # enqueue, batch, cancel, retry
    CLAIM = "claim"  # claim, heartbeat, complete, fail, release
    READ = "read"  # get a task, list, stats
    ADMIN = "admin"  # everything, including tokens and webhook secrets


# A runtime pattern: a runtime id in which `*` matches any run of characters.
RUNTIME_PATTERN_RE = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9._:*-]{0,127}$")


def pattern_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One regex matching a runtime id covered by any of the glob patterns."""
    alternatives = ("[^\n]*".join(re.escape(part) for part in p.split("*")) for p in patterns)
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `runtimes` None means every runtime."""

    name: str
    scopes: frozenset[Scope]
    runtimes: tuple[str, ...] | None = None

    @cached_property
    def _runtime_re(self) -> re.Pattern[str] | None:
        return None if self.runtimes is None else pattern_regex(self.runtimes)

    @property
    def all_runtimes(self) -> bool:
        return self.runtimes is None

    def allows(self, scope: Scope) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    def covers(self, runtime_id: str) -> bool:
        """True when the token may act on this runtime."""
        regex = self._runtime_re
        return regex is None or regex.fullmatch(runtime_id) is not None

    def require(self, scope: Scope) -> None:
        """Raises Forbidden (403) unless the principal holds `scope`."""
        if not self.allows(scope):
            raise Forbidden(f"this token lacks the '{scope}' scope needed here")

    def require_runtime(self, runtime_id: str) -> None:
        """Raises Forbidden (403) unless the principal's patterns cover the runtime."""
        if not self.covers(runtime_id):
            raise Forbidden(f"this token does not cover runtime {runtime_id!r}")


ADMIN = Principal("admin", frozenset({Scope.ADMIN}))


class Authenticator:
    """Resolves the Authorization header to a Principal. Runs on every request."""

    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        self._admin_token = (settings.admin_token or "").encode()

    async def authenticate(self, authorization: str | None) -> Principal:
        """The caller, or Unauthorized (401)."""
        if not self.enabled:
            return ADMIN
        token = bearer_token(authorization)
        if hmac.compare_digest(token.encode(), self._admin_token):
            return ADMIN
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
