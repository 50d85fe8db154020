"""HAProxy in front of a Patroni cluster's nodes, as docs/operations/failover.md
recommends for Patroni: TCP mode, every node health-checked on Patroni's REST API
(`GET /primary`, 200 on the leader only), and the sessions of a node marked down shut
at once (`on-marked-down shutdown-sessions`). The gateways' one-host URL names
HAProxy's port; HAProxy sends each new connection to the node whose check passes.

Needs Debian's `haproxy` package (2.6). It runs in the foreground (`-db`) on a free
loopback port, with an admin socket in the row's folder through which the harness reads
each server's state; it is stopped by the pid it was started with, never by name. Its
stderr (the servers going down and up, with the sessions they had) is its log.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.patroni import Node, stop_process
from tests.support.net import free_port

# The check of docs/operations/failover.md: a check every second, a node marked down
# after two failed checks and up after two that passed.
INTER_SECONDS = 1
FALL = 2
RISE = 2
PROXY = "postgres_primary"
READY_SECONDS = 30.0  # the leader's first RISE checks, on a loaded machine
STOP_SECONDS = 10.0
SOCKET_SECONDS = 2.0


def haproxy_binary() -> str | None:
    return shutil.which("haproxy", path=os.environ.get("PATH", "") + ":/usr/sbin")


def config(nodes: Sequence[Node], port: int, admin_socket: Path) -> str:
    """The configuration the harness runs: the documented `listen` section with the
    cluster's loopback addresses, after a `global` section with the admin socket (the
    harness's only addition) and `defaults` with the timeouts the documentation gives.

    Why these timeouts: `timeout connect` bounds the connection to a node; `timeout
    client` and `timeout server` must outlast the gateway's idle connections (its pool
    closes one idle for 300 s), or HAProxy would cut them; `timeout check` bounds
    a check's answer, so that a node that answers nothing (a machine that died, a
    network that drops packets) fails its checks as fast as one that refuses them."""
    servers = "\n".join(
        f"    server {n.name} 127.0.0.1:{n.pg_port} check port {n.api_port}" for n in nodes
    )
    return f"""\
global
    stats socket {admin_socket} mode 600 level admin

defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s

listen {PROXY}
    bind 127.0.0.1:{port}
    mode tcp
    option httpchk GET /primary
    http-check expect status 200
    default-server inter {INTER_SECONDS}s fall {FALL} rise {RISE} on-marked-down shutdown-sessions
{servers}
"""


def parse_stat(text: str) -> dict[str, str]:
    """Each server's status (`UP`, `DOWN`, `UP 1/2` while it falls, `DOWN 1/2` while it
    rises, ...) in the answer to the admin socket's `show stat`: CSV whose header line
    starts with '# '. The proxy's FRONTEND and BACKEND lines are left out."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not an answer to show stat: {text[:200]!r}")
    reader = csv.DictReader([lines[0][2:], *lines[1:]])
    return {
        row["svname"]: row["status"]
        for row in reader
        if row["pxname"] == PROXY and row["svname"] not in ("FRONTEND", "BACKEND")
    }


def routes(servers: dict[str, str]) -> list[str]:
    """The servers HAProxy sends new connections to: those UP, also one going down
    (`UP 1/2`: a check failed, fewer than FALL in a row)."""
    return sorted(name for name, status in servers.items() if status.startswith("UP"))


@dataclass
class HAProxy:
    """Start with `start()`, stop with `stop()` (idempotent). `nodes`: the cluster's,
    one server each."""

    nodes: list[Node]
    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.workdir / "haproxy.cfg"

    @property
    def admin_socket(self) -> Path:
        return self.workdir / "haproxy.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "haproxy.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, leader: str) -> None:
        """Starts HAProxy and returns once it routes to the node `leader` alone. HAProxy
        counts every server up when it starts, and a replica's checks take it down only
        after FALL failures: until then a new connection may go to a replica."""
        binary = haproxy_binary()
        if binary is None:
            raise RuntimeError("cannot start HAProxy: haproxy not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config(self.nodes, self.port, self.admin_socket))
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [binary, "-f", str(self.config_path), "-db"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
        try:
            self.wait_for(
                lambda s: routes(s) == [leader], f"route to {leader} alone", READY_SECONDS
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM (HAProxy's immediate stop) by pid, SIGKILL if it lingers."""
        proc, self.process = self.process, None
        stop_process(proc, STOP_SECONDS)

    def servers(self) -> dict[str, str]:
        """Each server's status, read on the admin socket; {} when it does not answer."""
        with contextlib.suppress(OSError, ValueError):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(SOCKET_SECONDS)
                sock.connect(str(self.admin_socket))
                sock.sendall(b"show stat\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
            return parse_stat(b"".join(chunks).decode())
        return {}

    def wait_for(
        self, ok: Callable[[dict[str, str]], bool], what: str, seconds: float
    ) -> dict[str, str]:
        """Polls `servers()` until `ok(servers)`; returns them."""
        deadline = time.monotonic() + seconds
        while True:
            found = self.servers()
            if ok(found):
                return found
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"HAProxy exited: {self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {seconds:.0f}s: {found}\n{self.log()}")
            time.sleep(0.1)

    def log(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""
