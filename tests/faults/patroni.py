"""A real high-availability Postgres for the failover rows: one etcd and two Postgres
nodes managed by Patroni, on free loopback ports, in a temporary folder.

Needs Debian's `patroni` and `etcd-server` packages and Postgres's server binaries.
Postgres refuses to run as root, so when the tests run as root every server runs as
the `postgres` user, in a folder it owns. Everything is stopped by the pid it was
started with, never by name, and the folder is removed.

Patroni's timings are short so that a row stays short: the leader key lives `ttl` s
(10), the loop runs every `loop_wait` s (1), and Patroni demotes a primary that could
not reach etcd for `retry_timeout` s (3); Patroni wants loop_wait + 2 * retry_timeout
<= ttl. A SIGKILLed primary's leader key outlives it by up to `ttl`: that, not the
gateway, bounds how soon the replica is promoted.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.net import free_port

TTL_SECONDS = 10
LOOP_WAIT_SECONDS = 1
RETRY_TIMEOUT_SECONDS = 3
READY_SECONDS = 90.0  # bootstrap: initdb, then a base backup for the replica
STOP_SECONDS = 20.0
NODES = 2


def patroni_binary() -> str | None:
    return shutil.which("patroni", path=os.environ.get("PATH", "") + ":/usr/bin")


def etcd_binary() -> str | None:
    return shutil.which("etcd", path=os.environ.get("PATH", "") + ":/usr/bin")


def postgres15_bindir() -> Path | None:
    """Patroni runs one major version; the newest Debian layout wins, PG_BINDIR first."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs else None


def missing() -> str:
    """What is missing to run a cluster, or ''."""
    lacking = [
        name
        for name, found in (
            ("patroni", patroni_binary()),
            ("etcd", etcd_binary()),
            ("Postgres server binaries", postgres15_bindir()),
        )
        if not found
    ]
    return ", ".join(lacking)


def _server_user() -> str | None:
    return "postgres" if os.geteuid() == 0 else None


