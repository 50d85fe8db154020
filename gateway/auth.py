"""Request authentication. For now: the bootstrap admin token (`GATEWAY_ADMIN_TOKEN`)
as a bearer token, or no check at all with `GATEWAY_AUTH=off` (local development).
"""

from __future__ import annotations

import hmac

from .errors import Unauthorized
from .settings import Settings


class Authenticator:
    """Checks the Authorization header. Stateless and cheap: runs on every request."""

    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        self._token = (settings.admin_token or "").encode()

    def check(self, authorization: str | None) -> None:
        """Raises Unauthorized unless the header carries the admin token."""
        if not self.enabled:
            return
        if not authorization:
            raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization header must be 'Bearer <token>'")
        if not hmac.compare_digest(token.strip().encode(), self._token):
            raise Unauthorized("the bearer token is not valid")
