"""Raw TCP connections to a gateway, for the tests of hostile connections and answers:
one connection (`Conn`), hand-written requests and the answers read off the socket, and
the settings of a gateway whose read deadline is short enough to see it cut them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson

from bench.hostile import answer_size as answer_size  # one parser, shared with the bench
from tests.support.gateways import TOKEN, Instance
from tests.support.metrics import sample

READ_TIMEOUT = 1.0
MARGIN = 2.0  # for a loaded machine; the cut itself is a timer, not a poll
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


# The options of `gateway(...)` (tests/support/gateways.py) for a gateway whose read (and
# write) deadline is READ_TIMEOUT, its janitor quiet, called through running_gateway's
# pooled session: the `gw` of the modules that cut connections.
SHORT_DEADLINE: dict[str, Any] = {
    "read_timeout_seconds": READ_TIMEOUT,
    "connection_per_request": False,
}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return orjson.loads(self.body)


class Conn:
    """One raw TCP connection to the gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, url: str) -> Conn:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self, within: float) -> Answer:
        """The next response (Content-Length bodies only, which is all the gateway sends)."""
        async with asyncio.timeout(within):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in filter(None, lines):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return Answer(int(status_line.split()[1]), headers, body)

    async def closed_by_server(self, within: float) -> bytes:
        """Everything the server still sends until it closes its side."""
        async with asyncio.timeout(within):
            return await self.reader.read()

    async def still_open(self, quiet_for: float = 0.2) -> bool:
        try:
            async with asyncio.timeout(quiet_for):
                data = await self.reader.read(1)
        except TimeoutError:
            return True
        assert data == b"", data
        return False

    def close(self) -> None:
        self.writer.close()


def request(method: str, path: str, body: bytes = b"", extra: str = "") -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: gateway\r\n{AUTH}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def cuts(gw: Instance, reason: str) -> float:
    return sample(gw, "gateway_connections_cut_total", reason=reason)
