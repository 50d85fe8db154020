"""The door (gateway/http/shedding.py): which requests it refuses while the database's
line is full (work: enqueues, signed webhooks, reads; never a claim, a report on a
claimed task, a control, a probe or the metrics), and its one answer, the problem the
line itself would answer; and which claims it refuses while the instance is busy (a
bare claim, judged as the claim handler judges it), every other going on with its
body."""

from __future__ import annotations

import types
from typing import Any

import orjson
import pytest

from gateway.admission import Admission
from gateway.http.app import GatewayApp, create_app
from gateway.http.io import DOOR_PASSED, HOLD_READING
from gateway.http.routes import ENDPOINTS
from gateway.http.shedding import Shedding
from gateway.metrics import Metrics
from gateway.settings import Settings


def door() -> Shedding:
    return Shedding(ENDPOINTS, Admission(2, 250.0, 5000.0, Metrics()).refusal())


def scope(method: str, path: str) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": []}


def test_work_is_refused_at_the_door_and_nothing_else_is() -> None:
    shedding = door()
    refused = [
        ("POST", "/v1/runtimes/rt-1/tasks"),
        ("POST", "/v1/runtimes/rt-1/tasks:batch"),
        ("POST", "/v1/runtimes/rt-1/webhooks"),
        ("GET", "/v1/runtimes/rt-1/tasks"),
        ("GET", "/v1/runtimes/rt-1/stats"),
        ("GET", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000"),
    ]
    let_in = [
        ("POST", "/v1/runtimes/rt-1/claim"),
        ("POST", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000/complete"),
        ("POST", "/v1/tasks:complete"),
        ("POST", "/v1/tasks/0198f3a0-0000-7000-8000-000000000000/heartbeat"),
        ("POST", "/v1/runtimes/rt-1:pause"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/console"),
        ("DELETE", "/v1/runtimes/rt-1/tasks"),
    ]
    assert [r for r in refused if not shedding.refuses(scope(*r))] == []
    assert [r for r in let_in if shedding.refuses(scope(*r))] == []


async def test_the_answer_is_the_lines_own_refusal() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    shedding = door()
    request = scope("POST", "/v1/runtimes/rt-1/tasks")
    assert shedding.line_refusal(request, gateway_at_the_door(False, False)) is None
    assert HOLD_READING not in request  # the line has room: nothing refused, nothing held
    crowded = gateway_at_the_door(True, False)
    answer = shedding.line_refusal(request, crowded)
    assert answer is not None and crowded.line_shed == 1
    await answer(request, receive, send)
    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 503 and headers[b"retry-after"] == b"1"
    assert headers[b"content-type"] == b"application/problem+json"
    problem = orjson.loads(body["body"])
    assert problem["code"] == "database_busy"
    assert "GATEWAY_DB_QUEUE_BUDGET_MS" in problem["detail"]
    assert request[HOLD_READING] == 1.0  # the connection is read again a second later


def busy_gateway() -> types.SimpleNamespace:
    """What the door asks of a gateway for a claim: its settings, and `shed_busy`."""
    settings = types.SimpleNamespace(
        max_active_requests=128,
        max_body_bytes=1024,
        max_json_depth=32,
        max_wait_seconds=60.0,
        default_lease_seconds=30,
    )
    gw = types.SimpleNamespace(settings=settings, shed=0)
    gw.shed_busy = lambda: setattr(gw, "shed", gw.shed + 1)
    return gw


def test_a_claim_is_told_apart_by_method_and_path() -> None:
    shedding = door()
    assert shedding.is_claim(scope("POST", "/v1/runtimes/rt-1/claim"))
    assert not shedding.is_claim(scope("GET", "/v1/runtimes/rt-1/claim"))
    assert not shedding.is_claim(scope("POST", "/v1/runtimes/rt-1/claims"))
    assert not shedding.is_claim(scope("POST", "/v1/runtimes/rt-1/tasks"))


async def claim_at_the_door(
    body: bytes, path: str = "/v1/runtimes/rt-1/claim", more_body: bool = False
) -> tuple[types.SimpleNamespace, list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """A claim sent to the door of a busy gateway: the gateway, what was answered, and
    the messages the app let in read (none if it was not let in)."""
    gw = busy_gateway()
    sent: list[dict[str, Any]] = []
    let_in: list[list[dict[str, Any]]] = []
    rest = {"type": "http.request", "body": b" ", "more_body": False}
    queued = [{"type": "http.request", "body": body, "more_body": more_body}, rest]

    async def receive() -> dict[str, Any]:
        return queued.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        read = [await receive()]
        if read[0].get("more_body"):
            read.append(await receive())
        let_in.append(read)

    gw.scope = scope("POST", path)
    await door().claim(gw.scope, receive, send, app, gw)  # type: ignore[arg-type]
    return gw, sent, let_in


async def test_a_bare_claim_at_a_busy_door_is_refused_with_the_handlers_answer() -> None:
    for body in (b'{"worker_id": "w"}', b'{"worker_id": "w", "wait_seconds": 0}', b""):
        gw, sent, let_in = await claim_at_the_door(body)
        if body == b"":  # no worker_id: the handler answers 422, so it goes on
            assert (sent, len(let_in), gw.shed, HOLD_READING in gw.scope) == ([], 1, 0, False)
            continue
        assert let_in == [] and gw.shed == 1, body
        start, answer = sent
        assert start["status"] == 429 and dict(start["headers"])[b"retry-after"] == b"1"
        problem = orjson.loads(answer["body"])
        assert problem["code"] == "overloaded"
        assert "more than 128 requests (GATEWAY_MAX_ACTIVE_REQUESTS)" in problem["detail"]
        assert gw.scope[HOLD_READING] == 1.0  # read again a second later


@pytest.mark.parametrize(
    ("body", "path", "why"),
    [
        (b'{"worker_id": "w", "wait_seconds": 5}', None, "it waits"),
        (b'{"worker_id": "w", "complete": []}', None, "it carries completes"),
        (b'{"worker_id": "w", "fail": []}', None, "it carries fails"),
        (b'{"worker_id": "w", "wait_seconds": -1}', None, "invalid: the handler answers 422"),
        (b'{"worker_id": ', None, "not JSON"),
        (b"[]", None, "not an object"),
        (b'{"worker_id": "w"}', "/v1/runtimes/bad%20id/claim", "an invalid runtime id"),
        (b'{"worker_id": "w", "pad": "' + b"x" * 2000 + b'"}', None, "over the body limit"),
    ],
)
async def test_any_other_claim_goes_on_with_its_body(
    body: bytes, path: str | None, why: str
) -> None:
    gw, sent, let_in = await claim_at_the_door(body, path or "/v1/runtimes/rt-1/claim")
    assert (sent, gw.shed) == ([], 0), why
    assert let_in == [[{"type": "http.request", "body": body, "more_body": False}]], why


async def test_a_claim_whose_body_is_in_several_reads_goes_on_with_all_of_it() -> None:
    gw, sent, let_in = await claim_at_the_door(b'{"worker_id": "w"', more_body=True)
    assert (sent, gw.shed) == ([], 0)
    (read,) = let_in
    assert [m["body"] for m in read] == [b'{"worker_id": "w"', b" "]


def gateway_at_the_door(crowded: bool, busy: bool) -> types.SimpleNamespace:
    """busy_gateway, with the database's line full or not (`store.crowded`, counting
    `store.shed`) and the instance busy or not."""
    gw = busy_gateway()
    gw.line_shed = 0
    gw.store = types.SimpleNamespace(crowded=lambda: crowded)
    gw.store.shed = lambda: setattr(gw, "line_shed", gw.line_shed + 1)
    gw.busy = lambda: busy
    return gw


@pytest.mark.parametrize(
    ("crowded", "busy", "method", "path", "body", "answered"),
    [
        (True, False, "POST", "/v1/runtimes/rt-1/tasks", b"{not json", 503),
        (True, False, "GET", "/v1/runtimes/rt-1/stats", b"", 503),
        (False, False, "POST", "/v1/runtimes/rt-1/tasks", b"{}", None),
        (True, False, "POST", "/v1/runtimes/rt-1/claim", b'{"worker_id": "w"}', None),
        (False, True, "POST", "/v1/runtimes/rt-1/claim", b'{"worker_id": "w"}', 429),
        (True, True, "POST", "/v1/runtimes/rt-1/claim", b'{"worker_id": "w"}', 429),
        (
            False,
            True,
            "POST",
            "/v1/runtimes/rt-1/claim",
            b'{"worker_id": "w", "complete": []}',
            None,
        ),
        (
            False,
            True,
            "POST",
            "/v1/runtimes/rt-1/claim",
            b'{"worker_id": "w", "wait_seconds": 1}',
            None,
        ),
        (False, True, "POST", "/v1/runtimes/rt-1/tasks", b"{}", None),
        (False, False, "POST", "/v1/runtimes/rt-1/claim", b'{"worker_id": "w"}', None),
    ],
)
def test_a_request_read_in_full_is_refused_early_as_the_door_would(
    crowded: bool, busy: bool, method: str, path: str, body: bytes, answered: int | None
) -> None:
    """`early` (the server's check of a request read in full) refuses what `answer` and
    `claim` refuse, with the same answer, counted the same way, its connection held."""
    gw = gateway_at_the_door(crowded, busy)
    request = scope(method, path)
    answer = door().early(request, body, gw)  # type: ignore[arg-type]
    if answered is None:
        assert (answer, gw.line_shed, gw.shed, HOLD_READING in request) == (None, 0, 0, False)
        assert request[DOOR_PASSED]  # judged: the app's door does not judge it again
        return
    assert DOOR_PASSED not in request
    assert answer is not None and answer.status_code == answered
    code = orjson.loads(answer.content)["code"]
    assert code == {503: "database_busy", 429: "overloaded"}[answered]
    assert (gw.line_shed, gw.shed) == ((1, 0) if answered == 503 else (0, 1))
    assert request[HOLD_READING] == 1.0


async def test_the_app_does_not_judge_again_what_the_door_let_in() -> None:
    """A request that the server's early check let in (marked DOOR_PASSED) goes straight
    to the app's stack, though the line is full now; an unmarked one is judged, and
    refused, by the app's own door."""
    app = create_app(
        Settings.from_env(
            {
                "DATABASE_URL": "postgresql://unused@127.0.0.1:1/unused",
                "REDIS_URL": "redis://127.0.0.1:1/0",
                "GATEWAY_ADMIN_TOKEN": "t" * 32,
            }
        )
    )
    assert isinstance(app, GatewayApp) and app.gateway is not None
    app.gateway.store.crowded = lambda: True  # type: ignore[method-assign]
    app.gateway.store.shed = lambda: None  # type: ignore[method-assign]
    reached: list[str] = []
    sent: list[dict[str, Any]] = []

    async def stack(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    app.middleware_stack = stack
    passed = scope("POST", "/v1/runtimes/rt-1/tasks")
    passed[DOOR_PASSED] = True
    await app(passed, receive, send)
    assert (reached, sent) == (["/v1/runtimes/rt-1/tasks"], [])
    await app(scope("POST", "/v1/runtimes/rt-1/tasks"), receive, send)
    assert len(reached) == 1 and sent[0]["status"] == 503
