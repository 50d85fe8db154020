"""An empty claim's answer written whole (gateway/http/whole.py): the same bytes as
uvicorn's send writes from the two ASGI messages, and the exchange left as it leaves it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.http import access, whole
from gateway.http.access import _SendWithId
from gateway.http.io import empty_tasks_response
from gateway.http.server import GatewayHttpProtocol
from gateway.http.startup import StartupGate
from tests.support.asgi import Transport

DATE = [(b"date", b"Sun, 29 Nov 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
CLAIM = b"POST /v1/runtimes/rt/claim HTTP/1.1\r\nHost: h\r\ncontent-length: 2\r\n\r\n{}"


class App:
    """Answers each request with the empty claim answer through the request log's
    send: whole when `whole`, else as Starlette's Response sends any answer."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole
        self.statuses: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        with_id = _SendWithId(send, "req-1")
        answer = empty_tasks_response()
        if self.whole:
            await answer(scope, receive, with_id)
        else:
            await Response.__call__(answer, scope, receive, with_id)
        self.statuses.append(with_id.status)


async def _serve(app: App, data: bytes, closing: bool = False) -> tuple[bytes, Transport]:
    gate = StartupGate(app)
    gate.open()
    config = Config(
        gate,
        interface="asgi3",
        lifespan="off",
        log_config=None,
        proxy_headers=False,
        access_log=False,  # as the gateway runs uvicorn: its own request log instead
    )
    config.load()
    state = ServerState()
    state.default_headers = list(DATE)
    protocol = GatewayHttpProtocol(config, state, {})
    transport = Transport()
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
        written_whole.append(whole.write_whole(*args))
        return written_whole[-1]

    monkeypatch.setattr(access, "write_whole", spy)
    written, transport = await _serve(whole_app, data, closing)
    assert written == usual
    answers = data.count(b"POST")
    assert written.count(b'{"tasks":[]}') == answers
    assert b"x-request-id: req-1\r\n" in written and written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert whole_app.statuses == usual_app.statuses == [200] * answers
    assert transport.writes == answers  # one write an answer, as before
    assert written_whole == [True] * answers


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
