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
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterable

from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import Receive, Scope, Send

from ..errors import DatabaseBusy
from .io import HOLD_READING, constant_problem
from .routes import Endpoint


class Shedding:
    """The door's check and its answer, for one app."""

    def __init__(self, endpoints: Iterable[Endpoint], refusal: DatabaseBusy) -> None:
        self._paths: dict[str, list[re.Pattern[str]]] = {}
        for endpoint in endpoints:
            if endpoint.refused_early:
                regex, _, _ = compile_path(endpoint.path)
                self._paths.setdefault(endpoint.method, []).append(regex)
        self._answer: Response = constant_problem(refusal)
        self._hold_seconds = float(refusal.retry_after_seconds)

    def refuses(self, scope: Scope) -> bool:
        """Whether the request is work that the door refuses (asked only while the
        database's line is full)."""
        regexes = self._paths.get(scope["method"])
        return regexes is not None and any(r.match(scope["path"]) for r in regexes)

    def answer(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The refusal, the same bytes for every request; its connection is read again
        after its Retry-After."""
        scope[HOLD_READING] = self._hold_seconds
        return self._answer(scope, receive, send)
