"""What a benchmark run stands on: the Postgres and Redis servers, a fresh database per
run, and the gateway itself as a separate uvicorn process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import redis.asyncio as aioredis

from gateway.store.migrate import apply_migrations

PROJECT_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_SECONDS = 30.0
STOP_GRACE_SECONDS = 10.0
GATEWAY_APP = "gateway.http.app:create_app"
# Inherited variables that would change what is measured; the bench sets its own.
_SCRUBBED_ENV = ("DATABASE_URL", "REDIS_URL")


def log_name(*parts: str) -> str:
    """A log file name from scenario and variant labels: letters, digits, dashes."""
    text = "-".join(parts).lower()
    return re.sub(r"[^a-z0-9+]+", "-", text).strip("-") + ".log"


def log(message: str) -> None:
    """Progress goes to stderr, so that stdout holds only the result table."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# -- servers -----------------------------------------------------------------


@dataclass
class Servers:
    """Where Postgres and Redis are, and how each was found."""

    database_url: str
    redis_url: str
    database_source: str
    redis_source: str
    _embedded: Any = None
    _data_dir: str | None = None

    def close(self) -> None:
        """Stop embedded servers this object started; safe to call twice."""
        embedded, self._embedded = self._embedded, None
        if embedded is not None:
            embedded.stop()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None


def _pick(flag: str | None, names: tuple[str, ...]) -> tuple[str | None, str]:
    if flag:
        return flag, "command line"
    for name in names:
        value = os.environ.get(name)
        if value:
            return value, name
    return None, "embedded"


def resolve_servers(database_url: str | None, redis_url: str | None) -> Servers:
    """Flag, else BENCH_* env, else TEST_* env, else an embedded server in a temp folder."""
    db, db_source = _pick(database_url, ("BENCH_DATABASE_URL", "TEST_DATABASE_URL"))
    rd, rd_source = _pick(redis_url, ("BENCH_REDIS_URL", "TEST_REDIS_URL"))
    servers = Servers(db or "", rd or "", db_source, rd_source)
    if db and rd:
        return servers
    from gateway.cli.embedded import EmbeddedServers

    servers._data_dir = tempfile.mkdtemp(prefix="gateway-bench-")
    servers._embedded = EmbeddedServers(Path(servers._data_dir))
    try:
        if not db:
            log("no database URL given: starting an embedded Postgres")
            servers.database_url = servers._embedded.start_postgres()
        if not rd:
            log("no Redis URL given: starting an embedded Valkey")
            servers.redis_url = servers._embedded.start_redis()
    except BaseException:
        servers.close()
        raise
    return servers


async def check_servers(servers: Servers) -> None:
    """Fail early, with the URL in the message, when a server cannot be reached."""
    try:
        conn = await asyncpg.connect(servers.database_url, timeout=10)
        await conn.close()
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        raise SystemExit(
            f"bench: Postgres at {servers.database_url} is not reachable: {exc}"
        ) from None
    client = aioredis.Redis.from_url(servers.redis_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        await client.ping()
    except Exception as exc:
        raise SystemExit(f"bench: Redis at {servers.redis_url} is not reachable: {exc}") from None
    finally:
        await client.aclose()


# -- databases ---------------------------------------------------------------


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def create_database(admin_url: str, prefix: str = "gwtest_") -> str:
    """A new empty database `<prefix><random>` on the server of `admin_url` (whose role
    may create databases); returns its URL. The tests make theirs with it too."""
    name = prefix + secrets.token_hex(6)
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return with_database(admin_url, name)


async def drop_database(admin_url: str, url: str) -> None:
    """Drops the database of `url`, through `admin_url`, whoever is still connected."""
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def fresh_database(
    admin_url: str, prefix: str = "bench_", *, migrate: bool = True
) -> AsyncIterator[str]:
    """A new database `<prefix><random>` on the server, with the gateway's migrations
    applied unless `migrate` is false (a peer's own schema); dropped afterwards."""
    url = await create_database(admin_url, prefix)
    try:
        if migrate:
            await apply_migrations(url, log=lambda _message: None)
        yield url
    finally:
        await drop_database(admin_url, url)


async def delete_redis_keys(redis_url: str, prefix: str) -> int:
    """Remove the keys a run left under its own prefix."""
    client = aioredis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)
    deleted = 0
    try:
        batch: list[bytes] = []
        async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += await client.unlink(*batch)
    finally:
        await client.aclose()
    return deleted


