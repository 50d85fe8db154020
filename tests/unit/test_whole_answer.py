"""Answers written whole (gateway/http/whole.py): an empty claim's, and the refusals of
a flood (a bare claim while busy, the door's work while the database's line is full).
The same bytes as uvicorn's send writes from the two ASGI messages, and the exchange
left as it leaves it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response

from bench.infra import MemoryTransport
from gateway.errors import DatabaseBusy, GatewayError
from gateway.http import whole
from gateway.http.access import _SendWithId
from gateway.http.io import constant_problem, empty_tasks_response, problem_response
from gateway.in_flight import claim_refusal
from tests.support.asgi import gateway_protocol

WRITE_WHOLE = whole.write_whole  # the real one, which the tests' spies call
DATE = [(b"date", b"Sun, 29 Nov 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
CLAIM = b"POST /v1/runtimes/rt/claim HTTP/1.1\r\nHost: h\r\ncontent-length: 2\r\n\r\n{}"


class App:
    """Answers each request with `answer` (the empty claim answer by default) through
    the request log's send: whole when `whole`, else as Starlette's Response sends any
    answer."""

    def __init__(self, whole: bool, answer: Response | None = None) -> None:
        self.whole = whole
        self.answer = answer or empty_tasks_response()
        self.statuses: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        with_id = _SendWithId(send, "req-1")
        if self.whole:
            await self.answer(scope, receive, with_id)
        else:
            await Response.__call__(self.answer, scope, receive, with_id)
        self.statuses.append(with_id.status)


class DoorApp:
    """Answers each request with `answer` through the server's own send, as the door
    (gateway/http/shedding.py) answers before the request log."""

    def __init__(self, answer: Response) -> None:
        self.answer = answer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await self.answer(scope, receive, send)


async def _serve(app: Any, data: bytes, closing: bool = False) -> tuple[bytes, MemoryTransport]:
    protocol, state = gateway_protocol(app)
    state.default_headers = list(DATE)
    transport = MemoryTransport()
    closed: list[bool] = []
    transport.close = lambda: closed.append(True)  # type: ignore[method-assign]
    protocol.connection_made(transport)
    protocol.data_received(data)
    for _ in range(5):  # the request, any pipelined behind it, and the held writes
        for task in list(state.tasks):
            await task
        await asyncio.sleep(0)
    assert bool(closed) is closing
    return bytes(transport.written), transport


@pytest.mark.parametrize(
    "data",
    [
        CLAIM,
        CLAIM.replace(b"Host: h\r\n", b"Host: h\r\nConnection: close\r\n"),
        CLAIM.replace(b"HTTP/1.1", b"HTTP/1.0"),
        CLAIM + CLAIM,  # pipelined: the second is served once the first is answered
    ],
    ids=["keep-alive", "connection-close", "http-1.0", "pipelined"],
)
async def test_the_whole_answer_is_the_bytes_uvicorn_writes(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    closing = b"close" in data or b"HTTP/1.0" in data
    usual_app, whole_app = App(whole=False), App(whole=True)
    usual, _ = await _serve(usual_app, data, closing)
    written_whole: list[bool] = []

    def spy(*args: Any) -> bool:
        written_whole.append(WRITE_WHOLE(*args))
        return written_whole[-1]

    monkeypatch.setattr(whole, "write_whole", spy)
    written, transport = await _serve(whole_app, data, closing)
    assert written == usual
    answers = data.count(b"POST")
    assert written.count(b'{"tasks":[]}') == answers
    assert b"x-request-id: req-1\r\n" in written and written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert whole_app.statuses == usual_app.statuses == [200] * answers
    assert transport.writes == answers  # one write an answer, as before
    assert written_whole == [True] * answers


REFUSALS = [
    claim_refusal(128),  # a bare claim while the instance is busy: 429
    DatabaseBusy("the database queue is longer than 200 ms of work"),  # the door's: 503
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=["busy-claim", "database-busy"])
@pytest.mark.parametrize("door", [False, True], ids=["request-log", "door"])
async def test_a_refusal_made_once_is_the_answer_made_per_request(
    refusal: GatewayError, door: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal encoded once, and written whole, is the problem answer the gateway
    built per request before: status, Retry-After, body, in the same bytes."""
    per_request = problem_response(refusal)
    usual_app: Any = DoorApp(per_request) if door else App(False, per_request)
    usual, _ = await _serve(usual_app, CLAIM + CLAIM)
    written_whole: list[bool] = []

    def spy(*args: Any) -> bool:
        written_whole.append(WRITE_WHOLE(*args))
        return written_whole[-1]

    monkeypatch.setattr(whole, "write_whole", spy)
    answer = constant_problem(refusal)
    whole_app: Any = DoorApp(answer) if door else App(True, answer)
    written, transport = await _serve(whole_app, CLAIM + CLAIM)
    assert written == usual
    status = b"429 Too Many" if refusal.code == "overloaded" else b"503 Service Unavailable"
    assert written.startswith(b"HTTP/1.1 " + status)
    assert written.count(b"retry-after: 1\r\n") == 2
    assert written.count(refusal.code.encode()) == 2
    assert (b"x-request-id: req-1\r\n" in written) is not door
    assert transport.writes == 2 and written_whole == [True, True]


async def test_any_other_send_takes_the_usual_path() -> None:
    """A send that is not the server's own (a middleware's wrapper) gets the two
    messages; nothing is written whole."""
    messages: list[Any] = []

    async def wrapper(message: Any) -> None:
        messages.append(message)

    with_id = _SendWithId(wrapper, "req-2")
    await empty_tasks_response()({"type": "http", "method": "POST"}, None, with_id)  # type: ignore[arg-type]
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert (b"x-request-id", b"req-2") in messages[0]["headers"]
    assert with_id.status == 200
    assert whole.exchange_of(wrapper) is None


async def test_server_headers_that_uvicorn_would_refuse_are_left_to_it() -> None:
    assert whole._server_head_of([(b"date", b"x")]) == b"date: x\r\n"
    assert whole._server_head_of([(b"x-bad", b"a\r\nb")]) is None
