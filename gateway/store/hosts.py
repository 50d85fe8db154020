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
import os
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncpg

DEFAULT_PORT = 5432
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
_IPV6 = re.compile(r"\[([^\]]+)\](?::([0-9]+))?$")
log = logging.getLogger("gateway.store")


@dataclass(frozen=True)
class Host:
    """One server of a URL: a host name or address and its port, or a socket directory
    (a path) with the port that names the socket in it."""

    host: str
    port: int

    def __str__(self) -> str:
        if self.host.startswith("/"):
            return f"the socket in {self.host} (port {self.port})"
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def _ports(text: str | None, count: int) -> list[int | None]:
    """The ports a `port` parameter (or PGPORT) gives `count` hosts: one for all, or one
    each; None where it gives none."""
    if not text:
        return [None] * count
    ports: list[int | None] = [int(p) for p in text.split(",")]
    if len(ports) == 1:
        return ports * count
    return [*ports, *([None] * count)][:count]


def hosts(dsn: str) -> list[Host]:
    """The hosts a `postgresql://` URL names, in its order, as the driver reads them:
    the URL's host part (`h1:5432,h2:5433`, `[::1]:5432`), else its `host` parameter
    (with `port`); a host without a port takes PGPORT, else 5432. Empty when the URL
    names none (the driver then falls back to PGHOST or its defaults)."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    query = dict(parse_qsl(parts.query))
    if netloc:
        specs = [unquote(s) for s in netloc.split(",")]
        defaults = _ports(os.environ.get("PGPORT"), len(specs))
    elif query.get("host"):
        specs = query["host"].split(",")
        defaults = _ports(query.get("port") or os.environ.get("PGPORT"), len(specs))
    else:
        return []
    listed = []
    for spec, default in zip(specs, defaults, strict=True):
        if spec.startswith("/"):
            name, port = spec, ""
        elif match := _IPV6.match(spec):
            name, port = match.group(1), match.group(2) or ""
        else:
            name, _, port = spec.partition(":")
        listed.append(Host(name, int(port) if port else default or DEFAULT_PORT))
    return listed


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
