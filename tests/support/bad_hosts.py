"""Loopback servers that stand where a Postgres host should, and fail as a dead or
broken one does, for URLs that name several hosts:

- `SilentHost` accepts the TCP connection and never answers: a machine that crashed
  behind a load balancer, or a network path that drops packets after the handshake. A
  client notices it only by its own timeout.
- `ErrorHost` speaks enough of the Postgres protocol to refuse a connection with an
  ErrorResponse, as a server that is starting up, is out of connections, or is broken
  (an old primary rejoining) does.

Both listen on a free port of 127.0.0.1 and close every connection they hold on
`close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from urllib.parse import urlsplit, urlunsplit

from tests.support.net import free_port

SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104


def with_hosts_first(url: str, *ports: int) -> str:
    """`url` naming 127.0.0.1:port for each of `ports` before its own host, as a
    multi-host URL does, asking for the primary as the gateway requires of one
    (postgresql://user@127.0.0.1:P,127.0.0.1:5432/db?target_session_attrs=read-write)."""
    parts = urlsplit(url)
    auth, _, hostspec = parts.netloc.rpartition("@")
    listed = ",".join([*(f"127.0.0.1:{port}" for port in ports), hostspec])
    query = parts.query
    if "target_session_attrs" not in query:
        query = "&".join(q for q in (query, "target_session_attrs=read-write") if q)
    return urlunsplit(parts._replace(netloc=f"{auth}@{listed}" if auth else listed, query=query))


class _Listener:
    def __init__(self) -> None:
        self.port = free_port()
        self.connections = 0  # how many clients came
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            await self.serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> _Listener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SilentHost(_Listener):
    """Accepts, reads whatever comes, and never writes a byte."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass


class ErrorHost(_Listener):
    """Answers every connection's startup message with a FATAL ErrorResponse of
    `sqlstate` and `message`, then closes it. An SSL or GSS encryption request first is
    declined ('N'), as by a server without TLS."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__()
        self.sqlstate = sqlstate
        self.message = message

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            (length,) = struct.unpack("!i", await reader.readexactly(4))
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            if code in (SSL_REQUEST_CODE, GSSENC_REQUEST_CODE):
                writer.write(b"N")
                await writer.drain()
                continue
            break  # the startup message: refuse it
        fields = b"".join(
            kind + text.encode() + b"\0"
            for kind, text in (
                (b"S", "FATAL"),
                (b"V", "FATAL"),
                (b"C", self.sqlstate),
                (b"M", self.message),
            )
        )
        payload = fields + b"\0"
        writer.write(b"E" + struct.pack("!i", len(payload) + 4) + payload)
        with contextlib.suppress(OSError):
            await writer.drain()


class SlowHost(_Listener):
    """A working Postgres (`target`, host and port) whose first answer to a new
    connection comes `delay_seconds` late: a slow login (TLS across regions, a loaded
    pooler). Then it passes bytes both ways."""

    def __init__(self, target: tuple[str, int], delay_seconds: float) -> None:
        super().__init__()
        self.target = target
        self.delay_seconds = delay_seconds

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        first = True

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, late: bool) -> None:
            nonlocal first
            while data := await src.read(65536):
                if late and first:
                    first = False
                    await asyncio.sleep(self.delay_seconds)
                dst.write(data)
                await dst.drain()
            dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))
        finally:
            up_writer.close()
