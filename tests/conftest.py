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
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from tests.support.ci import unavailable
from tests.support.databases import migrate, temporary_database_sync
from tests.support.pgbouncer import PgBouncer, pgbouncer_binary
from tests.support.plans import fill
from tests.support.redis_keys import PREFIXES, forget_keys, new_prefix
from tests.support.redis_servers import RedisServer


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
        unavailable(f"Postgres at {url} is not reachable ({exc})")
    return url


@pytest.fixture
def fresh_database_url(pg_admin_url: str) -> Iterator[str]:
    """An empty database of its own, dropped after the test."""
    with temporary_database_sync(pg_admin_url, migrated=False) as url:
        yield url


@pytest.fixture
async def own_database_url(fresh_database_url: str) -> str:
    """A freshly migrated database of the test's own: what its gateways' janitor does
    to the task table is then all there is (a pass's counts are exact), and janitor
    leadership (a per-database advisory lock) is not shared with other tests."""
    return await migrate(fresh_database_url)


@pytest.fixture(scope="session")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """One migrated database shared by the session; tests isolate by runtime id."""
    with temporary_database_sync(pg_admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def plans_database(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """A migrated database of its own holding the realistic task table of the EXPLAIN
    tests (tests/support/plans.py), filled and analyzed once per worker process:
    (its URL, the runtime id prefix). Nothing else writes to it, and every test on it
    runs inside a transaction that is rolled back (`conn`), so each sees the same
    rows and statistics."""
    prefix = "explain-" + secrets.token_hex(4)

    async def filled_once(url: str) -> None:
        connection = await asyncpg.connect(url)
        try:
            async with connection.transaction():
                await fill(connection, prefix)
        finally:
            await connection.close()

    with temporary_database_sync(pg_admin_url) as url:
        asyncio.run(filled_once(url))
        yield url, prefix


@pytest.fixture
async def conn(
    request: pytest.FixtureRequest, database_url: str
) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the session's shared database, closed after the test. A test that
    also asks for `filled` gets one to the plans database instead, inside a transaction
    that is rolled back: its SET LOCALs, savepoints and any row it writes end with it."""
    if "filled" not in request.fixturenames:
        connection = await asyncpg.connect(database_url)
        try:
            yield connection
        finally:
            await connection.close()
        return
    url, _ = request.getfixturevalue("plans_database")
    connection = await asyncpg.connect(url)
    tx = connection.transaction()
    await tx.start()
    try:
        yield connection
    finally:
        await tx.rollback()
        await connection.close()


@pytest.fixture
def filled(plans_database: tuple[str, str]) -> str:
    """The runtime id prefix of the realistic task table (see `plans_database`); the
    test's `conn` reaches it."""
    return plans_database[1]


@pytest.fixture
def make_pgbouncer() -> Iterator[Callable[[str], PgBouncer]]:
    """Starts a PgBouncer of the test's own in transaction pooling mode in front of a
    Postgres URL's server (every database), on a free loopback port; each is stopped
    by pid after the test."""
    binary = pgbouncer_binary()
    if binary is None:
        unavailable(
            "pgbouncer is not installed (Debian: apt-get install pgbouncer)",
            ".ci/run installs it",
        )
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
        unavailable(f"Redis at {url} is not reachable ({exc})")
    yield url
    asyncio.run(forget_keys(url, PREFIXES))


@pytest.fixture
def redis_prefix() -> str:
    """A Redis key prefix of the test's own, so tests never see each other's keys; its
    keys are deleted at the end of the session."""
    return new_prefix()


@pytest.fixture
def runtime_id() -> str:
    return "rt-" + secrets.token_hex(6)


@pytest.fixture
def redis_process(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server on a free loopback port, which the test may kill and start
    again; killed by pid after the test."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=2)
    yield client
    await client.aclose()


# The markers that say which servers a test needs, from the fixtures it uses.
_SERVER_MARKERS = {"pg_admin_url": "pg", "redis_url": "redis"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with the servers its fixtures reach (`pg`, `redis`), gives
    every item a node id of its own, and puts the slowest files first.

    Schemathesis makes one item per operation (`test_x[GET /v1/tasks/{task_id}]`)
    under one node id, and pytest-xdist's schedulers key their work by node id: all
    but one of them would never run."""
    for item in items:
        for fixture, marker in _SERVER_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        suffix = item.name[len(getattr(item, "originalname", item.name)) :]
        if suffix and not item.nodeid.endswith(suffix):
            _rename(item, item.nodeid + suffix)
    items[:] = _slowest_files_first(items)


def _slowest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """Files holding a `slow` test first, then files by their number of tests, each
    file's tests in their own order. `make test` hands whole files to its workers in
    this order (`--dist loadfile --no-loadscope-reorder`). pytest-xdist's own order,
    by number of tests alone, left the one-test files that take 25 to 50 s to the end,
    where one worker ran them while the others stood idle."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    ordered = sorted(
        files.values(),
        key=lambda tests: (not any(t.get_closest_marker("slow") for t in tests), -len(tests)),
    )
    return [item for tests in ordered for item in tests]


def _rename(item: pytest.Item, nodeid: str) -> None:
    # pytest has no public way to set a node id; 9.2 keeps it as a structured `_id`,
    # earlier releases as the string `_nodeid`.
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid
