"""Accepting connections: many per turn of the event loop, not one.

uvicorn serves a listening socket through the event loop's own server. uvloop's (libuv
1.45 and later) accepts one connection per turn of the loop, and a turn of a gateway
under load is long: with 2,000 parked polls and 2,000 clients being refused, a turn
took about 6 ms on 2 cores, so about 150 connections a second were accepted
(2026-11-29). When a fleet connects at once (the gateway restarted, a flood began),
its connections wait in the kernel's listen queue for seconds, their requests sent
and unread, and clients give up on requests the gateway never saw.

`Acceptor` serves one listening socket instead: each time the socket is readable it
accepts up to ACCEPT_BATCH connections, and hands each to the event loop
(`connect_accepted_socket`) with the server's own protocol, as the loop's server
would. It is the loop's server to uvicorn: `close()` stops accepting, `wait_closed()`
returns once it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable

log = logging.getLogger("gateway.server")

# Connections accepted per readiness of the listening socket: the loop's other work
# (connections with requests to read, answers due) waits meanwhile. asyncio's own
# loop accepts up to the listen backlog (2,048 here) in one go; a few hundred keep a
# turn short while 2,000 waiting connections are in within a few turns.
ACCEPT_BATCH = 256
# Out of descriptors or memory: the listening socket is left alone this long, as
# asyncio's loop does, rather than tried again at every turn.
ACCEPT_RETRY_SECONDS = 1.0
# At most one warning per this many seconds for running out (each names the limit).
WARN_EVERY_SECONDS = 10.0
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Errors of one pending connection that accept(2) reports on Linux (its man page): that
# connection is lost, the next is taken.
_CONNECTION_ERRORS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNABORTED",
        "EPROTO",
        "EPERM",
        "ENETDOWN",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
    )
    if hasattr(errno, name)
)


class Acceptor:
    """Serves `sock` (listening, non-blocking) on `loop`: each accepted connection gets
    a protocol from `protocol_factory`. Start it with `start()`; `close()` is
    idempotent, and leaves the socket open (its owner closes it)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
        *,
        batch: int = ACCEPT_BATCH,
    ) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._loop = loop
        self._batch = batch
        self._reading = False
        self._closed = False
        self._retry: asyncio.TimerHandle | None = None
        self._warned_at = float("-inf")
        self._starting: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Accept from now on."""
        if not self._closed and not self._reading:
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def close(self) -> None:
        """Accept no more: the connections accepted already go on."""
        self._closed = True
        self._pause()

    async def wait_closed(self) -> None:
        """Returns once the connections accepted so far have been handed to their
        protocols (each made and told `connection_made`). Awaited after `close()`
        before the server asks its connections to shut down, so that none accepted
        just before is missed (startup.DrainingServer.shutdown)."""
        while self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    def _pause(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _accept(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # none left: the loop calls again when one comes
            except OSError as exc:
                if exc.errno in _CONNECTION_ERRORS:
                    continue  # that client is gone (it left before it was accepted)
                if exc.errno not in _RESOURCE_ERRORS:
                    raise
                self._out_of(exc)
                return
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                # Answers go out as they are written, as on the loop's own server
                # (asyncio sets it only for sockets made with IPPROTO_TCP named).
                with contextlib.suppress(OSError):  # a peer already gone, on some systems
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._start_connection(conn))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_connection(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # the client left meanwhile (reset): nothing to serve
            log.debug("a connection closed as it was accepted: %s", exc)
            conn.close()
        except BaseException:
            conn.close()
            raise

    def _out_of(self, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_SECONDS:
            self._warned_at = now
            limit = (
                "raise the open-files limit (ulimit -n) or lower the connections"
                if exc.errno in (errno.EMFILE, errno.ENFILE)
                else "the machine is short of memory"
            )
            log.warning(
                "cannot accept new connections (%s): new clients wait in the listen "
                "queue; %s. Trying again in %g s",
                exc.strerror,
                limit,
                ACCEPT_RETRY_SECONDS,
            )
        self._pause()
        self._retry = self._loop.call_later(ACCEPT_RETRY_SECONDS, self.start)
