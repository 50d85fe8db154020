"""`gateway serve` as a new user meets it when something is missing: each failed start
says why in one or two lines on stderr, exits with its documented code (2 configuration,
3 unreachable or port in use, 4 schema to migrate), shows no traceback and no banner;
and with GATEWAY_STARTUP_RETRY_SECONDS it waits for Postgres, listening meanwhile.

Every test starts the real process and reads its stderr line by line."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
import pytest

from gateway.store.migrate import apply_migrations, migrations_dir
from tests.support.databases import execute
from tests.support.gateways import TOKEN, serve_env, serve_process, serve_refused, start_serving
from tests.support.net import free_port
from tests.support.proxy import BlackholeProxy
from tests.support.waiting import within

MIGRATE_FIX = (
    "gateway: run `gateway migrate` (or start with `gateway serve --migrate`), then start again"
)
# A text log line's time stamp, "2026-11-27 17:00:53,708 ", left out of comparisons.
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")


def with_port(url: str, port: int, password: str | None = None) -> str:
    """`url` pointing at 127.0.0.1:port (as user:password when given)."""
    parts = urlsplit(url)
    user = parts.username or "postgres"
    auth = f"{user}:{password}" if password else user
    return parts._replace(netloc=f"{auth}@127.0.0.1:{port}").geturl()


def where(url: str) -> str:
    """How a message names a database URL's database: `database NAME at HOST:PORT`."""
    parts = urlsplit(url)
    return f"database {parts.path.lstrip('/')} at {parts.hostname}:{parts.port or 5432}"


def unstamped(lines: list[str]) -> list[str]:
    return [STAMP.sub("", line) for line in lines]


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


@pytest.fixture
def env(database_url: str, redis_url: str, redis_prefix: str) -> dict[str, str]:
    """What a correct start needs: the session's migrated database, Redis, a token."""
    return serve_env(database_url, redis_url, redis_prefix)


# -- configuration: exit 2 ---------------------------------------------------------


async def test_without_database_url_it_says_so_first(env):
    # GATEWAY_ADMIN_TOKEN is missing too: the database comes first.
    code, lines = await serve_refused(env=without(env, "DATABASE_URL", "GATEWAY_ADMIN_TOKEN"))
    assert (code, lines) == (
        2,
        [
            "gateway: DATABASE_URL is not set: point it at Postgres "
            "(postgresql://user:password@host:5432/database), "
            "or run `gateway serve --embedded` for development"
        ],
    )


async def test_a_database_url_of_another_database_is_refused(env):
    code, lines = await serve_refused(env={**env, "DATABASE_URL": "mysql://u:hunter22@db/tasks"})
    assert (code, lines) == (
        2,
        [
            "gateway: DATABASE_URL must be a postgresql:// (or postgres://) URL, got mysql://: "
            "the gateway stores its tasks in Postgres only"
        ],
    )


async def test_a_redis_url_without_a_scheme_is_refused(env):
    code, lines = await serve_refused(env={**env, "REDIS_URL": "localhost:6379"})
    assert (code, lines) == (
        2,
        [
            "gateway: REDIS_URL cannot be used: Redis URL must specify one of the following "
            "schemes (redis://, rediss://, unix://)"
        ],
    )


async def test_an_unknown_redis_mode_is_refused(env):
    code, lines = await serve_refused(env={**env, "GATEWAY_REDIS_MODE": "replicated"})
    assert (code, lines) == (
        2,
        [
            "gateway: GATEWAY_REDIS_MODE must be one of standalone, cluster, sentinel, "
            "got 'replicated'"
        ],
    )


async def test_a_bad_retry_setting_is_refused(env):
    code, lines = await serve_refused(env={**env, "GATEWAY_STARTUP_RETRY_SECONDS": "-1"})
    assert (code, lines) == (
        2,
        ["gateway: GATEWAY_STARTUP_RETRY_SECONDS must be between 0 and 3600, got '-1'"],
    )


# -- unreachable, port in use: exit 3 ------------------------------------------------


async def test_postgres_down_is_one_line_naming_the_host_without_the_password(env):
    closed = free_port()  # nothing listens there
    url = with_port(env["DATABASE_URL"], closed, password="s3cret-pw")
    code, lines = await serve_refused(env={**env, "DATABASE_URL": url})
    assert (code, lines) == (
        3,
        [f"gateway: cannot connect to Postgres at 127.0.0.1:{closed}: connection refused"],
    )


async def test_debug_adds_the_traceback_above_the_same_line(env):
    closed = free_port()
    env = {**env, "DATABASE_URL": with_port(env["DATABASE_URL"], closed)}
    code, lines = await serve_refused(env=env, log_level="debug")
    assert code == 3
    assert "Traceback (most recent call last):" in lines
    assert (
        lines[-1]
        == f"gateway: cannot connect to Postgres at 127.0.0.1:{closed}: connection refused"
    )


