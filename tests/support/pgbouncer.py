"""A PgBouncer of the test's own, in transaction pooling mode, in front of the test
Postgres. Every other setting is PgBouncer's default, as a deployment would start."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from tests.support.net import free_port

# Debian installs it under sbin, which a non-root PATH often lacks.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer", path=SEARCH_PATH)


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """`start()` runs pgbouncer in the foreground on a free loopback port; `stop()`
    ends that process by its pid. `url(database_url)` is the same database through it."""

    def __init__(self, binary: str, postgres_url: str) -> None:
        self.binary = binary
        self.port = free_port()
        parts = urlsplit(postgres_url)
        self._user = unquote(parts.username or "postgres")
        self._password = unquote(parts.password or "")
        self._server = f"host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}"
        self._dir = Path(tempfile.mkdtemp(prefix="gateway-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        path = self._dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def url(self, database_url: str) -> str:
        """`database_url`'s database and user, through this PgBouncer."""
        parts = urlsplit(database_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(
            parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host)
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
            # PgBouncer refuses to run as root: it drops to postgres, who must read these.
            command += ["-u", "postgres"]
            for path in (self._dir, *self._dir.iterdir()):
                shutil.chown(path, "postgres")
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
