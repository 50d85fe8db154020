"""The gateway behind PgBouncer in transaction pooling mode (PgBouncer 1.18's defaults
otherwise): named prepared statements and startup parameters do not survive it, and a
session advisory lock taken through it would sit on a server connection that other
clients share. Two gateways go through a PgBouncer of the test's own, with
GATEWAY_DB_STATEMENT_CACHE_SIZE=0 and the janitor's lock on a direct URL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from gateway.cli.embedded import EmbeddedServers
from gateway.errors import StoreUnavailable
from gateway.metrics import Metrics
from gateway.store import Store
from tests.support.claims import task_rows
from tests.support.databases import fetch
from tests.support.gateways import Instance, running_gateway
from tests.support.http import call_ok
from tests.support.janitor import janitor_settings, wait_lapsed
from tests.support.metrics import sample
from tests.support.pgbouncer import PgBouncer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@contextlib.asynccontextmanager
async def two_gateways(
    database_url: str, bouncer: PgBouncer, redis_url: str, prefix: str, **overrides: Any
) -> AsyncIterator[tuple[Instance, Instance]]:
    """Two gateways whose pools go through PgBouncer; their janitor locks go direct."""
    cfg = janitor_settings(
        bouncer.url(database_url),
        redis_url,
        prefix,
        direct_database_url=database_url,
        db_statement_cache_size=0,
        **overrides,
    )
    async with running_gateway(cfg) as a, running_gateway(cfg) as b:
        yield a, b


async def test_the_lifecycle_through_pgbouncer(
    own_database_url: str, pgbouncer: PgBouncer, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Both gateways start (no refused startup parameter), are ready, and every task
    operation, batch and token works through the pooler."""
    async with two_gateways(own_database_url, pgbouncer, redis_url, redis_prefix) as (a, b):
        for inst in (a, b):
            async with inst.http.get(inst.url + "/readyz") as resp:
                assert resp.status == 200, await resp.text()

        task = await a.enqueue(runtime_id, {"n": 1}, idempotency_key="k1")
        assert (
            await a.call(
                "POST",
                f"/v1/runtimes/{runtime_id}/tasks",
                {"payload": {"n": 1}, "idempotency_key": "k1"},
            )
        )[0] == 200
        [got] = await b.claim(runtime_id, "w1", wait_seconds=1)
        assert got["id"] == task["id"]
        beat = await call_ok(
            a, "POST", f"/v1/tasks/{got['id']}/heartbeat", {"lease_id": got["lease_id"]}
        )
        assert beat["status"] == "claimed"
        status, done = await b.complete(got, result={"ok": True})
        assert status == 200 and done["status"] == "completed" and done["result"] == {"ok": True}

        status, batch = await b.call(
            "POST",
            f"/v1/runtimes/{runtime_id}/tasks:batch",
            {"tasks": [{"payload": {"n": n}} for n in range(3)]},
        )
        assert status == 201, batch
        held = await a.claim(runtime_id, "w2", max_tasks=3)
        assert sorted(t["id"] for t in held) == sorted(t["id"] for t in batch["tasks"])
        failed = await call_ok(
            b,
            "POST",
            f"/v1/tasks/{held[0]['id']}/fail",
            {"lease_id": held[0]["lease_id"], "error": "x", "retry": False},
        )
        assert failed["status"] == "dead"
        retried = await call_ok(a, "POST", f"/v1/tasks/{held[0]['id']}/retry")
        assert retried["status"] == "queued"
        released = await call_ok(
            a, "POST", f"/v1/tasks/{held[1]['id']}/release", {"lease_id": held[1]["lease_id"]}
        )
        assert released["status"] == "queued"
        cancelled = await call_ok(b, "POST", f"/v1/tasks/{held[1]['id']}/cancel")
        assert cancelled["status"] == "cancelled"

        stats = await call_ok(a, "GET", f"/v1/runtimes/{runtime_id}/stats")
        assert stats["counts"]["completed"] == 1 and stats["counts"]["claimed"] == 1
        listed = await call_ok(b, "GET", f"/v1/runtimes/{runtime_id}/tasks?limit=2")
        assert len(listed["tasks"]) == 2 and listed["next_cursor"]

        made = await a.call("POST", "/v1/admin/tokens", {"name": "reader", "scopes": ["read"]})
        assert made[0] == 201, made
        headers = {"Authorization": f"Bearer {made[1]['token']}"}
        async with b.http.get(f"{b.url}/v1/tasks/{task['id']}", headers=headers) as resp:
            assert resp.status == 200


