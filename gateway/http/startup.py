"""Starting to serve: the order of a gateway's start (the checks, then the gateway
opened by its app's lifespan, then the sockets served) and the app served meanwhile.

While a start waits for Postgres (GATEWAY_STARTUP_RETRY_SECONDS), the sockets are
served already: `/healthz` answers 200 (the process is alive), `/readyz` 503 saying
what it waits for, every other request 503. Once the gateway's own app is open, every
request goes to it. The server itself is uvicorn's, made to drain parked polls at
SIGTERM (`DrainingServer`, I10).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import StoreUnavailable
from .acceptor import Acceptor
from .io import json_response, problem_response

T = TypeVar("T")


HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """uvicorn waits for open requests before the lifespan shutdown runs, so parked
    polls would hold up SIGTERM for their whole wait: drain them at the signal (I10)."""

    def __init__(self, config: uvicorn.Config, on_exit_signal: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit_signal = on_exit_signal
        # Set once the sockets accept connections (uvicorn's startup has ended).
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None or self.config.ssl is not None:
            await super().startup(sockets=sockets)  # TLS: the loop's server does the handshakes
        else:
            # uvicorn's startup with no sockets makes no server of the loop's; each
            # socket gets an Acceptor instead, which takes many connections per turn
            # of the loop where uvloop's server takes one (acceptor.py).
            await super().startup(sockets=[])
            loop = asyncio.get_running_loop()
            acceptors = [Acceptor(sock, self._new_protocol, loop) for sock in sockets]
            for acceptor in acceptors:
                acceptor.start()
            self.servers = acceptors  # type: ignore[assignment]  # uvicorn calls close() and wait_closed()
        if self.started:
            self.listening.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn asks every connection it knows of to shut down right after it stops
        # accepting. A connection accepted just before is known once its protocol is
        # made, a turn or two later: stop accepting and wait for those first, or the
        # shutdown would wait for them to go idle (up to the keep-alive timeout).
        for server in self.servers:
            if isinstance(server, Acceptor):
                server.close()
                await server.wait_closed()
        await super().shutdown(sockets=sockets)

    def _new_protocol(self) -> asyncio.Protocol:
        """The connection protocol for one accepted connection, made as uvicorn's own
        startup makes it."""
        config = self.config
        return config.http_protocol_class(  # type: ignore[call-arg]
            config=config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
            _loop=asyncio.get_running_loop(),
        )

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit_signal()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the signal once it has stopped, which would kill the process
        # before the embedded servers are stopped; handle it and return instead.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class StartupGate:
    """An ASGI app in front of the gateway's: answers for it until `open()`. What it
    waits for is asked of `waiting_for` at each request, so that the answer counts the
    time left."""

    def __init__(self, app: ASGIApp, waiting_for: Callable[[], str] = lambda: "starting") -> None:
        self._app = app
        self._open = False
        self.waiting_for = waiting_for

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        """From now on every request goes to the gateway's app."""
        self._open = True

    def app_if_open(self) -> ASGIApp | None:
        """The gateway's app once the gate is open (a connection made from then on may
        call it directly), else None."""
        return self._app if self._open else None

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        # Not a coroutine of its own once open: a parked poll would hold its frame for
        # its whole wait (as server.GatewayHttpProtocol._app).
        if self._open:
            return self._app(scope, receive, send)
        return self._answer_waiting(scope, receive, send)

    async def _answer_waiting(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013})  # try again later
            return
        if scope["type"] != "http":
            return
        why = self.waiting_for()
        path = scope["path"]
        if path == "/healthz":
            answer = json_response({"status": "ok"})
        elif path == "/readyz":
            answer = json_response({"status": "not ready", "problems": [why]}, 503)
        else:
            error = StoreUnavailable(f"the gateway is starting: {why}")
            answer = problem_response(error, {"Retry-After": "1"})
        await answer(scope, receive, send)


class _Stopped:
    """The server stopped (a signal) before what was awaited came."""


STOPPED = _Stopped()


async def _unless_stopped(awaited: Awaitable[T], serving: asyncio.Task[None]) -> T | _Stopped:
    """`awaited`'s result, or STOPPED if the server stops first (then it is cancelled).
    An error the server stopped with is raised."""
    task = asyncio.ensure_future(awaited)
    await asyncio.wait({task, serving}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    serving.result()
    return STOPPED


async def serve(
    server: DrainingServer,
    sockets: list[socket.socket],
    app: Starlette,
    gate: StartupGate,
    prepare: Callable[[], Awaitable[None]],
    listen_first: bool,
    announce: Callable[[], None],
) -> None:
    """Serve `app` (behind `gate`, the app uvicorn was configured with) on `sockets`
    until the server stops: `prepare()` first (the checks that may refuse the start, by
    raising), then the app's lifespan opens the gateway, the gate opens, and
    `announce()` says it is up. With `listen_first`, the sockets are served while
    `prepare()` runs (the gate answers meanwhile); a signal then ends the wait and the
    start, without error. The server's lifespan must be off: it is run here."""
    serving: asyncio.Task[None] | None = None
    try:
        if listen_first:
            serving = asyncio.create_task(server.serve(sockets=sockets), name="server")
            if await _unless_stopped(server.listening.wait(), serving) is STOPPED:
                return
            if await _unless_stopped(prepare(), serving) is STOPPED:
                return
        else:
            await prepare()
        async with app.router.lifespan_context(app):
            gate.open()
            if serving is None:
                serving = asyncio.create_task(server.serve(sockets=sockets), name="server")
            listening = await _unless_stopped(server.listening.wait(), serving)
            if listening is not STOPPED and not server.should_exit:  # no signal meanwhile
                announce()
            await serving
    finally:
        if serving is not None and not serving.done():
            # The start failed while the sockets were served: stop serving them.
            server.should_exit = True
            with contextlib.suppress(Exception):
                await serving


def run(server: DrainingServer, main: Coroutine[Any, Any, T]) -> T:
    """Run `main` (a `serve(...)`) to its end on the event loop uvicorn would have
    chosen for `server` (uvloop when installed)."""
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        return runner.run(main)