# -- the gateway process -----------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    """The gateway as it ships (`gateway serve`) on a free loopback port; with
    `workers` >= 1, or an app other than the gateway's (a peer), `python -m uvicorn
    --factory APP --workers N` instead."""

    database_url: str
    redis_url: str
    cache: bool
    log_path: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # What uvicorn serves: the gateway, or a peer such as the bare Starlette floor.
    app: str = GATEWAY_APP
    # 0: `gateway serve`, one process with the gateway's own HTTP protocol (read
    # deadlines, head limits), no proxy headers; N >= 1: uvicorn's CLI with N workers.
    workers: int = 0
    # How long SIGTERM may take before SIGKILL: the gateway answers every parked poll
    # first, which takes longer with thousands of them on a busy machine.
    stop_grace_seconds: float = STOP_GRACE_SECONDS
    # `gateway serve`'s --log-level, and whether its access log is on (its default;
    # off unless a scenario measures it).
    log_level: str = "warning"
    access_log: bool = False
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    prefix: str = field(default_factory=lambda: "bench" + secrets.token_hex(4))
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None
    stop_seconds: float | None = None  # how long stop() took, once it has run

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in _SCRUBBED_ENV and not k.startswith("GATEWAY_")
        }
        env.update(
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            GATEWAY_ADMIN_TOKEN=self.token,
            GATEWAY_REDIS_PREFIX=self.prefix,
            GATEWAY_CACHE="on" if self.cache else "off",
            FLOOR_REDIS_PREFIX=self.prefix,
        )
        env.update(self.extra_env)
        return env

    def argv(self) -> list[str]:
        if self.workers == 0 and self.app == GATEWAY_APP:
            return [
                sys.executable,
                "-c",
                "from gateway.cli.main import main; main()",
                "--log-level",
                self.log_level,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *([] if self.access_log else ["--no-access-log"]),
            ]
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            self.app,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-access-log",
            # As the gateway's own server (server.server_config): uvicorn's command line
            # would otherwise put its proxy-headers middleware in front of every request.
            "--no-proxy-headers",
            "--log-level",
            "warning",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            *(["--workers", str(self.workers)] if self.workers > 1 else []),
        ]

    async def start(self) -> None:
        """Start the process and wait until GET /readyz answers 200."""
        with self.log_path.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv(),
                cwd=PROJECT_ROOT,
                env=self.environment(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        last = "no answer yet"
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while time.monotonic() < deadline:
                code = self.process.returncode
                if code is not None:
                    raise RuntimeError(
                        f"the gateway exited with code {code} before it was ready; "
                        f"its log:\n{self.log_tail()}"
                    )
                try:
                    async with http.get(self.url + "/readyz") as resp:
                        if resp.status == 200:
                            return
                        last = f"{resp.status} {await resp.text()}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.1)
        raise RuntimeError(
            f"the gateway (pid {self.pid}) was not ready within {READY_TIMEOUT_SECONDS:g} s "
            f"(last /readyz: {last}); its log:\n{self.log_tail()}"
        )

    async def stop(self) -> int | None:
        """SIGTERM by pid, SIGKILL after stop_grace_seconds; returns the exit code."""
        proc = self.process
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.stop_grace_seconds)
            except TimeoutError:
                log(
                    f"gateway pid {proc.pid} still running {self.stop_grace_seconds:g} s "
                    "after SIGTERM: SIGKILL"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                await asyncio.wait_for(proc.wait(), 10)
        return proc.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


@contextlib.asynccontextmanager
async def serving(
    opts: argparse.Namespace,
    servers: Servers,
    log_path: Path,
    *,
    app: str = GATEWAY_APP,
    cache: bool = True,
    workers: int = 0,
    env: dict[str, str] | None = None,
    stop_grace_seconds: float = 10.0,
    database_via: Callable[[str], str] | None = None,
    log_level: str = "warning",
    access_log: bool = False,
) -> AsyncIterator[tuple[GatewayProcess, str]]:
    """A fresh database and a process serving `app` on it (GatewayProcess: `workers` 0
    is `gateway serve`, N uvicorn workers otherwise); both gone afterwards.
    `database_via` maps the database's URL to the one the process is given (a relay in
    front of it); the process's direct connections (GATEWAY_DIRECT_DATABASE_URL: the
    janitor's leader lock) then go to the database itself. `log_level` and `access_log`:
    `gateway serve`'s --log-level and --access-log."""
    async with fresh_database(servers.database_url) as database_url:
        direct = {"GATEWAY_DIRECT_DATABASE_URL": database_url} if database_via else {}
        proc = GatewayProcess(
            database_via(database_url) if database_via else database_url,
            servers.redis_url,
            cache,
            log_path,
            extra_env={**opts.gateway_env, **direct, **(env or {})},
            app=app,
            workers=workers,
            stop_grace_seconds=stop_grace_seconds,
            log_level=log_level,
            access_log=access_log,
        )
        try:
            await proc.start()
            how = (
                f"uvicorn, {max(workers, 1)} worker(s)"
                if workers or app != GATEWAY_APP
                else "gateway serve"
            )
            log(f"{app} pid {proc.pid} ready at {proc.url} ({how})")
            yield proc, database_url
        finally:
            stopping = time.perf_counter()
            code = await proc.stop()
            proc.stop_seconds = time.perf_counter() - stopping
            if code not in (0, None, -15):
                log(f"pid {proc.pid} exited with code {code}")
            with contextlib.suppress(Exception):
                await delete_redis_keys(servers.redis_url, proc.prefix)


class MemoryTransport(asyncio.Transport):
    """A connection's transport, kept in memory: what the server wrote, and in how
    many writes, for driving the gateway's HTTP protocol object in this process
    (bench.refusal_cost, and the tests of the protocol)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.writes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0
