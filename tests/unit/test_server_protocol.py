"""The gateway's HTTP protocol on a keep-alive connection, driven in this process
through a transport of the test's own: what it makes per request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from bench.infra import MemoryTransport
from gateway.flag import Flag
from gateway.http.io import HOLD_READING, constant_response
from gateway.http.server import GatewayHttpProtocol, _ClosingSend
from gateway.http.startup import StartupGate
from tests.support.asgi import gateway_protocol


class App:
    """Answers 200 once the body is read; keeps the send each request was handed."""

    def __init__(self) -> None:
        self.sends: list[Any] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.sends.append(send)
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


REQUEST = b"POST /x HTTP/1.1\r\nHost: h\r\ncontent-length: 2\r\n\r\n{}"


async def test_a_keep_alive_connection_keeps_one_read_timer_and_sends_unwrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 requests, each whole in one read: one read timer and one keep-alive timer (not
    one per request), one write per answer (uvicorn writes its head and its body
    apart), and each answer sent through uvicorn's send as it is, since no body is
    still arriving when the app starts; a request whose body is still on its way
    gets the send that closes the connection. The open start-up gate is not called."""
    app = App()
    gate = StartupGate(app)
    gate.open()
    config = Config(gate, interface="asgi3", lifespan="off", log_config=None, proxy_headers=False)
    config.load()
    monkeypatch.setattr(StartupGate, "__call__", lambda *a: pytest.fail("the gate was called"))
    state = ServerState()
    protocol = GatewayHttpProtocol(config, state, {})
    loop = asyncio.get_running_loop()
    timers: dict[str, int] = {}
    call_later, call_at = loop.call_later, loop.call_at

    def counting(delay: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        name = getattr(callback, "__name__", "")
        timers[name] = timers.get(name, 0) + 1
        return call_later(delay, callback, *args, **kw)

    def counting_at(when: float, callback: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        # asyncio's call_later calls call_at too: only the keep-alive's own are counted.
        if getattr(callback, "__name__", "") == "_due":
            timers["_due"] = timers.get("_due", 0) + 1
        return call_at(when, callback, *args, **kw)

    monkeypatch.setattr(loop, "call_later", counting)
    monkeypatch.setattr(loop, "call_at", counting_at)
    transport = MemoryTransport()
    protocol.connection_made(transport)
    for _ in range(20):
        protocol.data_received(REQUEST)
        for task in list(state.tasks):
            await task
    await asyncio.sleep(0)  # the end of the loop's turn: what it held is written
    assert timers == {"_read_timed_out": 1, "_due": 1}, timers
    assert transport.written.count(b"HTTP/1.1 200 OK") == 20
    assert transport.writes == 20  # each answer's head and body in one write
    assert not any(isinstance(send, _ClosingSend) for send in app.sends)
    idle = protocol.keep_alive
    assert protocol in idle._idle  # answered, nothing queued: idle
    protocol.data_received(REQUEST[:-2])  # the head; its body comes later
    await asyncio.sleep(0)
    assert protocol not in idle._idle  # at work: not idle
    assert isinstance(app.sends[-1], _ClosingSend)
    protocol.data_received(REQUEST[-2:])
    for task in list(state.tasks):
        await task
    assert protocol in idle._idle
    protocol.connection_lost(None)
    assert protocol not in idle._idle  # gone: nothing kept


class SlowApp:
    """Reads its body (which may come in pieces), then answers; keeps each cycle's
    receive and send."""

    def __init__(self) -> None:
        self.received: list[Any] = []
        self.answered = asyncio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            self.received.append(message)
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        self.answered.set()


async def test_the_events_uvicorn_makes_per_connection_and_request_are_flags() -> None:
    """A parked poll holds its connection's flow control and its request's cycle for
    its whole wait: their events are Flags (gateway/flag.py), and they still work. The
    body's second piece wakes the app waiting on its receive; an answer sent while the
    transport is paused waits until it resumes."""
    app = SlowApp()
    gate = StartupGate(app)
    gate.open()
    config = Config(gate, interface="asgi3", lifespan="off", log_config=None, proxy_headers=False)
    config.load()
    state = ServerState()
    protocol = GatewayHttpProtocol(config, state, {})
    transport = MemoryTransport()
    protocol.connection_made(transport)
    assert isinstance(protocol.flow._is_writable_event, Flag)
    protocol.pause_writing()
    protocol.data_received(REQUEST[:-2])
    await asyncio.sleep(0)
    assert protocol.cycle is not None and isinstance(protocol.cycle.message_event, Flag)
    protocol.data_received(REQUEST[-2:])  # wakes the app's receive
    for _ in range(5):
        await asyncio.sleep(0)
    assert [m.get("body") for m in app.received][-1] == b"{}"
    assert not app.answered.is_set()  # its answer waits for the transport
    protocol.resume_writing()
    await asyncio.wait_for(app.answered.wait(), 1)
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    protocol.connection_lost(None)


class DoorApp(App):
    """App, with a door (`early_answer`, as GatewayApp's) that refuses every request
    read in full, or none; keeps what it was asked."""

    def __init__(self, refuse: bool) -> None:
        super().__init__()
        self.refuse = refuse
        self.asked: list[tuple[str, bytes]] = []
        self.refusal = constant_response(503, b"busy\n", "text/plain", {"Retry-After": "1"})

    def early_answer(self, scope: Any, body: bytes) -> Any:
        self.asked.append((scope["path"], body))
        if not self.refuse:
            return None
        scope[HOLD_READING] = 1.0
        return self.refusal


def door_protocol(app: DoorApp) -> tuple[GatewayHttpProtocol, ServerState, MemoryTransport]:
    protocol, state = gateway_protocol(app)
    transport = MemoryTransport()
    protocol.connection_made(transport)
    return protocol, state, transport


async def test_a_request_the_door_refuses_is_answered_without_a_task() -> None:
    """A request whose head and body arrive in one read, and which the app's door
    refuses, is answered from the read itself: the refusal in one write, no task made,
    the app never called, nothing left counted at work, and the connection held for
    the Retry-After (what comes meanwhile is kept, not parsed)."""
    app = DoorApp(refuse=True)
    protocol, state, transport = door_protocol(app)
    at_work = protocol.in_flight.requests
    protocol.data_received(REQUEST)
    assert app.asked == [("/x", b"{}")]
    assert state.tasks == set() and app.sends == []
    await asyncio.sleep(0)  # the end of the loop's turn: what it held is written
    assert transport.writes == 1 and transport.written.startswith(b"HTTP/1.1 503")
    assert transport.written.endswith(b"\r\n\r\nbusy\n")
    assert protocol.in_flight.requests == at_work
    assert state.total_requests == 1
    protocol.data_received(REQUEST)  # sent again at once: held, not parsed
    await asyncio.sleep(0)
    assert len(app.asked) == 1 and transport.writes == 1 and state.tasks == set()
    protocol.connection_lost(None)


async def test_a_request_the_door_lets_in_or_whose_body_is_late_goes_to_the_app() -> None:
    """The door is asked only of a request read in full; one it lets in, or one whose
    body is still on its way after the read, is started as uvicorn starts it, in the
    same turn of the loop."""
    app = DoorApp(refuse=False)
    protocol, state, transport = door_protocol(app)
    protocol.data_received(REQUEST)
    assert app.asked == [("/x", b"{}")] and len(state.tasks) == 1
    for task in list(state.tasks):
        await task
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    protocol.connection_lost(None)

    app = DoorApp(refuse=True)
    protocol, state, transport = door_protocol(app)
    protocol.data_received(REQUEST[:-2])  # the head; its body comes later
    assert app.asked == [] and len(state.tasks) == 1
    protocol.data_received(REQUEST[-2:])
    for task in list(state.tasks):
        await task
    assert app.asked == [] and transport.written.startswith(b"HTTP/1.1 200 OK")
    protocol.connection_lost(None)


async def test_a_door_that_fails_lets_the_request_through_to_the_app(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A defect in the early check (it raises) is logged, and the request goes to the
    app, which answers it (and would answer 500 for its own error), rather than the
    read failing with the request counted at work until the connection goes."""
    app = DoorApp(refuse=False)

    def broken(scope: Any, body: bytes) -> Any:
        raise RuntimeError("a defect")

    app.early_answer = broken  # type: ignore[method-assign]
    protocol, state, transport = door_protocol(app)
    at_work = protocol.in_flight.requests
    protocol.data_received(REQUEST)
    assert len(state.tasks) == 1
    for task in list(state.tasks):
        await task
    await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    assert protocol.in_flight.requests == at_work
    assert "the door's early check failed" in caplog.text
    protocol.connection_lost(None)