async def test_lapsed_leases_are_reclaimed_once_by_one_leader(
    own_database_url: str, pgbouncer: PgBouncer, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """Both janitors run every 0.2 s; one leads, and only it reclaims. Every lapsed
    lease is reclaimed exactly once: each task is queued again with one attempt, and
    handed out again once."""
    n = 20
    async with two_gateways(
        own_database_url, pgbouncer, redis_url, redis_prefix, janitor_interval_seconds=0.2
    ) as instances:
        a, b = instances
        ids = {(await a.enqueue(runtime_id, {"n": k}))["id"] for k in range(n)}
        held = await b.claim(runtime_id, "vanishing", max_tasks=n, lease_seconds=1)
        assert {t["id"] for t in held} == ids
        leaders: set[int] = set()

        def reclaimed() -> float:
            leaders.update(k for k, i in enumerate(instances) if i.gateway.janitor.is_leader)
            return sum(
                sample(i, "gateway_leases_reclaimed_total", outcome="queued") for i in instances
            )

        await wait_lapsed(own_database_url, sorted(ids))
        deadline = time.monotonic() + 10
        while reclaimed() < n:
            assert time.monotonic() < deadline, f"{reclaimed()} of {n} reclaimed"
            assert sum(i.gateway.janitor.is_leader for i in instances) <= 1
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)  # three more passes: nothing is reclaimed twice
        assert reclaimed() == n
        assert len(leaders) == 1, "leadership moved or was shared"
        [leader] = leaders
        assert (
            sample(instances[1 - leader], "gateway_leases_reclaimed_total", outcome="queued") == 0
        )

        rows = await fetch(
            own_database_url,
            "SELECT status, attempts, last_error FROM tasks WHERE runtime_id = $1",
            runtime_id,
        )
        assert Counter((r["status"], r["attempts"], r["last_error"]) for r in rows) == {
            ("queued", 1, "lease expired"): n
        }
        again = await a.claim(runtime_id, "second", max_tasks=n, wait_seconds=1)
        assert sorted(t["id"] for t in again) == sorted(ids)
        assert {t["attempts"] for t in again} == {2}


async def test_concurrent_pollers_on_both_gateways_get_each_task_once(
    own_database_url: str, pgbouncer: PgBouncer, redis_url: str, redis_prefix: str, runtime_id: str
) -> None:
    """200 tasks enqueued on both gateways while 10 long-polling clients (5 on each)
    claim 1-5 at a time and complete: every task is handed out once, with one lease."""
    total, pollers = 200, 10
    rng = random.Random()
    async with two_gateways(own_database_url, pgbouncer, redis_url, redis_prefix) as instances:
        handed_out: list[tuple[str, str]] = []
        problems: list[Any] = []
        deadline = time.monotonic() + 30

        async def poller(k: int) -> None:
            inst = instances[k % 2]
            while len(handed_out) < total and time.monotonic() < deadline:
                status, body = await inst.call(
                    "POST",
                    f"/v1/runtimes/{runtime_id}/claim",
                    {"worker_id": f"p{k}", "max_tasks": rng.randint(1, 5), "wait_seconds": 1},
                )
                if status != 200:
                    problems.append(("claim", status, body))
                    return
                for task in body["tasks"]:
                    handed_out.append((task["id"], task["lease_id"]))
                    status, done = await rng.choice(instances).complete(task)
                    if status != 200 or done["status"] != "completed":
                        problems.append(("complete", status, done))

        async def enqueue(inst: Instance, first: int) -> list[str]:
            ids = []
            for start in range(first, total, 40):
                status, body = await inst.call(
                    "POST",
                    f"/v1/runtimes/{runtime_id}/tasks:batch",
                    {"tasks": [{"payload": {"n": m}} for m in range(start, start + 20)]},
                )
                assert status == 201, body
                ids += [t["id"] for t in body["tasks"]]
            return ids

        polling = [asyncio.create_task(poller(k)) for k in range(pollers)]
        made = await asyncio.gather(enqueue(instances[0], 0), enqueue(instances[1], 20))
        await asyncio.wait_for(asyncio.gather(*polling), 40)

        assert problems == []
        enqueued = made[0] + made[1]
        assert len(set(enqueued)) == total
        twice = {i: c for i, c in Counter(i for i, _ in handed_out).items() if c > 1}
        assert twice == {}
        assert sorted(i for i, _ in handed_out) == sorted(enqueued)
        assert len({lease for _, lease in handed_out}) == total
        rows = await task_rows(own_database_url, runtime_id)
        assert Counter((r["status"], r["attempts"]) for r in rows) == {("completed", 1): total}


