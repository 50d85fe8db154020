"""Admin API handlers (scope admin): scoped tokens and webhook secrets.

A secret appears once, in the 201 answer that creates it (marked no-store); listings
never hold one. Revoking clears this instance's caches at once; other instances stop
accepting the credential within their cache TTL (2 s).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from ...api import credential_bodies, cursors
from ...api.credential_bodies import INCLUDE_REVOKED, TOKENS_CURSOR
from ...api.fields import read_query
from ...auth import credentials
from ...errors import NotFound
from ..io import json_response, read_json

if TYPE_CHECKING:
    from ...instance import Gateway

# A secret in an answer must not be kept by caches or proxies along the way.
SECRET_HEADERS = {"Cache-Control": "no-store"}


def _include_revoked(params: Mapping[str, str]) -> bool:
    return read_query(INCLUDE_REVOKED["include_revoked"], params, {}) in ("true", "1")


def _path_id(request: Request, param: str, kind: str) -> uuid.UUID:
    raw = request.path_params[param]
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"no {kind} with id {raw!r}") from None


async def create_token(request: Request, gw: Gateway) -> Response:
    spec = credentials.parse_token_spec(await read_json(request, gw.settings))
    row, secret = await gw.credentials.create_token(spec)
    return json_response(credentials.token_json(row, secret), 201, SECRET_HEADERS)


async def list_tokens(request: Request, gw: Gateway) -> Response:
    """A page of tokens, oldest first, with the cursor after its last one while more
    follow: that token's (created_at, id) in base64, as the task listing's cursor is.
    It need not be sealed as the runtimes listing's is (cursors.py): only an admin
    lists tokens, and an admin sees every one."""
    params = request.query_params
    include_revoked = _include_revoked(params)
    limit = read_query(credential_bodies.TOKENS_LIMIT, params, {})
    cursor = read_query(TOKENS_CURSOR, params, {})
    after = cursors.decode_cursor(cursor) if cursor else None
    # One more than the page shows, so that a full page knows whether more follow.
    rows = await gw.credentials.list_tokens(include_revoked, limit + 1, after)
    page = rows[:limit]
    last = page[-1] if len(rows) > limit else None
    return json_response(
        {
            "tokens": [credentials.token_json(r) for r in page],
            "next_cursor": (
                None if last is None else cursors.keyset_cursor(last["created_at"], last["id"])
            ),
        }
    )


async def revoke_token(request: Request, gw: Gateway) -> Response:
    """204, also for a token revoked before; 404 for an unknown id."""
    await gw.credentials.revoke_token(_path_id(request, "token_id", "token"))
    gw.auth.cache.clear()
    return Response(status_code=204)


async def create_webhook_secret(request: Request, gw: Gateway) -> Response:
    spec = credentials.parse_webhook_secret_spec(await read_json(request, gw.settings))
    row, secret = await gw.credentials.create_webhook_secret(spec)
    return json_response(credentials.webhook_secret_json(row, secret), 201, SECRET_HEADERS)


async def list_webhook_secrets(request: Request, gw: Gateway) -> Response:
    rows = await gw.credentials.list_webhook_secrets(_include_revoked(request.query_params))
    return json_response({"webhook_secrets": [credentials.webhook_secret_json(r) for r in rows]})


async def revoke_webhook_secret(request: Request, gw: Gateway) -> Response:
    """204, also for a secret revoked before; 404 for an unknown id."""
    await gw.credentials.revoke_webhook_secret(_path_id(request, "secret_id", "webhook secret"))
    gw.webhooks.cache.clear()
    return Response(status_code=204)
