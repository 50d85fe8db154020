"""Connecting to a Postgres URL that names several hosts (a primary and its replicas):
each host is tried in turn, each within a connect timeout of its own, until one takes
the connection; the one that last did is tried first next time.

asyncpg walks a host list itself, but within one timeout for the whole walk (60 s by
default), and it passes over a host only on a network error or "cannot connect now". A
host that never answers (a machine that crashed, a network cut that drops packets) then
takes the whole timeout, and the hosts after it are never tried; a host that answers
with another error (an old primary rejoining said `could not open file
"global/pg_filenode.map"` for seconds) stops the walk. Here each host gets
GATEWAY_DB_CONNECT_TIMEOUT_MS, and any failure of one host moves on to the next: a
network error, a timeout, an error Postgres answered, or a server that is not what
`target_session_attrs` asks for (a read-only standby for `read-write`). Only a URL the
driver cannot use stops the walk, since every host would refuse it alike.

A URL with one host is handed to the driver as it is, within the same timeout.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

import asyncpg

from ..dsn import Host, hosts

# What one host may fail with before the next is tried: what the driver raises for a
# server that cannot be reached, does not answer in time, refuses the connection or is
# not what target_session_attrs asks for (TargetServerAttributeNotMatched is an
# InternalClientError).
HOST_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
log = logging.getLogger("gateway.store")


def reason(exc: BaseException, timeout_seconds: float) -> str:
    """Why a connection failed, in a few words."""
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror})"
    text = str(exc)
    if isinstance(exc, ConnectionRefusedError) or f"[Errno {errno.ECONNREFUSED}]" in text:
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_seconds:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return text or type(exc).__name__


class NoHostAccepted(ConnectionError):
    """Every host of a URL failed; the text names each and why, in the order tried. An
    OSError, as a single host's network failure is, so callers need no new case."""

    def __init__(self, failures: list[tuple[Host, str]]) -> None:
        self.failures = failures
        listed = "; ".join(f"{host}: {why}" for host, why in failures)
        super().__init__(f"no host took the connection ({listed})")


class Hosts:
    """The hosts of one URL and a connect that walks them, each within
    `timeout_seconds`. Remembers the host that took the last connection and tries it
    first, so that after a failover only the first connection pays for a dead host.
    Shared by every connection one process opens to that URL; safe for concurrent
    connects (each walks on its own)."""

    def __init__(
        self, dsn: str, timeout_seconds: float, alone_seconds: float | None = None
    ) -> None:
        """`alone_seconds`: the connect timeout of a URL that names one host, which has
        no other host to pass on to (a slow login, TLS across regions, a loaded
        pooler, would only fail sooner); `timeout_seconds` when not given."""
        self.dsn = dsn
        self.timeout_seconds = timeout_seconds
        self.alone_seconds = timeout_seconds if alone_seconds is None else alone_seconds
        self._hosts = hosts(dsn)
        self._last: Host | None = None

    def order(self) -> list[Host]:
        """The hosts in the order the next connect tries them."""
        last = self._last
        if last is None:
            return list(self._hosts)
        return [last, *(h for h in self._hosts if h != last)]

    async def connect(self, *_dsn: object, **kwargs: Any) -> asyncpg.Connection:
        """A connection to the first host that takes one; `kwargs` go to
        `asyncpg.connect`. Called as asyncpg's pool calls its `connect=`: the URL the
        pool passes first is this object's own, and ignored. Raises NoHostAccepted when
        no host takes the connection, or the driver's own error for a URL it cannot use
        (ClientConfigurationError, a ValueError)."""
        if len(self._hosts) < 2:
            conn: asyncpg.Connection = await asyncpg.connect(
                self.dsn, timeout=self.alone_seconds, **kwargs
            )
            return conn
        failures: list[tuple[Host, str]] = []
        for host in self.order():
            try:
                conn = await asyncpg.connect(
                    self.dsn,
                    host=host.host,
                    port=host.port,
                    timeout=self.timeout_seconds,
                    **kwargs,
                )
            except asyncpg.ClientConfigurationError:
                raise
            except HOST_ERRORS as exc:
                why = reason(exc, self.timeout_seconds)
                log.debug("Postgres at %s did not take a connection: %s", host, why)
                failures.append((host, why))
                continue
            self._took(host, failures)
            return conn
        raise NoHostAccepted(failures)

    def _took(self, host: Host, failures: list[tuple[Host, str]]) -> None:
        if host == self._last:
            return
        if self._last is not None or failures:
            passed = "; ".join(f"{h}: {why}" for h, why in failures)
            log.warning(
                "new Postgres connections go to %s%s",
                host,
                f" (passed over {passed})" if passed else "",
            )
        self._last = host