CTRL_C_ABLE = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from gateway.cli.main import main; main(sys.argv[1:])"
)


async def test_ctrl_c_while_postgres_does_not_answer_exits_130_quietly(env):
    with socket.socket() as silent:  # accepts connections, never answers on them
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.setblocking(False)
        port = silent.getsockname()[1]
        env = {**env, "DATABASE_URL": with_port(env["DATABASE_URL"], port)}
        # As from a terminal: Ctrl-C's SIGINT interrupts, even where this test runs
        # with SIGINT ignored (a background job of a shell), which a child inherits.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CTRL_C_ABLE, "serve", "--port", str(free_port()),
            env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(20):
                connection, _ = await asyncio.get_running_loop().sock_accept(silent)
            with connection:  # the start waits for Postgres's answer now
                proc.send_signal(signal.SIGINT)
                async with asyncio.timeout(20):
                    _, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert (proc.returncode, err.decode()) == (130, "")


async def test_a_port_in_use_is_one_line_and_no_banner(env):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, lines = await serve_refused(env=env, port=port)
    assert (code, lines) == (
        3,
        [
            f"gateway: port {port} on 127.0.0.1 is in use: stop what listens there, "
            "or choose another port with --port"
        ],
    )


async def test_embedded_postgres_that_cannot_start_is_one_line(env, tmp_path):
    (tmp_path / "postgres").write_text("a file where its data folder goes\n")
    code, lines = await serve_refused(
        "--embedded", "--data-dir", str(tmp_path),
        env=without(env, "DATABASE_URL", "REDIS_URL", "GATEWAY_ADMIN_TOKEN"),
    )  # fmt: skip
    assert (code, lines) == (
        3,
        [
            f"gateway: embedded Postgres failed: initdb: error: could not access directory "
            f'"{tmp_path / "postgres"}": Not a directory'
        ],
    )


# -- the schema: exit 4, or a warning ------------------------------------------------


async def test_a_database_never_migrated_is_refused(env, fresh_database_url):
    code, lines = await serve_refused(env={**env, "DATABASE_URL": fresh_database_url})
    assert (code, lines) == (
        4,
        [f"gateway: {where(fresh_database_url)} has no claim-gateway schema", MIGRATE_FIX],
    )


async def test_an_older_schema_is_refused_naming_what_is_pending(env, fresh_database_url, tmp_path):
    files = sorted(migrations_dir().glob("*.sql"))
    for path in files[:5]:
        shutil.copy(path, tmp_path)
    await apply_migrations(fresh_database_url, tmp_path, log=lambda _line: None)
    code, lines = await serve_refused(env={**env, "DATABASE_URL": fresh_database_url})
    newest = files[-1].name.split("_")[0]
    pending = ", ".join(path.name for path in files[5:])
    assert (code, lines) == (
        4,
        [
            f"gateway: {where(fresh_database_url)} is at migration 0005 of {newest} "
            f"(pending: {pending})",
            MIGRATE_FIX,
        ],
    )


async def test_migrate_applies_what_is_pending_and_starts(env, fresh_database_url):
    env = {**env, "DATABASE_URL": fresh_database_url}
    async with serve_process("--migrate", env=env) as (_, base):
        async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as resp:
            assert resp.status == 200


async def test_a_newer_schema_starts_with_one_warning(env, own_database_url):
    newer = "9999_from_a_newer_release.sql"
    await execute(
        own_database_url,
        "INSERT INTO schema_migrations (version, name, checksum) VALUES (9999, $1, 'x')",
        newer,
    )
    env = {**env, "DATABASE_URL": own_database_url}
    async with serve_process(env=env) as (proc, base):
        async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as resp:
            assert resp.status == 200
        proc.terminate()
        assert await proc.wait() == 0
        lines = unstamped((await proc.stderr.read()).decode().splitlines())  # type: ignore[union-attr]
    newest = sorted(migrations_dir().glob("*.sql"))[-1].name.split("_")[0]
    # Only the schema's: a loaded machine may add others (Redis slow to answer its ping).
    warnings = [line for line in lines if line.startswith("WARNING") and "migration" in line]
    assert warnings == [
        f"WARNING gateway: {where(own_database_url)} is at migration 9999 ({newer}), newer "
        f"than this release, which knows up to {newest}: starting anyway, as after a rollback "
        "(a migration keeps the release before it working)"
    ]


# -- waiting for Postgres: GATEWAY_STARTUP_RETRY_SECONDS -----------------------------


