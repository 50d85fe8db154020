"""The transport the HTTP protocol hands uvicorn (gateway/http/server.py): closes go
through the protocol, writes after a close are dropped, and the small writes of one
turn of the event loop go out together."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

# Writes smaller than this wait for the end of the loop's turn, to go out with the rest.
HELD_WRITE_BYTES = 16 * 1024


class Owner(Protocol):
    """What the transport needs of its protocol (server.GatewayHttpProtocol)."""

    loop: asyncio.AbstractEventLoop
    lingering: bool

    def close_softly(self) -> None: ...


class Transport:
    """The transport as uvicorn sees it: its `close()` goes through the protocol, which
    half-closes first when the client may still be sending; writes after that are
    dropped (the answer has been sent). Small writes made in one turn of the event loop
    go out together at its end, in one system call: uvicorn writes an answer's head
    and its body apart, and a `send` each was the largest single cost of an empty poll."""

    __slots__ = ("_held", "_loop", "_protocol", "_transport", "write")

    write: Callable[[bytes], None]

    def __init__(self, transport: asyncio.Transport, protocol: Owner) -> None:
        self._transport = transport
        self._protocol = protocol
        self._loop = protocol.loop
        self._held: list[bytes] = []
        self.write = self._hold  # stop_writing() replaces it

    def _hold(self, data: bytes) -> None:
        held = self._held
        if len(data) >= HELD_WRITE_BYTES:  # a large piece goes at once, after the rest
            self.flush()
            self._transport.write(data)
            return
        if not held:
            self._loop.call_soon(self.flush)
        held.append(data)

    def flush(self) -> None:
        """Write what this turn of the loop held back, now."""
        held = self._held
        if held:
            data = held[0] if len(held) == 1 else b"".join(held)
            held.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._protocol.close_softly()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def stop_writing(self) -> None:
        """Drop every later write: the connection is closing once its answer is sent."""
        self.flush()
        self.write = _drop_write

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _drop_write(data: bytes) -> None:
    pass
