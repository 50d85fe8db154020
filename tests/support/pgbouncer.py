"""A PgBouncer of the test's own, in transaction pooling mode, in front of the test
Postgres. Every other setting is PgBouncer's default, as a deployment would start."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from tests.support.net import free_port

# Debian installs it under sbin, which a non-root PATH often lacks.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer", path=SEARCH_PATH)


# Query parameters that name the server; a URL through the pooler must not keep them.
_SERVER_PARAMS = frozenset({"host", "hostaddr", "port"})


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def server_of(postgres_url: str) -> tuple[str, int]:
    """The host (a name, an address, or a unix socket directory) and port that
    `postgres_url` reaches, read as asyncpg reads it: the host of the URL's authority,
    else its `host=` and `port=` query parameters (the embedded server's socket URL),
    else 127.0.0.1:5432."""
    parts = urlsplit(postgres_url)
    hostspec = parts.netloc.rpartition("@")[2]
    if hostspec.startswith("["):
        host = parts.hostname or ""
    else:
        # Not `hostname`: it lowercases, and a socket directory (%2F...) is a path.
        host = unquote(hostspec.split(":")[0])
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    if host:
        return host, parts.port or 5432
    return query.get("host") or "127.0.0.1", parts.port or int(query.get("port") or 5432)


def databases_entry(postgres_url: str) -> str:
    """The `[databases]` connection string for the server of `postgres_url`: a host
    starting with `/` is a socket directory to PgBouncer as to libpq."""
    host, port = server_of(postgres_url)
    quoted = "'" + host.replace("'", "''") + "'"  # PgBouncer's quoting: a path may hold spaces
    return f"host={quoted} port={port}"


def run_as(postgres_url: str) -> str:
    """The user a root-started PgBouncer drops to (it refuses to run as root): the
    owner of the server's socket directory, whom the server lets in (the embedded
    server's data directory, mode 0700, belongs to its own system user); else postgres."""
    host, _ = server_of(postgres_url)
    if host.startswith("/"):
        try:
            owner = Path(host).stat().st_uid
        except OSError:
            return "postgres"
        if owner != 0:
            return pwd.getpwuid(owner).pw_name
    return "postgres"


class PgBouncer:
    """`start()` runs pgbouncer in the foreground on a free loopback port; `stop()`
    ends that process by its pid. `url(database_url)` is the same database through it."""

    def __init__(self, binary: str, postgres_url: str) -> None:
        self.binary = binary
        self.port = free_port()
        parts = urlsplit(postgres_url)
        self._user = unquote(parts.username or "postgres")
        self._password = unquote(parts.password or "")
        self._server = databases_entry(postgres_url)
        self._run_as = run_as(postgres_url)
        self._dir = Path(tempfile.mkdtemp(prefix="gateway-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def url(self, database_url: str) -> str:
        """`database_url`'s database and user, through this PgBouncer. Its `host=` and
        `port=` parameters go: libpq would let them override the pooler's address."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        query = "&".join(
            pair
            for pair in parts.query.split("&")
            if pair and unquote(pair.split("=", 1)[0]) not in _SERVER_PARAMS
        )
        return urlunsplit(
            parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host, query=query)
        )

    def start(self) -> None:
        ini = self._dir / "pgbouncer.ini"
        # `*`: every database of the server, so that a database made for one test is
        # reachable without editing the file.
        ini.write_text(
            "[databases]\n"
            f"* = {self._server}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            f"auth_type = {'md5' if self._password else 'trust'}\n"
            f"auth_file = {self._dir / 'userlist.txt'}\n"
            f"logfile = {self._dir / 'pgbouncer.log'}\n"
            "pool_mode = transaction\n"
        )
        (self._dir / "userlist.txt").write_text(
            f"{_quoted(self._user)} {_quoted(self._password)}\n"
        )
        command = [self.binary]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root: it drops to a user who must read these.
            command += ["-u", self._run_as]
            for path in (self._dir, *self._dir.iterdir()):
                shutil.chown(path, self._run_as)
        self.process = subprocess.Popen(
            [*command, str(ini)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"pgbouncer exited at start: {err}{self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer on port {self.port} did not start: {self.log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None
        shutil.rmtree(self._dir, ignore_errors=True)
