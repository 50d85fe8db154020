"""How `gateway serve` starts, or says why it cannot: the address to listen on, Postgres
and its schema (waited for up to GATEWAY_STARTUP_RETRY_SECONDS), and a refusal told in
one or two lines on stderr with an exit code of its own:

- 2: the configuration (a setting, the command's options);
- 3: something the gateway needs cannot be reached or started, or the port is taken;
- 4: the database's schema needs migrating;
- 1: anything else, which is a bug (`gateway --log-level debug serve` shows its
  traceback).

An unreachable Redis is not among them: the gateway starts without it and fails open.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
import time
from collections.abc import Callable, Mapping
from urllib.parse import parse_qsl, urlsplit

from ..errors import (
    ConfigError,
    GatewayError,
    SchemaNotCurrent,
    StartupError,
    StoreUnavailable,
    Unreachable,
)
from ..settings import Settings, _mask_url
from ..store import startup as postgres
from ..store.migrate import MigrationError

log = logging.getLogger("gateway")

EXIT_BUG = 1
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3
EXIT_SCHEMA = 4
# Waits between attempts while GATEWAY_STARTUP_RETRY_SECONDS lasts: doubling from the
# first to the last, so that a database that comes back is found within a few seconds
# without a connection attempt every instant meanwhile.
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 5.0
# Bound on one connection attempt: a host that drops packets answers nothing at all.
CONNECT_TIMEOUT_SECONDS = 10.0
# The variables whose values may hold passwords, kept out of every message.
SECRET_URLS = ("DATABASE_URL", "GATEWAY_DIRECT_DATABASE_URL", "REDIS_URL")


def exit_code(exc: BaseException) -> int:
    """The exit code of a start-up that failed with `exc` (see the module docstring)."""
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    if isinstance(exc, SchemaNotCurrent | MigrationError):
        return EXIT_SCHEMA
    if isinstance(exc, Unreachable | StoreUnavailable):
        return EXIT_UNREACHABLE
    return EXIT_BUG


def refusal(exc: BaseException, env: Mapping[str, str]) -> list[str]:
    """The lines that say why the start failed, each `gateway: ...`, without secrets."""
    if isinstance(exc, GatewayError | StartupError):
        text = exc.detail
    else:
        text = (
            f"start-up failed: {type(exc).__name__}: {exc}\n"
            "this is a bug: `gateway --log-level debug serve` shows where it happened"
        )
    return [f"gateway: {line}" for line in mask_secrets(text, env).splitlines()]


def mask_secrets(text: str, env: Mapping[str, str]) -> str:
    """`text` with every connection URL of `env` masked (settings._mask_url), and any
    password of one of them, or the admin token, that still shows replaced by ***."""
    token = env.get("GATEWAY_ADMIN_TOKEN", "")
    if len(token) >= 8:
        text = text.replace(token, "***")
    for name in SECRET_URLS:
        url = env.get(name)
        if not url:
            continue
        text = text.replace(url, _mask_url(url) or "")
        parts = urlsplit(url)
        secrets = [parts.password or ""]
        secrets += [v for k, v in parse_qsl(parts.query) if k.lower() in ("password", "pass")]
        for secret in secrets:
            if len(secret) >= 3:  # a shorter one would mask ordinary words
                text = text.replace(secret, "***")
    return text


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address of `host` (as asyncio.create_server makes
    them), bound before the database is asked or the gateway opened, so that a taken
    port stops the start at once. Raises Unreachable for a port in use, ConfigError for
    an address that cannot be listened on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host} (--host): {exc.strerror}") from exc
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)  # uvicorn's default backlog
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise Unreachable(
                f"port {port} on {host} is in use: stop what listens there, "
                "or choose another port with --port"
            ) from exc
        if exc.errno == errno.EACCES:
            raise ConfigError(
                f"no permission to listen on port {port} on {host}: choose a port above "
                "1023 with --port"
            ) from exc
        raise ConfigError(
            f"cannot listen on {host}:{port} (--host, --port): {exc.strerror}"
        ) from exc
    return sockets


class DatabaseWait:
    """The database checks of a start: Postgres reachable, migrations applied first with
    `migrate`, the schema not older than this release (newer: one warning, and on).
    Called once it tries until `settings.startup_retry_seconds` have passed, waiting
    FIRST_RETRY_SECONDS, then twice as long each time, up to MAX_RETRY_SECONDS;
    `waiting_for()` says meanwhile what it waits for, for /readyz."""

    def __init__(
        self,
        settings: Settings,
        *,
        migrate: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert settings.database_url is not None  # check_database_url ran
        self._dsn = settings.database_url
        self._lock_dsn = settings.lock_database_url or self._dsn
        self._retry_seconds = settings.startup_retry_seconds
        self._host_timeout_seconds = settings.db_connect_timeout_ms / 1000
        self._migrate = migrate
        self._clock = clock
        self._deadline = clock() + self._retry_seconds
        self._why = f"connecting to {postgres.server(self._dsn)}"
        self._waiting = False

    def waiting_for(self) -> str:
        """What the start waits for, and for how long more it will."""
        left = max(0.0, self._deadline - self._clock())
        return f"{self._why} (retrying for {_seconds(left)} more)"

    async def __call__(self) -> None:
        started = self._clock()
        self._deadline = started + self._retry_seconds
        pause = FIRST_RETRY_SECONDS
        while True:
            left = self._deadline - self._clock()
            timeout = CONNECT_TIMEOUT_SECONDS
            if self._retry_seconds:
                timeout = min(CONNECT_TIMEOUT_SECONDS, max(left, 1.0))
            try:
                await self._check(timeout)
            except (Unreachable, SchemaNotCurrent) as exc:
                left = self._deadline - self._clock()
                # An edited migration file stays edited: waiting cannot help.
                waits = isinstance(exc, Unreachable) or "state" in exc.extra
                if left <= 0 or not waits:
                    raise self._given_up(exc) from exc
                self._wait_on(exc)
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, MAX_RETRY_SECONDS)
                continue
            if self._waiting:
                log.info("the database is ready after %.1f s of waiting", self._clock() - started)
            return

    async def _check(self, timeout_seconds: float) -> None:
        if self._migrate:
            await postgres.apply(self._lock_dsn, timeout_seconds, self._host_timeout_seconds)
        schema = await postgres.probe(self._dsn, timeout_seconds, self._host_timeout_seconds)
        postgres.require_current(self._dsn, schema)
        warning = postgres.newer_warning(self._dsn, schema)
        if warning:
            log.warning("%s", warning)

    def _wait_on(self, exc: StartupError) -> None:
        """Note what the start now waits for; logged when it changes."""
        if isinstance(exc, Unreachable):
            where = exc.extra.get("server", postgres.server(self._dsn))
            why = f"waiting for {where}: {exc.extra.get('reason', exc.detail)}"
        else:
            why = f"waiting for migrations: {exc.extra['state']}"
        if why != self._why or not self._waiting:
            log.warning(
                "%s; retrying until %s from the start have passed "
                "(GATEWAY_STARTUP_RETRY_SECONDS), /readyz answers 503 meanwhile",
                why,
                _seconds(self._retry_seconds),
            )
        self._why, self._waiting = why, True

    def _given_up(self, exc: StartupError) -> StartupError:
        if not self._waiting:
            return exc
        waited = f" (retried for {_seconds(self._retry_seconds)}: GATEWAY_STARTUP_RETRY_SECONDS)"
        first, newline, rest = exc.detail.partition("\n")
        return type(exc)(first + waited + newline + rest, **exc.extra)


def _seconds(seconds: float) -> str:
    """`40 s`, or `0.4 s` under ten: the time left, as people read it."""
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def report(exc: BaseException, env: Mapping[str, str], *, json_log: bool) -> int:
    """Say why the start failed, on stderr (as one log line each in a JSON log), and
    return the exit code. The traceback only at --log-level debug."""
    log.debug("start-up failed", exc_info=exc)
    for line in refusal(exc, env):
        if json_log:
            log.error("%s", line)
        else:
            print(line, file=sys.stderr, flush=True)
    return exit_code(exc)
