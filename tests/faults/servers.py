"""Private servers the fault matrix may kill: a Postgres cluster and gateway processes
(its redis-server is tests/support/redis_servers.py's). Each is stopped by the pid it
started, never by name."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.support.net import free_port

READY_SECONDS = 20.0
REDIS_ERRORS = "gateway_redis_errors_total"  # a counter: Redis calls that failed
REDIS_BREAKER = "gateway_redis_breaker_open"  # a gauge: 1 while Redis is skipped


def log(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the table."""
    print(f"[faults] {message}", file=sys.stderr, flush=True)


def postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: PG_BINDIR, PATH, or the Debian layout."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs else None


@dataclass
class PrivatePostgres:
    """A throwaway Postgres cluster on a free loopback port (trust auth), which the
    matrix may restart. Postgres refuses to run as root, so then it runs as `postgres`."""

    workdir: Path
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise RuntimeError("no Postgres server binaries (initdb, pg_ctl) found")
        user = "postgres" if os.geteuid() == 0 else None
        subprocess.run(
            [str(bindir / argv[0]), *argv[1:]], check=True, user=user, timeout=60,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    @property
    def _data(self) -> Path:
        return self.workdir / "pgdata"

    def init(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")
        self._run("initdb", "-D", str(self._data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def start(self) -> None:
        # fsync=off is safe here: a killed server leaves its WAL in the page cache. Not
        # synchronous_commit=off: a commit acknowledged but not yet written is lost when
        # the server is killed, which would show up as a task completed twice.
        opts = (f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c full_page_writes=off")  # fmt: skip
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self.workdir / "log"),
                  "-o", opts, "-w", "-t", "30", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "-t", "30", "stop")


@dataclass
class GatewayProcess:
    """`gateway serve` on a fixed port, which may be SIGKILLed and started again."""

    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    # The module run as `python -m`: the gateway's command, or a variant of it that a
    # check's broken run starts (tests/faults/ticks.py).
    module: str = "gateway.cli"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", self.module, "--log-level", "warning",
                "serve", "--port", str(self.port),
                env=self.env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        deadline = time.monotonic() + READY_SECONDS
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if self.process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"gateway on port {self.port} did not start; see {self.log_path}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.url + "/readyz") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.1)

    async def kill(self) -> None:
        """SIGKILL by pid and reap."""
        proc, self.process = self.process, None
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        """SIGTERM (it drains, I10), SIGKILL if it lingers."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            await self.kill()
        self.process = None

    async def metric(self, name: str) -> float | None:
        """The sum of the samples called `name` on /metrics (over every label set), or
        None when it cannot be read or has none."""
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http,
                http.get(self.url + "/metrics") as resp,
            ):
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        found = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + " ", name + "{"))
        ]
        return sum(found) if found else None
