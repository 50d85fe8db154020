"""Accepting connections (gateway/http/acceptor.py), on real sockets and both event
loops the gateway may run on: a crowd that connects at once is taken in a few turns of
the loop, a closed acceptor takes no more while its connections go on, and running out
of descriptors pauses accepting with one warning instead of a busy loop. The server
serves its sockets through acceptors."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest
import uvicorn
import uvloop

from gateway.http import acceptor as acceptor_module
from gateway.http.acceptor import ACCEPT_BATCH, Acceptor
from gateway.http.startup import DrainingServer

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}
CROWD = ACCEPT_BATCH + 100  # two batches; client and server ends stay under 1,024 files
# Turns of the loop the crowd may take: a few per batch of ACCEPT_BATCH (the accepts,
# then each connection's start). uvloop's own server accepts one connection per turn.
TURNS = 20


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(main())


class Echo(asyncio.Protocol):
    """Counts itself in `made` once connected, and echoes what it reads."""

    def __init__(self, made: list[Echo]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.made.append(self)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[attr-defined]


def listening(backlog: int = 2048, kind: type[socket.socket] = socket.socket) -> socket.socket:
    sock = kind(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def connect_crowd(address: tuple[str, int], count: int) -> list[socket.socket]:
    """`count` connections, made by the kernel before any is accepted (they wait in
    the listen queue)."""
    crowd = []
    for _ in range(count):
        client = socket.create_connection(address)
        crowd.append(client)
    return crowd


@contextlib.asynccontextmanager
async def accepting(sock: socket.socket, made: list[Echo]) -> AsyncIterator[Acceptor]:
    """An Acceptor of `sock` making Echo protocols into `made`; afterwards it is closed,
    its connections and `sock` too, whatever the test did (a loop closed with them
    open can wait for ever)."""
    acceptor = Acceptor(sock, lambda: Echo(made), asyncio.get_running_loop())
    try:
        yield acceptor
    finally:
        acceptor.close()
        await acceptor.wait_closed()
        for protocol in made:
            protocol.transport.close()
        sock.close()


async def turns_until(done: Callable[[], bool], most: int) -> int:
    """How many turns of the loop pass until `done()`, giving up after `most`."""
    for turn in range(1, most + 1):
        await asyncio.sleep(0)
        if done():
            return turn
    return most + 1


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_crowd_that_connects_at_once_is_accepted_in_a_few_turns(loop_name: str) -> None:
    async def main() -> None:
        sock, made = listening(), []
        crowd = connect_crowd(sock.getsockname(), CROWD)
        try:
            async with accepting(sock, made) as acceptor:
                acceptor.start()
                turns = await turns_until(lambda: len(made) == CROWD, TURNS)
                assert turns <= TURNS, f"{len(made)} of {CROWD} accepted after {TURNS} turns"
                for protocol in made:
                    conn = protocol.transport.get_extra_info("socket")
                    assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            for client in crowd:
                client.close()

    run_on(loop_name, main)


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_closed_acceptor_takes_no_more_and_its_connections_go_on(loop_name: str) -> None:
    async def main() -> None:
        sock, made = listening(), []
        late: list[socket.socket] = []
        async with accepting(sock, made) as acceptor:
            acceptor.start()
            reader, writer = await asyncio.open_connection(*sock.getsockname())
            try:
                assert await turns_until(lambda: len(made) == 1, TURNS) <= TURNS
                acceptor.close()
                acceptor.close()  # idempotent
                await acceptor.wait_closed()
                # Made by the kernel, never accepted: it waits in the listen queue.
                late = connect_crowd(sock.getsockname(), 1)
                await turns_until(lambda: len(made) > 1, TURNS)
                assert len(made) == 1
                writer.write(b"still here")
                assert await reader.readexactly(10) == b"still here"
            finally:
                writer.close()
                for client in late:
                    client.close()

    run_on(loop_name, main)


class FlakySocket(socket.socket):
    """A listening socket whose next accepts fail with the errors queued in `errors`."""

    errors: list[OSError]

    def accept(self) -> tuple[socket.socket, Any]:
        if getattr(self, "errors", None):
            raise self.errors.pop(0)
        return super().accept()


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_running_out_of_descriptors_pauses_accepting_with_one_warning(
    loop_name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acceptor_module, "ACCEPT_RETRY_SECONDS", 0.05)

    async def main() -> None:
        sock, made = listening(kind=FlakySocket), []
        assert isinstance(sock, FlakySocket)
        sock.errors = [OSError(errno.EMFILE, "Too many open files") for _ in range(2)]
        client = connect_crowd(sock.getsockname(), 1)
        try:
            async with accepting(sock, made) as acceptor:
                loop = asyncio.get_running_loop()
                started = loop.time()
                acceptor.start()
                async with asyncio.timeout(5):
                    while not made:
                        await asyncio.sleep(0.01)
                # Paused after each failure, not tried again at every turn: two
                # failures, two pauses, and then the connection is accepted.
                assert loop.time() - started >= 2 * 0.05
                assert sock.errors == []
        finally:
            client[0].close()

    with caplog.at_level(logging.WARNING, logger="gateway.server"):
        run_on(loop_name, main)
    warnings = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "Too many open files" in warnings[0] and "open-files limit" in warnings[0]


@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_a_client_that_left_before_its_accept_does_not_stop_the_rest(loop_name: str) -> None:
    async def main() -> None:
        sock, made = listening(kind=FlakySocket), []
        assert isinstance(sock, FlakySocket)
        sock.errors = [
            ConnectionAbortedError(errno.ECONNABORTED, "Software caused abort"),
            OSError(errno.EPROTO, "Protocol error"),
        ]
        crowd = connect_crowd(sock.getsockname(), 3)
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        try:
            async with accepting(sock, made) as acceptor:
                acceptor.start()
                assert await turns_until(lambda: len(made) == 3, TURNS) <= TURNS
                assert errors == []  # taken as the loss of one connection, not an error
        finally:
            for client in crowd:
                client.close()

    run_on(loop_name, main)


def test_the_server_serves_its_sockets_through_acceptors_and_closes_them() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> None:
        sock = listening()
        address = sock.getsockname()
        config = uvicorn.Config(app, interface="asgi3", lifespan="off", log_config=None)
        server = DrainingServer(config, on_exit_signal=lambda: None)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            async with asyncio.timeout(5):
                await server.listening.wait()
            assert [type(s) for s in server.servers] == [Acceptor]
            reader, writer = await asyncio.open_connection(*address)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            writer.close()
        finally:
            server.should_exit = True
            async with asyncio.timeout(5):
                await serving
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*address)

    run_on("uvloop", main)


def test_a_connection_accepted_just_before_shutdown_is_shut_down_with_the_rest() -> None:
    # uvicorn asks the connections it knows of to shut down right after it stops
    # accepting; one accepted in that same turn had no protocol yet, and the shutdown
    # waited for it to go idle: the keep-alive timeout (here 5 s).
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise AssertionError("no request is sent")

    async def main() -> None:
        sock = listening()
        config = uvicorn.Config(
            app, interface="asgi3", lifespan="off", log_config=None, timeout_keep_alive=5
        )
        config.load()
        server = DrainingServer(config, on_exit_signal=lambda: None)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        (acceptor,) = server.servers
        assert isinstance(acceptor, Acceptor)
        client = connect_crowd(sock.getsockname(), 1)[0]
        try:
            acceptor._accept()  # accepted in this turn, handed over in a later one
            async with asyncio.timeout(2.5):
                await server.shutdown(sockets=[sock])
            assert not server.server_state.connections
            assert client.recv(1) == b""  # closed by the server
        finally:
            client.close()

    run_on("uvloop", main)
