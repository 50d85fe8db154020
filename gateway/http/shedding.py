"""Work refused at the door while the database's line is full (gateway/admission.py).

Under a flood of clients that send again the moment they are answered, every refusal
is paid for in the gateway's CPU, on the same event loop that serves the requests let
in: a refusal that costs nearly what serving does leaves little for the work. So a
request of work is refused here, before the app's middleware, routing, token check,
body or access line, with one answer encoded at start-up and written in one piece
(io.constant_problem): `503 database_busy`, `Retry-After`, the problem naming
GATEWAY_DB_QUEUE_BUDGET_MS. It is counted in
`gateway_shed_total`, not in `gateway_http_requests_total` nor the access log (the
gateway logs that it sheds at most once per 10 s).

The connection is then read again only at the end of the Retry-After it was told (the
protocol, gateway/http/server.py, reads HOLD_READING in the request's scope once the
answer is out): a client that ignores Retry-After and sends again at once is refused
about once a second per connection, rather than in a tight loop.

Which requests: the endpoints `refused_early` marks (enqueues, signed webhooks, reads),
matched by method and path only while the line is full; never a claim (an empty
verdict answers it without the database), a report on a claimed task, a control, a
probe or the metrics.

A bare claim (one that neither waits nor carries completes or fails) that arrives
while the instance is busy (more than GATEWAY_MAX_ACTIVE_REQUESTS requests at work) is
refused here too, with the claim handler's own `429 overloaded`: its body, read here,
is parsed as the handler would, and any other claim, or one whose body is not all in
one read or not valid, goes on with its body as read. Under a flood of such claims,
refusing them after the request log, the token check and the route took about a
quarter of the gateway's time in a sampled profile (2026-11-29). The handler keeps its
own check for the claims that get past this one.

Where: a request whose head and body arrive in one read is judged by the connection
protocol itself as soon as it is parsed (`early`, called from gateway/http/server.py),
and a refusal is written from there: no task, app or ASGI message is made for it, which
took a third off the CPU of a refusal in this process (`python -m bench.refusal_cost`:
22.6 to 15.0 us, 2026-11-29). Any other (a body still arriving, another server than
the gateway's own) reaches the app, whose `__call__` asks `line_refusal` and `claim`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api import decode, requests
from ..errors import DatabaseBusy, GatewayError
from .handlers.daemon import busy_refusal
from .io import DOOR_PASSED, HOLD_READING, ConstantResponse, constant_problem

if TYPE_CHECKING:
    from ..instance import Gateway
    from .routes import Endpoint

CLAIM_PATH = "/v1/runtimes/{rt}/claim"


class Shedding:
    """The door's check and its answer, for one app."""

    def __init__(self, endpoints: Iterable[Endpoint], refusal: DatabaseBusy) -> None:
        self._paths: dict[str, list[re.Pattern[str]]] = {}
        for endpoint in endpoints:
            if endpoint.refused_early:
                regex, _, _ = compile_path(endpoint.path)
                self._paths.setdefault(endpoint.method, []).append(regex)
        self._answer = constant_problem(refusal)
        self._hold_seconds = float(refusal.retry_after_seconds)
        self._claim = compile_path(CLAIM_PATH)[0]

    def refuses(self, scope: Scope) -> bool:
        """Whether the request is work that the door refuses (asked only while the
        database's line is full)."""
        regexes = self._paths.get(scope["method"])
        return regexes is not None and any(r.match(scope["path"]) for r in regexes)

    def line_refusal(self, scope: Scope, gateway: Gateway) -> ConstantResponse | None:
        """While the database's line is full, the refusal of work (the same bytes for
        every request), counted, its connection read again after its Retry-After; else
        None."""
        if gateway.store.crowded() and self.refuses(scope):
            gateway.store.shed()
            scope[HOLD_READING] = self._hold_seconds
            return self._answer
        return None

    def is_claim(self, scope: Scope) -> bool:
        """Whether the request is a claim (asked only while the instance is busy)."""
        return scope["method"] == "POST" and self._claim.match(scope["path"]) is not None

    def early(
        self, scope: Scope, body: bytes | bytearray, gateway: Gateway
    ) -> ConstantResponse | None:
        """The door's refusal of a request whose body, `body`, has arrived in full, or
        None to let it in, marked DOOR_PASSED for the app's door to skip: the server
        writes a refusal without starting the app for it (server.py). Counted as shed,
        and its connection held, as the app's door (`line_refusal`, `claim`) does."""
        refusal = self.line_refusal(scope, gateway)
        if refusal is not None:
            return refusal
        if gateway.busy() and self.is_claim(scope) and self._bare(scope, bytes(body), gateway):
            return self._refuse_busy(scope, gateway)
        scope[DOOR_PASSED] = True
        return None

    async def claim(
        self, scope: Scope, receive: Receive, send: Send, app: ASGIApp, gateway: Gateway
    ) -> None:
        """A claim that arrived while `gateway` was busy: refused with the handler's 429
        if it is bare, else passed on to `app` with its body (module doc)."""
        message = await receive()
        bare = (
            message["type"] == "http.request"
            and not message.get("more_body", False)
            and self._bare(scope, message.get("body", b""), gateway)
        )
        if bare:
            await self._refuse_busy(scope, gateway)(scope, receive, send)
            return
        await app(scope, _replaying(message, receive), send)

    @staticmethod
    def _refuse_busy(scope: Scope, gateway: Gateway) -> ConstantResponse:
        """The handler's 429 for a bare claim, counted; its connection is held."""
        refusal, answer = busy_refusal(gateway.settings.max_active_requests)
        scope[HOLD_READING] = float(refusal.retry_after_seconds)
        gateway.shed_busy()
        return answer

    @staticmethod
    def _bare(scope: Scope, raw: bytes, gateway: Gateway) -> bool:
        """Whether the claim, whose whole body is `raw`, neither waits nor carries
        acknowledgements, judged as the handler judges it; False for anything the
        handler would answer otherwise (an invalid runtime id or body)."""
        settings = gateway.settings
        if len(raw) > settings.max_body_bytes:
            return False
        try:
            decode.check_runtime_id(scope["path"].split("/")[3])
            body = decode.decode_body(raw, settings.max_json_depth)
            if "complete" in body or "fail" in body:
                return False
            req = requests.parse_claim(
                body, settings.max_wait_seconds, settings.default_lease_seconds
            )
        except GatewayError:
            return False
        return not req.wait_seconds


def _replaying(first: Message, receive: Receive) -> Receive:
    """`receive`, with `first` (already read) given first."""
    pending: list[Message] = [first]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