async def _data_directory(url: str) -> str:
    # PgBouncer keeps a client waiting while it retries a server it cannot reach.
    conn = await asyncpg.connect(url, statement_cache_size=0, timeout=10)
    try:
        return str(await conn.fetchval("SELECT current_setting('data_directory')"))
    finally:
        await conn.close()


async def test_pgbouncer_reaches_the_embedded_server_over_its_socket(
    embedded: EmbeddedServers, make_pgbouncer: Callable[[str], PgBouncer]
) -> None:
    """The embedded Postgres listens only on a unix socket in its data directory (its
    own system user's when the suite runs as root): the test's PgBouncer reaches that
    server, not whatever listens on 127.0.0.1:5432. Runs with TEST_DATABASE_URL set too."""
    url = embedded.start_postgres()
    assert "?host=/" in url, url
    bouncer = make_pgbouncer(url)
    pgdata = str(embedded.data_dir / "postgres")
    assert await _data_directory(url) == pgdata
    try:
        through = await _data_directory(bouncer.url(url))
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        pytest.fail(f"through PgBouncer: {exc!r}; its log:\n{bouncer.log}")
    assert through == pgdata


async def _active(direct: str, marker: str) -> int:
    conn = await asyncpg.connect(direct)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                " AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()",
                marker,
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
async def test_the_statement_timeout_stops_statements_on_the_server(
    database_url: str, pgbouncer: PgBouncer, through: str
) -> None:
    """The gateway's statement timeout (here 300 ms) without a startup parameter: a
    transaction's statement is stopped by Postgres (SET LOCAL in its BEGIN), a statement
    of its own by the driver's cancel; either way nothing keeps running on the server,
    and the setting does not outlive its transaction."""
    url = database_url if through == "direct" else pgbouncer.url(database_url)
    store = Store(
        url, Metrics(), min_size=1, max_size=2, statement_timeout_ms=300, statement_cache_size=0
    )
    await store.open()
    try:
        marker = "slow_" + secrets.token_hex(4)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.run(lambda c: c.fetchval(f"SELECT pg_sleep(5) AS {marker}"))
        assert time.monotonic() - started < 2

        async def in_transaction(c: asyncpg.Connection) -> None:
            async with store._transaction(c):
                # The driver would wait 10 s: only the server's timeout can stop it.
                await c.fetchval(f"SELECT pg_sleep(5) AS {marker}", timeout=10)

        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            await store.run(in_transaction)
        assert time.monotonic() - started < 2
        assert isinstance(info.value.__cause__, asyncpg.QueryCanceledError)

        for _ in range(40):
            if await _active(database_url, marker) == 0:
                break
            await asyncio.sleep(0.05)
        assert await _active(database_url, marker) == 0, "a timed-out statement still runs"
        for _ in range(4):
            assert await store.run(lambda c: c.fetchval("SHOW statement_timeout")) == "0"
    finally:
        await store.close()


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
async def test_a_slow_claim_is_stopped_on_the_server(
    database_url: str,
    pgbouncer: PgBouncer,
    through: str,
    runtime_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim is one statement without an explicit transaction, so no SET LOCAL
    bounds it: the driver's timeout (the statement timeout setting, here 300 ms) does,
    and its cancel request, forwarded by PgBouncer, stops the statement on the server.
    The statement is made slow on purpose (a 5 s sleep inside it)."""
    from gateway.store.sql import leases as lease_sql

    marker = "slow_claim_" + secrets.token_hex(4)
    slow = lease_sql.CLAIM.replace(
        lease_sql.NEXT_DUE,
        lease_sql.NEXT_DUE.replace("FROM tasks", f"FROM pg_sleep(5) AS {marker}, tasks", 1),
        1,
    )
    assert marker in slow
    monkeypatch.setattr(lease_sql, "CLAIM", slow)
    url = database_url if through == "direct" else pgbouncer.url(database_url)
    store = Store(
        url, Metrics(), min_size=1, max_size=2, statement_timeout_ms=300, statement_cache_size=0
    )
    await store.open()
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.claim(runtime_id, ["w"], [60.0])
        assert isinstance(info.value.__cause__, TimeoutError), repr(info.value.__cause__)
        for _ in range(40):
            if await _active(database_url, marker) == 0:
                break
            await asyncio.sleep(0.05)
        assert await _active(database_url, marker) == 0, "the timed-out claim still runs"
        # The pool's connection is usable again, and nothing was leased.
        monkeypatch.undo()
        assert await store.claim(runtime_id, ["w"], [60.0]) == ([], None)
    finally:
        await store.close()


@pytest.mark.parametrize("cache_size", [100, 0])
async def test_which_prepared_statements_survive_transaction_pooling(
    database_url: str, pgbouncer: PgBouncer, cache_size: int, caplog: pytest.LogCaptureFixture
) -> None:
    """What asyncpg does through PgBouncer 1.18: its named, cached statements land on
    server connections other clients then use (errors, and a log line naming the
    setting); with the cache off it still prepares, but unnamed, and its Parse and
    Describe end with a Flush, not a Sync, so the statement and its execution stay on
    one server connection: correct answers under concurrency."""
    store = Store(
        pgbouncer.url(database_url),
        Metrics(),
        min_size=1,
        max_size=30,
        statement_cache_size=cache_size,
    )
    await store.open()
    errors: list[str] = []
    wrong: list[Any] = []

    async def client(k: int) -> None:
        for i in range(20):
            query = f"SELECT $1::int * {k} + {i % 3} AS x"
            try:
                x = await store.run(lambda c, q=query: c.fetchval(q, i))  # noqa: B023
            except StoreUnavailable as exc:
                errors.append(type(exc.__cause__).__name__)
                continue
            if x != i * k + i % 3:
                wrong.append((k, i, x))

    try:
        with caplog.at_level(logging.ERROR, logger="gateway.store"):
            await asyncio.gather(*(client(k) for k in range(1, 31)))
    finally:
        await store.close()
    assert wrong == []
    if cache_size:
        assert errors, "named prepared statements survived PgBouncer (unexpected)"
        assert any("GATEWAY_DB_STATEMENT_CACHE_SIZE=0" in r.getMessage() for r in caplog.records)
    else:
        assert errors == []


async def test_a_session_lock_taken_through_pgbouncer_is_lost_to_other_clients(
    database_url: str, pgbouncer: PgBouncer
) -> None:
    """Why the janitor's lock needs GATEWAY_DIRECT_DATABASE_URL: through the pooler the
    lock stays on a server connection that the next client gets (PgBouncer hands out
    its most recently used one), and that client then holds the lock as well: two
    leaders, while a direct session correctly finds it taken."""
    key = 880_000 + secrets.randbelow(10_000)
    store = Store(
        pgbouncer.url(database_url),
        Metrics(),
        min_size=1,
        max_size=2,
        lock_dsn=pgbouncer.url(database_url),
        statement_cache_size=0,
    )
    await store.open()
    direct = await asyncpg.connect(database_url)
    try:
        leadership = await store.try_leadership(key)
        assert leadership is not None
        other = await asyncpg.connect(pgbouncer.url(database_url), statement_cache_size=0)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", key) is True
        finally:
            await other.close()
        assert await direct.fetchval("SELECT pg_try_advisory_lock($1)", key) is False
        await leadership.release()
    finally:
        await direct.close()
        await store.close()


async def test_a_direct_lock_is_held_until_its_session_lets_go(database_url: str) -> None:
    key = 890_000 + secrets.randbelow(10_000)
    store = Store(database_url, Metrics())
    leadership = await store.try_leadership(key)
    assert leadership is not None
    try:
        assert await leadership.held() is True
        assert await store.try_leadership(key) is None
        await leadership._conn.execute("SELECT pg_advisory_unlock_all()")
        assert await leadership.held() is False
    finally:
        await leadership.release()


def test_migrate_takes_its_lock_over_the_direct_url(
    fresh_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gateway migrate` prefers GATEWAY_DIRECT_DATABASE_URL: DATABASE_URL (here a port
    where nothing listens, standing for the pooler) is not used."""
    from gateway.cli.main import build_parser, cmd_migrate
    from tests.support.net import free_port

    monkeypatch.setenv("DATABASE_URL", f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    monkeypatch.setenv("GATEWAY_DIRECT_DATABASE_URL", fresh_database_url)
    assert cmd_migrate(build_parser().parse_args(["migrate"])) == 0
    assert cmd_migrate(build_parser().parse_args(["migrate", "--check"])) == 0