@pytest.fixture
async def late_postgres(pg_admin_url: str) -> AsyncIterator[BlackholeProxy]:
    """A port where nothing listens until the test calls `start()`: then it forwards to
    the test Postgres, as a database that comes up after the gateway."""
    proxy = BlackholeProxy(urlsplit(pg_admin_url).port or 5432)
    yield proxy
    await proxy.close()


async def answer(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    async with http.get(url) as resp:
        return resp.status, await resp.json(content_type=None)


async def waiting_for(http: aiohttp.ClientSession, base: str) -> str:
    """What /readyz says the start waits for, once it has tried once (before, it says
    that it is connecting); fails the test if /healthz is not 200 meanwhile."""
    said: list[str] = []

    async def tried() -> bool:
        try:
            status, body = await answer(http, base + "/readyz")
        except aiohttp.ClientConnectionError:
            return False  # not listening yet
        assert status == 503, body
        assert (await answer(http, base + "/healthz")) == (200, {"status": "ok"})
        said[:] = body["problems"]
        return not said[0].startswith("connecting to")

    await within(20, tried)
    (problem,) = said
    return problem


async def test_it_waits_for_postgres_listening_then_becomes_ready(env, late_postgres):
    waiting = f"waiting for Postgres at 127.0.0.1:{late_postgres.port}: connection refused"
    env = {
        **env,
        "DATABASE_URL": with_port(env["DATABASE_URL"], late_postgres.port),
        "GATEWAY_STARTUP_RETRY_SECONDS": "60",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = await start_serving(env=env, port=port)
    try:
        async with aiohttp.ClientSession() as http:
            problem = await waiting_for(http, base)
            assert re.fullmatch(re.escape(waiting) + r" \(retrying for \d+ s more\)", problem)
            status, body = await answer(http, f"{base}/v1/runtimes/rt/tasks/{'0' * 32}")
            assert (status, body["code"]) == (503, "store_unavailable")
            assert body["detail"].startswith("the gateway is starting: " + waiting)

            await late_postgres.start()

            async def ready() -> bool:
                return (await answer(http, base + "/readyz"))[0] == 200

            await within(20, ready)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with http.get(f"{base}/v1/runtimes/rt/stats", headers=headers) as resp:
                assert resp.status == 200
        proc.terminate()
        assert await proc.wait() == 0
        lines = unstamped((await proc.stderr.read()).decode().splitlines())  # type: ignore[union-attr]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (
        f"WARNING gateway: {waiting}; retrying until 60 s from the start have passed "
        "(GATEWAY_STARTUP_RETRY_SECONDS), /readyz answers 503 meanwhile"
    ) in lines
    ready_at = next(
        i for i, line in enumerate(lines)
        if re.fullmatch(r"INFO    gateway: the database is ready after \d+\.\d s of waiting", line)
    )  # fmt: skip
    # The banner comes once the gateway is ready, not before.
    assert lines.index("claim-gateway is up") > ready_at


async def test_it_waits_for_the_migrations_of_a_job_running_meanwhile(env, fresh_database_url):
    env = {**env, "DATABASE_URL": fresh_database_url, "GATEWAY_STARTUP_RETRY_SECONDS": "60"}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = await start_serving(env=env, port=port)
    try:
        async with aiohttp.ClientSession() as http:
            problem = await waiting_for(http, base)
            waiting = (
                f"waiting for migrations: {where(fresh_database_url)} has no claim-gateway schema"
            )
            assert re.fullmatch(re.escape(waiting) + r" \(retrying for \d+ s more\)", problem)

            await apply_migrations(fresh_database_url, log=lambda _line: None)

            async def ready() -> bool:
                return (await answer(http, base + "/readyz"))[0] == 200

            await within(20, ready)
        proc.terminate()
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_when_the_wait_runs_out_it_exits_3(env):
    closed = free_port()
    env = {
        **env,
        "DATABASE_URL": with_port(env["DATABASE_URL"], closed),
        "GATEWAY_STARTUP_RETRY_SECONDS": "0.5",
    }
    port = free_port()
    proc = await start_serving(env=env, port=port)
    try:
        async with asyncio.timeout(20):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 3
    waiting = f"Postgres at 127.0.0.1:{closed}: connection refused"
    assert unstamped(err.decode().splitlines()) == [
        f"INFO    uvicorn.error: Started server process [{proc.pid}]",
        f"WARNING gateway: waiting for {waiting}; retrying until 0.5 s from the start have "
        "passed (GATEWAY_STARTUP_RETRY_SECONDS), /readyz answers 503 meanwhile",
        "INFO    uvicorn.error: Shutting down",
        f"INFO    uvicorn.error: Finished server process [{proc.pid}]",
        f"gateway: cannot connect to {waiting} (retried for 0.5 s: GATEWAY_STARTUP_RETRY_SECONDS)",
    ]
