"""The runtimes listing, `GET /v1/runtimes`: which runtimes have live tasks, with their
counts, a page at a time in runtime id order (the console's first page).

Only runtimes holding a queued, scheduled or claimed task are listed: the listing reads
the live rows' partial indexes, so its cost follows the live tasks and not the finished
history. A token limited to runtime patterns sees only the runtimes they cover, and
its cursors tell it nothing of the others: they are sealed (cursors.py) and bound to
the token they were issued to.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...api.bodies import PATTERN_WALK, RUNTIMES_QUERY
from ...api.cursors import REFUSED, CursorSeal
from ...api.decode import RUNTIME_ID_RE
from ...api.fields import read_query
from ...api.history import SPARKLINE_SECONDS, sparkline_json
from ...auth.principals import Principal
from ...errors import ValidationFailed
from ...instance import Gateway
from ..io import json_response


def encode_cursor(seal: CursorSeal, runtime_id: str, principal: Principal | None) -> str:
    """The cursor after `runtime_id`, sealed for the caller (cursors.py).

    The runtime it names is often one the caller may not see: for a token limited to
    patterns, a walk that ends short of the page goes on after the last runtime it
    walked, covered or not. Sealed, the cursor tells the caller nothing of it, and the
    caller cannot write one for a place of its choosing (which would let it ask which
    runtime follows any name), nor use another caller's."""
    return seal.seal(runtime_id.encode(), _bound_to(principal))


def decode_cursor(seal: CursorSeal, cursor: str, principal: Principal | None) -> str:
    """The runtime id a cursor issued to this caller continues after, or 422 naming
    `cursor` for any other text: made up, altered, issued to another token (or by a
    server with another admin token: the client then lists again from the start)."""
    raw = seal.open(cursor, _bound_to(principal)).decode("ascii", "replace")
    if not RUNTIME_ID_RE.fullmatch(raw):
        raise ValidationFailed(REFUSED, field="cursor")
    return raw


def _bound_to(principal: Principal | None) -> bytes:
    # No principal: authentication is off, and every caller is the same admin.
    return b"" if principal is None else principal.identity


def page_of(
    walked: list[str], limit: int, walk: int, principal: Principal | None
) -> tuple[list[str], str | None]:
    """The page among the runtimes walked (at most `walk` of them), and the runtime id
    to go on after: the page's last runtime when the page is full, the last one walked
    (perhaps one the principal does not cover) when the walk may have stopped short of
    the end, else None."""
    visible = [r for r in walked if principal is None or principal.covers(r)]
    if len(visible) > limit:
        return visible[:limit], visible[limit - 1]
    if len(walked) >= walk:
        return visible, walked[-1]
    return visible, None


async def list_runtimes(request: Request, gw: Gateway) -> Response:
    """A page of runtimes with live tasks: counts from Postgres, parked pollers and
    tasks handed out in the last minute over every instance."""
    params = request.query_params
    limit = read_query(RUNTIMES_QUERY["limit"], params, {})
    cursor = read_query(RUNTIMES_QUERY["cursor"], params, {})
    include = read_query(RUNTIMES_QUERY["include"], params, {})
    principal: Principal | None = request.state.principal
    after = decode_cursor(gw.runtime_cursors, cursor, principal) if cursor else ""
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
    walked = await gw.store.walk_runtimes(after, walk, prefixes)
    page, resume_after = page_of(walked, limit, walk, principal)
    next_cursor = (
        None if resume_after is None else encode_cursor(gw.runtime_cursors, resume_after, principal)
    )
    rows = await gw.store.summarize_runtimes(page)
    ids = [row.runtime_id for row in rows]
    fleet = await gw.parked.fleet(
        ids,
        {rt: gw.claimer.parked(rt) for rt in ids},
        {rt: gw.claimer.activity.last_minute(rt) for rt in ids},
    )
    # One statement for the page's sparklines, not one per runtime.
    sparklines = (
        await gw.store.depth_sparklines(ids, SPARKLINE_SECONDS) if include == "sparkline" else None
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
                    **(
                        {}
                        if sparklines is None
                        else {"sparkline": sparkline_json(sparklines.get(row.runtime_id, []))}
                    ),
                }
                for row in rows
            ],
            "next_cursor": next_cursor,
        }
    )
