"""Operations under hostile use: a bound on parked polls, readiness that leaks nothing,
RFC 6750 challenges, one log record per failure, quiet client disconnects, and no
weak admin token (security issue, defects 6 to 10 and 12)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from urllib.parse import urlsplit

import pytest

from gateway.errors import StoreUnavailable
from tests.support.gateways import TOKEN, gateway
from tests.support.http import req
from tests.support.lifecycle import assert_problem, claim, enqueue
from tests.support.metrics import sample
from tests.support.net import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")


# -- defect 6: parked polls are bounded ------------------------------------------------


async def test_polls_beyond_the_parked_limit_get_429_and_parked_ones_are_unaffected(
    database_url, redis_url, runtime_id
):
    async with gateway(database_url, redis_url, max_parked_polls=2) as gw:
        parked = [
            asyncio.create_task(claim(gw, runtime_id, f"p{i}", wait_seconds=10)) for i in range(2)
        ]
        await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) >= 2, 5, "2 parked polls")
        path = f"/v1/runtimes/{runtime_id}/claim"
        over = await req(gw, "POST", path, {"worker_id": "late", "wait_seconds": 10})
        assert_problem(over, 429, "overloaded")
        assert int(over.headers["Retry-After"]) >= 1
        assert "GATEWAY_MAX_PARKED_POLLS" in over.body["detail"]
        # A claim that does not wait is not a parked poll: it is served as usual.
        assert (await req(gw, "POST", path, {"worker_id": "now"})).body == {"tasks": []}
        first = await enqueue(gw, runtime_id, "a")
        second = await enqueue(gw, runtime_id, "b")
        async with asyncio.timeout(5):
            got = await asyncio.gather(*parked)
        assert sorted(t[0]["id"] for t in got) == sorted([first["id"], second["id"]])
        # At the limit, work that is there is still handed out rather than refused.
        blockers = [
            asyncio.create_task(claim(gw, runtime_id, f"q{i}", wait_seconds=10)) for i in range(2)
        ]
        await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) >= 2, 5, "2 parked polls")
        # Enqueued behind the parked polls' backs: they would take it, so give them theirs.
        third = await enqueue(gw, runtime_id, "c")
        fourth = await enqueue(gw, runtime_id, "d")
        async with asyncio.timeout(5):
            served = await asyncio.gather(*blockers)
        assert sorted(t[0]["id"] for t in served) == sorted([third["id"], fourth["id"]])
        assert sample(gw, "gateway_claims_rejected_total", reason="parked_polls") == 1


async def test_at_the_limit_a_waiting_claim_still_gets_work_that_is_there(
    database_url, redis_url, runtime_id
):
    async with gateway(database_url, redis_url, max_parked_polls=1) as gw:
        other = runtime_id + "-idle"
        parked = asyncio.create_task(claim(gw, other, "p", wait_seconds=10))
        await wait_until(lambda: gw.gateway.claimer.parked(other) >= 1, 5, "a parked poll")
        task = await enqueue(gw, runtime_id, "ready")
        got = await claim(gw, runtime_id, "w", wait_seconds=10)
        assert [t["id"] for t in got] == [task["id"]]
        parked.cancel()


# -- defect 7: readiness names the component only ----------------------------------------


async def test_readyz_names_the_failing_component_and_logs_the_detail(gw, monkeypatch, server_logs):
    secret = "connection to db-primary.internal:5432 for database 'payroll' refused"

    async def failing() -> bool:
        raise StoreUnavailable(f"database error: {secret}")

    monkeypatch.setattr(gw.gateway.store, "schema_is_current", failing)
    resp = await req(gw, "GET", "/readyz", auth=None)
    # Still ready: the database is every instance's (docs/operations/failover.md).
    assert resp.status == 200
    assert resp.body == {"status": "ready", "degraded": ["database unavailable"]}
    assert any(secret in r.getMessage() for r in server_logs.records)


# -- defect 8: 401 carries a Bearer challenge --------------------------------------------


async def test_401_carries_www_authenticate(gw, runtime_id):
    path = f"/v1/runtimes/{runtime_id}/stats"
    missing = await req(gw, "GET", path, auth=None)
    assert_problem(missing, 401, "unauthorized")
    assert missing.headers["WWW-Authenticate"] == 'Bearer realm="claim-gateway"'
    wrong = await req(gw, "GET", path, auth="not-the-token")
    assert_problem(wrong, 401, "unauthorized")
    assert wrong.headers["WWW-Authenticate"] == (
        'Bearer realm="claim-gateway", error="invalid_token"'
    )


# -- defect 9: one traceback per unexpected error ----------------------------------------


async def test_an_unexpected_error_is_logged_once(gw, runtime_id, monkeypatch, server_logs):
    async def broken(runtime_id: str) -> object:
        raise RuntimeError("a bug nobody expected")

    monkeypatch.setattr(gw.gateway.store, "stats", broken)
    resp = await req(gw, "GET", f"/v1/runtimes/{runtime_id}/stats")
    assert_problem(resp, 500, "internal_error")
    assert "a bug nobody expected" not in resp.body["detail"]
    await asyncio.sleep(0.2)  # the server logs after the answer is sent
    tracebacks = [r for r in server_logs.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]


# -- defect 10: a client that leaves mid-body is not an error ------------------------------


async def test_a_client_leaving_mid_body_is_not_logged_as_an_error(gw, runtime_id, server_logs):
    url = urlsplit(gw.url)
    _reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(
        f"POST /v1/runtimes/{runtime_id}/tasks HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
        '{"payload": "only part'.encode()
    )
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    await writer.wait_closed()
    await asyncio.sleep(0.5)
    errors = [r for r in server_logs.records if r.levelno >= logging.WARNING or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]
    assert (await req(gw, "GET", f"/v1/runtimes/{runtime_id}/tasks")).body["tasks"] == []


# -- defect 12: a weak admin token stops the start ----------------------------------------


async def test_serve_refuses_a_short_admin_token(database_url, redis_url):
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GATEWAY_ADMIN_TOKEN": "x",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(free_port()),
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # it started after all: stop it, then fail
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2
    assert b"GATEWAY_ADMIN_TOKEN must be at least 32 characters" in err, err


async def test_a_trailing_slash_is_a_404_problem_not_a_redirect(gw, runtime_id):
    resp = await req(
        gw, "GET", f"/v1/runtimes/{runtime_id}/tasks/", headers={"Host": "evil.example"}
    )
    assert_problem(resp, 404, "not_found")
    assert "Location" not in resp.headers
