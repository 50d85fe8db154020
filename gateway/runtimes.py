"""The runtimes listing, `GET /v1/runtimes`: which runtimes have live tasks, with their
counts, a page at a time in runtime id order (the console's first page).

Only runtimes holding a queued, scheduled or claimed task are listed: the listing reads
the live rows' partial indexes, so its cost follows the live tasks and not the finished
history. A token limited to runtime patterns sees only the runtimes they cover.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response

from .auth import Principal
from .errors import ValidationFailed
from .httpio import json_response
from .models import RUNTIME_ID_RE
from .runtime import Gateway
from .schema import Body, Field, Kind, read_query
from .store_runtimes import summarize_runtimes, walk_runtimes

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Runtimes one request walks for a token limited to patterns, which may cover few of
# them: the page then holds the covered ones among these, possibly none, with a
# next_cursor to go on from. Bounds the request's work whatever the patterns.
PATTERN_WALK = 1000

RUNTIMES_QUERY = Body(
    "RuntimesQuery",
    "A page of the runtimes that have live tasks, in runtime id order.",
    (
        Field(
            "limit",
            Kind.INTEGER,
            "Runtimes per page.",
            default=DEFAULT_LIMIT,
            minimum=1,
            maximum=MAX_LIMIT,
        ),
        Field("cursor", Kind.STRING, "The next_cursor of the previous page."),
    ),
)


def encode_cursor(runtime_id: str) -> str:
    """The cursor after `runtime_id`: opaque to clients, base64url without padding."""
    return base64.urlsafe_b64encode(runtime_id.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The runtime id a cursor continues after, or 422 naming `cursor`."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raw = ""
    if not RUNTIME_ID_RE.fullmatch(raw):
        raise ValidationFailed(
            "cursor is not one this server returned as next_cursor", field="cursor"
        )
    return raw


def parse_limit(params: Mapping[str, str]) -> int:
    """`limit`, 1 to MAX_LIMIT (DEFAULT_LIMIT when absent), or 422 naming it."""
    raw = params.get("limit", str(DEFAULT_LIMIT))
    digits = raw.lstrip("0") or "0"  # int() refuses over 4300 digits with its own error
    if (
        not (digits.isascii() and digits.isdigit())
        or len(digits) > len(str(MAX_LIMIT))
        or not 1 <= int(digits) <= MAX_LIMIT
    ):
        raise ValidationFailed(f"limit must be an integer from 1 to {MAX_LIMIT}", field="limit")
    return int(digits)


def page_of(
    walked: list[str], limit: int, walk: int, principal: Principal | None
) -> tuple[list[str], str | None]:
    """The page among the runtimes walked (at most `walk` of them), and the cursor to go
    on from: after the page's last runtime when the page is full, after the last one
    walked when the walk may have stopped short of the end, else None."""
    visible = [r for r in walked if principal is None or principal.covers(r)]
    if len(visible) > limit:
        return visible[:limit], encode_cursor(visible[limit - 1])
    if len(walked) >= walk:
        return visible, encode_cursor(walked[-1])
    return visible, None


async def list_runtimes(request: Request, gw: Gateway) -> Response:
    """A page of runtimes with live tasks: counts from Postgres, parked pollers and
    tasks handed out in the last minute over every instance."""
    params = request.query_params
    limit = parse_limit(params)
    cursor = read_query(RUNTIMES_QUERY["cursor"], params, {})
    after = decode_cursor(cursor) if cursor else ""
    principal: Principal | None = request.state.principal
    # One more than the page shows, so that a full page knows whether more follow.
    walk = limit + 1
    prefixes = None
    if principal is not None and principal.runtimes is not None:
        walk = max(walk, PATTERN_WALK)
        # What each pattern holds before its first `*`: no covered runtime sorts before
        # the smallest. A pattern starting with `*` may cover any runtime.
        prefixes = [p.split("*", 1)[0] for p in principal.runtimes]
        if "" in prefixes:
            prefixes = None
    walked = await walk_runtimes(gw.store, after, walk, prefixes)
    page, next_cursor = page_of(walked, limit, walk, principal)
    rows = await summarize_runtimes(gw.store, page)
    ids = [row.runtime_id for row in rows]
    fleet = await gw.parked.fleet(
        ids,
        {rt: gw.claimer.parked(rt) for rt in ids},
        {rt: gw.claimer.activity.last_minute(rt) for rt in ids},
    )
    return json_response(
        {
            "runtimes": [
                {
                    "runtime_id": row.runtime_id,
                    "queued": row.queued,
                    "claimed": row.claimed,
                    "oldest_queued_age_seconds": row.oldest_queued_age_seconds,
                    "parked_pollers": fleet.parked[row.runtime_id],
                    "paused": gw.controls.paused(row.runtime_id),
                    "dead": row.dead,
                    "claims_per_minute": fleet.claims[row.runtime_id],
                }
                for row in rows
            ],
            "next_cursor": next_cursor,
        }
    )