def _get(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def stop_process(proc: subprocess.Popen[bytes] | None, seconds: float) -> None:
    """SIGTERM a process this harness started (by its pid), and SIGKILL it if it has not
    exited within `seconds`; nothing for one already gone."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Node:
    """One Patroni-managed Postgres: its Patroni process, ports and data folder."""

    name: str
    workdir: Path
    pg_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    # Where this node's Patroni reaches etcd, and the Postgres port it advertises (the
    # one its replica streams from) when not the cluster's etcd and its own port: a
    # proxy there can cut the node off from both while its clients still reach it.
    etcd_via: int | None = None
    advertised_port: int | None = None

    @property
    def data(self) -> Path:
        return self.workdir / f"{self.name}-data"

    @property
    def config(self) -> Path:
        return self.workdir / f"{self.name}.yml"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        """The pid in postmaster.pid, if that process still runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if psutil.pid_exists(pid) else None


@dataclass
class PatroniCluster:
    """Start with `start()`, stop with `stop()` (idempotent). `synchronous`: Patroni's
    synchronous_mode, a commit acknowledged only once the standby has it."""

    synchronous: bool = True
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gateway-ha-")))
    scope: str = field(default_factory=lambda: "faults-" + secrets.token_hex(4))
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    nodes: list[Node] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes = [Node(f"node{i}", self.workdir) for i in range(NODES)]

    # -- URLs -----------------------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A multi-host URL that follows the primary: the driver tries each host and
        keeps the first that accepts writes."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        problem = missing()
        if problem:
            raise RuntimeError(f"cannot start a Patroni cluster: {problem} not installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir.chmod(0o700)
        if _server_user():
            shutil.chown(self.workdir, "postgres", "postgres")
        try:
            self._start_etcd()
            for i, node in enumerate(self.nodes):
                self.start_node(node)
                if i == 0:  # the first bootstraps; the others copy it
                    self.wait_for(lambda c: self._leader(c) is not None, "a leader")
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PATRONI_", "PG"))}
        env["HOME"] = str(self.workdir)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                cwd=self.workdir, user=_server_user(), start_new_session=True,
            )  # fmt: skip
        if _server_user():
            with contextlib.suppress(OSError):
                shutil.chown(log, "postgres", "postgres")
        return proc

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        binary = etcd_binary()
        assert binary is not None
        self.etcd = self._spawn(
            [binary, "--name", "etcd0", "--data-dir", str(self.workdir / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"etcd0={peer}", "--log-level", "warn"],
            self.workdir / "etcd.log",
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError, ValueError):
                if _get(f"{client}/health").get("health") == "true":
                    return
            if self.etcd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start: {self.log('etcd')}")
            time.sleep(0.1)

    def _config(self, node: Node) -> dict[str, Any]:
        bindir = postgres15_bindir()
        assert bindir is not None
        trust = ["local all all trust", "host all all 127.0.0.1/32 trust",
                 "host replication all 127.0.0.1/32 trust"]  # fmt: skip
        return {
            "scope": self.scope,
            "namespace": "/gateway-faults/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            # use_proxies: no discovery of etcd's own address, which would bypass a proxy.
            "etcd3": {
                "hosts": [f"127.0.0.1:{node.etcd_via or self.etcd_port}"],
                "use_proxies": node.etcd_via is not None,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_SECONDS,
                    "loop_wait": LOOP_WAIT_SECONDS,
                    "retry_timeout": RETRY_TIMEOUT_SECONDS,
                    "maximum_lag_on_failover": 1024 * 1024,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_level": "replica",
                            "hot_standby": "on",
                            "wal_log_hints": "on",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "max_connections": 100,
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": trust,
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.advertised_port or node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(bindir),
                "pgpass": str(self.workdir / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                "pg_hba": trust,
                # fsync off: a SIGKILLed server's WAL survives in the page cache, and
                # these servers never outlive the machine's uptime. full_page_writes
                # stays on: pg_rewind refuses a source without it, and Patroni would
                # then wipe the old primary and copy it afresh instead of rewinding it.
                "parameters": {
                    "unix_socket_directories": str(self.workdir),
                    "fsync": "off",
                },
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }

    def start_node(self, node: Node) -> None:
        """Start (or start again) Patroni on `node`; it bootstraps, copies the leader or
        rejoins as a replica (through pg_rewind if it diverged)."""
        # YAML is a superset of JSON: no YAML writer needed.
        node.config.write_text(json.dumps(self._config(node), indent=2))
        binary = patroni_binary()
        assert binary is not None
        node.process = self._spawn([binary, str(node.config)], self.workdir / f"{node.name}.log")

    def stop(self) -> None:
        """Every Patroni (it stops its Postgres), then any Postgres left, then etcd; by
        pid. Removes the folder."""
        for node in self.nodes:
            self._stop_patroni(node)
        for node in self.nodes:
            self._kill_postgres(node)
        stop_process(self.etcd, STOP_SECONDS)
        self.etcd = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_patroni(self, node: Node) -> None:
        proc, node.process = node.process, None
        stop_process(proc, STOP_SECONDS)

    def _kill_postgres(self, node: Node) -> None:
        """SIGKILL the node's postmaster and its children, found through postmaster.pid."""
        pid = node.postmaster_pid()
        if pid is None:
            return
        try:
            parent = psutil.Process(pid)
            procs = [parent, *parent.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)

    # -- faults -------------------------------------------------------------------------

    def crash(self, node: Node) -> None:
        """`node` dies as a machine would: Patroni SIGKILLed (so that nothing restarts
        its Postgres or gives up the leader key), then the postmaster and every backend.
        Its leader key in etcd stays until its `ttl` runs out."""
        proc, node.process = node.process, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._kill_postgres(node)

    def switchover(self, candidate: Node) -> None:
        """A planned switchover to `candidate` through the leader's REST API; returns
        once Patroni says it is done."""
        leader = self.leader()
        body = json.dumps({"leader": leader.name, "candidate": candidate.name}).encode()
        request = urllib.request.Request(
            leader.api + "/switchover", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as resp:
            if resp.status != 200:
                raise RuntimeError(f"switchover refused: {resp.status} {resp.read()!r}")

    # -- state ------------------------------------------------------------------------

    def members(self, via: list[Node] | None = None) -> list[dict[str, Any]]:
        """Patroni's view of the cluster (GET /cluster), from the first node of `via`
        (default: all) that answers. A node cut off from etcd answers its stale view."""
        for node in via or self.nodes:
            if node.process is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                members = _get(node.api + "/cluster").get("members", [])
                assert isinstance(members, list)
                return members
        return []

    @staticmethod
    def _leader(members: list[dict[str, Any]]) -> str | None:
        for m in members:
            if m.get("role") == "leader" and m.get("state") == "running":
                return str(m["name"])
        return None

    def leader(self) -> Node:
        name = self._leader(self.members())
        if name is None:
            raise RuntimeError("the cluster has no running leader")
        return self.node(name)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def others(self, node: Node) -> list[Node]:
        return [n for n in self.nodes if n is not node]

    def wait_for(
        self, ok: Any, what: str, seconds: float = READY_SECONDS, via: list[Node] | None = None
    ) -> list[Any]:
        """Polls /cluster (asking `via`) until `ok(members)`; returns the members."""
        deadline = time.monotonic() + seconds
        while True:
            members = self.members(via)
            if ok(members):
                return members
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {seconds:.0f}s: {members}\n{self.logs()}")
            time.sleep(0.1)

    def wait_healthy(self, seconds: float = READY_SECONDS) -> None:
        """A running leader and every running node streaming from it (in synchronous
        mode, as the synchronous standby)."""
        running = [n.name for n in self.nodes if n.process is not None]
        want_role = "sync_standby" if self.synchronous else "replica"

        def healthy(members: list[dict[str, Any]]) -> bool:
            leader = self._leader(members)
            standbys = {m["name"] for m in members
                        if m.get("role") == want_role and m.get("state") == "running"}  # fmt: skip
            return leader is not None and set(running) - {leader} <= standbys

        self.wait_for(healthy, "healthy cluster", seconds)

    def status(self, node: Node) -> dict[str, Any]:
        """Patroni's view of `node`'s own Postgres (GET /patroni: role, state, timeline,
        and on a primary the WAL senders under `replication`); {} when it does not
        answer."""
        if node.process is None:
            return {}
        with contextlib.suppress(OSError, ValueError):
            found = _get(node.api + "/patroni")
            assert isinstance(found, dict)
            return found
        return {}

    def not_rejoined(self, node: Node) -> str:
        """Why `node` is not (yet) back as a replica of the leader, or '' once it is:
        Patroni's /cluster, asked of the other nodes, lists it running as a replica (in
        synchronous mode as the synchronous standby); its own /patroni says it runs as
        a replica on the leader's timeline; and the leader's WAL senders include one
        streaming to it."""
        members = self.members(self.others(node))
        leader_name = self._leader(members)
        if leader_name is None or leader_name == node.name:
            return f"no other node leads: {members}"
        want = "sync_standby" if self.synchronous else "replica"
        mine = next((m for m in members if m.get("name") == node.name), {})
        if mine.get("role") != want or mine.get("state") not in ("running", "streaming"):
            return f"/cluster lists it {mine.get('role')} {mine.get('state')}, not {want} running"
        own, lead = self.status(node), self.status(self.node(leader_name))
        if own.get("role") != "replica" or own.get("state") != "running":
            return f"/patroni says {own.get('role')} {own.get('state')}, not replica running"
        if own.get("timeline") is None or own.get("timeline") != lead.get("timeline"):
            return f"on timeline {own.get('timeline')}, the leader on {lead.get('timeline')}"
        senders = lead.get("replication") or []
        if not any(s.get("application_name") == node.name and s.get("state") == "streaming"
                   for s in senders):  # fmt: skip
            return f"the leader streams to no {node.name}: {senders}"
        return ""

    def wait_rejoined(self, node: Node, seconds: float) -> str:
        """Polls `not_rejoined(node)` until it is '' (returned) or `seconds` pass (the
        last reason returned)."""
        deadline = time.monotonic() + seconds
        while True:
            why = self.not_rejoined(node)
            if not why or time.monotonic() > deadline:
                return why
            time.sleep(0.2)

    def log_size(self, node: Node) -> int:
        """How many bytes `node`'s Patroni log holds now: where a later read begins."""
        with contextlib.suppress(OSError):
            return (self.workdir / f"{node.name}.log").stat().st_size
        return 0

    def rewound(self, node: Node, since: int = 0) -> bool:
        """Whether `node`'s Patroni ran pg_rewind, and it succeeded, in its log from
        byte `since` on (Patroni logs 'running pg_rewind from ...', then 'pg_rewind exit
        code=0')."""
        with contextlib.suppress(OSError):
            with (self.workdir / f"{node.name}.log").open("rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace")
            return "running pg_rewind from" in text and "pg_rewind exit code=0" in text
        return False

    def log(self, name: str, chars: int = 3000) -> str:
        path = self.workdir / f"{name}.log"
        with contextlib.suppress(OSError):
            return path.read_text(errors="replace")[-chars:]
        return ""

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{self.log(n.name)}" for n in self.nodes)
