"""Revocation reaches every instance within 5 s (each caches for at most 2 s), and no
secret ever reaches a log."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.auth.principals import TOKEN_CACHE_TTL_SECONDS
from gateway.auth.webhooks import SECRET_CACHE_TTL_SECONDS
from tests.support.credentials import deliver, make_secret, make_token, sign, unique
from tests.support.gateways import TOKEN, gateway, serve_env, serve_process
from tests.support.http import req
from tests.support.lifecycle import all_tasks
from tests.support.waiting import within

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LIMIT_SECONDS = 5.0


async def gateway_cli(database_url: str, *args: str) -> tuple[int, str, str]:
    """`gateway ARGS` as a process, without blocking the gateways in this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args,
        cwd=REPO, env={**os.environ, "DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def test_caches_live_at_most_two_seconds():
    assert TOKEN_CACHE_TTL_SECONDS <= 2.0 and SECRET_CACHE_TTL_SECONDS <= 2.0


@pytest.mark.parametrize("how", ["cli", "api"])
async def test_a_revoked_token_is_refused_by_both_instances_within_5s(
    database_url, redis_url, runtime_id, how
):
    async with gateway(database_url, redis_url) as a, gateway(database_url, redis_url) as b:
        token = await make_token(a, ["read"], [runtime_id])
        path = f"/v1/runtimes/{runtime_id}/stats"

        async def status(inst) -> int:
            return (await req(inst, "GET", path, auth=token["token"])).status

        # Both instances know the token now, and keep it in their caches.
        assert (await status(a), await status(b)) == (200, 200)
        if how == "cli":
            code, _, err = await gateway_cli(database_url, "token", "revoke", token["name"])
            assert code == 0, err
        else:
            resp = await req(a, "DELETE", f"/v1/admin/tokens/{token['id']}")
            assert resp.status == 204

        async def refused(inst) -> bool:
            return await status(inst) == 401

        took = await asyncio.gather(within(LIMIT_SECONDS, lambda: refused(a)),
                                    within(LIMIT_SECONDS, lambda: refused(b)))  # fmt: skip
        assert max(took) <= LIMIT_SECONDS
        if how == "api":
            assert took[0] < 0.5  # the instance that revoked it forgot it at once
        # A cache refreshed since: the token stays refused.
        await asyncio.sleep(TOKEN_CACHE_TTL_SECONDS + 0.2)
        assert (await status(a), await status(b)) == (401, 401)


async def test_a_revoked_webhook_secret_is_refused_by_both_instances_within_5s(
    database_url, redis_url, runtime_id
):
    async with gateway(database_url, redis_url) as a, gateway(database_url, redis_url) as b:
        secret = await make_secret(a, [runtime_id])
        for inst in (a, b):
            assert (
                await deliver(inst, runtime_id, {"n": 0}, secret=secret["secret"])
            ).status == 201
        code, _, err = await gateway_cli(database_url, "webhook-secret", "revoke", secret["id"])
        assert code == 0, err

        def refused(inst):
            async def check() -> bool:
                resp = await deliver(inst, runtime_id, {"n": 1}, secret=secret["secret"])
                return resp.status == 401

            return check

        # Until an instance refuses, its deliveries may still land; after, none may.
        await asyncio.gather(within(LIMIT_SECONDS, refused(a)), within(LIMIT_SECONDS, refused(b)))
        stored = len(await all_tasks(a, runtime_id))
        for inst in (a, b):
            raw = orjson.dumps({"n": 2})
            resp = await deliver(inst, runtime_id, raw, sign(secret["secret"], raw))
            assert resp.status == 401
        assert len(await all_tasks(a, runtime_id)) == stored


async def test_no_secret_reaches_the_log(database_url, redis_url, redis_prefix, runtime_id):
    """A `gateway serve` process logging everything (debug, access log) while tokens and
    webhook secrets are created, listed, used, refused and revoked."""
    # Every request's access line (a tenth of the 2xx ones by default).
    env = {**serve_env(database_url, redis_url, redis_prefix), "GATEWAY_ACCESS_LOG_SAMPLE": "1"}
    async with serve_process(
        "--access-log", env=env, log_level="debug", stdout=asyncio.subprocess.PIPE
    ) as (proc, base):
        assert proc.stdout is not None and proc.stderr is not None
        logs = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        admin = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(base_url=base) as http:

            async def call(method: str, path: str, **kw) -> tuple[int, dict]:
                async with http.request(method, path, **kw) as resp:
                    text = await resp.read()
                    return resp.status, orjson.loads(text) if text else {}

            status, made = await call(
                "POST", "/v1/admin/tokens", json={"name": unique("log"), "scopes": ["read"]},
                headers=admin,
            )  # fmt: skip
            assert status == 201
            token = made["token"]
            status, hook = await call(
                "POST", "/v1/admin/webhook-secrets",
                json={"name": unique("log"), "runtimes": [runtime_id]}, headers=admin,
            )  # fmt: skip
            assert status == 201
            secret = hook["secret"]
            bearer = {"Authorization": f"Bearer {token}"}
            assert (await call("GET", f"/v1/runtimes/{runtime_id}/stats", headers=bearer))[0] == 200
            wrong = {"Authorization": f"Bearer {token[:-1]}x"}
            assert (await call("GET", f"/v1/runtimes/{runtime_id}/stats", headers=wrong))[0] == 401
            raw = orjson.dumps({"hello": "log"})
            webhook = f"/v1/runtimes/{runtime_id}/webhooks"
            status, _ = await call("POST", webhook, data=raw, headers=sign(secret, raw))
            assert status == 201
            status, _ = await call("POST", webhook, data=raw + b" ", headers=sign(secret, raw))
            assert status == 401
            for path in ("/v1/admin/tokens", "/v1/admin/webhook-secrets"):
                status, listed = await call("GET", path, headers=admin)
                assert status == 200
                assert token not in str(listed) and secret not in str(listed)
            for path in (
                f"/v1/admin/tokens/{made['id']}",
                f"/v1/admin/webhook-secrets/{hook['id']}",
            ):
                assert (await call("DELETE", path, headers=admin))[0] == 204
            assert (await call("GET", f"/v1/runtimes/{runtime_id}/stats", headers=bearer))[0] == 401
        proc.terminate()
        text = b"".join(await asyncio.wait_for(logs, 30)).decode()
        await proc.wait()
    assert "GET /v1/runtimes/{rt}/stats 200" in text  # the access log did record the calls
    for needle in (token, secret, secret.removeprefix("whsec_"), TOKEN):
        assert needle not in text
