"""`gateway serve` with GATEWAY_LOG_FORMAT=json: every line on stdout and stderr is one
JSON object, uvicorn's included; one access line per request, with its route template
and request id; and no secret on any line."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from gateway.http.access import UNMATCHED
from gateway.http.routes import ENDPOINTS
from tests.support.credentials import sign, unique
from tests.support.gateways import TOKEN, serve_env, serve_process

TEMPLATES = {e.path for e in ENDPOINTS} | {UNMATCHED}


def with_password(url: str, password: str) -> tuple[str, str]:
    """The URL with this password, unless it has one already: (url, its password).
    (The test servers trust local connections, so any password is accepted.)"""
    parts = urlsplit(url)
    if parts.password:
        return url, parts.password
    host = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{host}").geturl(), (
        password
    )


async def test_json_lines_request_ids_and_no_secret(
    database_url, redis_url, redis_prefix, runtime_id
):
    db_url, db_password = with_password(database_url, "db-pw-" + secrets.token_hex(8))
    env = serve_env(
        db_url, redis_url, redis_prefix, GATEWAY_LOG_FORMAT="json", GATEWAY_ACCESS_LOG_SAMPLE="1"
    )
    answered: list[tuple[str, int]] = []  # (request id, status) of every answer
    async with serve_process(env=env, log_level="debug", stdout=asyncio.subprocess.PIPE) as (
        proc,
        base,
    ):
        assert proc.stdout is not None and proc.stderr is not None
        output = asyncio.gather(proc.stdout.read(), proc.stderr.read())
        admin = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession(base_url=base) as http:

            async def call(method: str, path: str, **kw: Any) -> tuple[int, Any]:
                async with http.request(method, path, **kw) as resp:
                    text = await resp.read()
                    answered.append((resp.headers["X-Request-ID"], resp.status))
                    return resp.status, orjson.loads(text) if text else None

            status, made = await call(
                "POST", "/v1/admin/tokens",
                json={"name": unique("log"), "scopes": ["enqueue", "claim", "read"]},
                headers=admin,
            )  # fmt: skip
            assert status == 201
            token = made["token"]
            assert token.startswith("gwt_")
            status, hook = await call(
                "POST", "/v1/admin/webhook-secrets",
                json={"name": unique("log"), "runtimes": [runtime_id]}, headers=admin,
            )  # fmt: skip
            assert status == 201
            secret = hook["secret"]
            bearer = {"Authorization": f"Bearer {token}"}
            tasks = f"/v1/runtimes/{runtime_id}/tasks"
            status, _ = await call(
                "POST", tasks, json={"payload": {"n": 1}},
                headers={**bearer, "X-Request-ID": "client-chosen.id:1"},
            )  # fmt: skip
            assert status == 201 and answered[-1][0] == "client-chosen.id:1"
            claim = f"/v1/runtimes/{runtime_id}/claim"
            status, got = await call(
                "POST", claim, json={"worker_id": "w", "wait_seconds": 1}, headers=bearer
            )
            assert status == 200 and len(got["tasks"]) == 1
            task = got["tasks"][0]
            status, _ = await call(
                "POST", f"/v1/tasks/{task['id']}/complete",
                json={"lease_id": task["lease_id"]}, headers=bearer,
            )  # fmt: skip
            assert status == 200
            status, got = await call(  # a long poll that runs out: one line, at its end
                "POST", claim, json={"worker_id": "w", "wait_seconds": 0.3}, headers=bearer
            )
            assert status == 200 and got["tasks"] == []
            raw = orjson.dumps({"hello": "log"})
            status, _ = await call(
                "POST", f"/v1/runtimes/{runtime_id}/webhooks", data=raw, headers=sign(secret, raw)
            )
            assert status == 201
            wrong = {"Authorization": f"Bearer {token[:-1]}x"}
            assert (await call("GET", f"/v1/runtimes/{runtime_id}/stats", headers=wrong))[0] == 401
            status, _ = await call("GET", "/no/such/path", headers={"X-Request-ID": "bad id"})
            assert status == 404
            assert answered[-1][0] != "bad id"
            assert (await call("DELETE", f"/v1/admin/tokens/{made['id']}", headers=admin))[0] == 204
        proc.terminate()
        out, err = await asyncio.wait_for(output, 30)
        await proc.wait()

    text = (out + err).decode()
    lines = [orjson.loads(line) for line in text.splitlines()]  # each line is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    # Start-up's objects are frozen out of garbage collection (cli.freeze_startup_heap).
    [frozen] = [line["message"] for line in lines if "from start-up frozen" in line["message"]]
    assert int(frozen.split()[2]) > 10_000, frozen
    access = [line for line in lines if line["logger"] == "gateway.access"]
    by_id: dict[str, list[dict[str, Any]]] = {}
    for line in access:
        assert line["route"] in TEMPLATES, line
        assert isinstance(line["duration_ms"], float | int)
        by_id.setdefault(line["request_id"], []).append(line)
    for request_id, status in answered:
        assert [line["status"] for line in by_id.get(request_id, [])] == [status], request_id
    assert not any(runtime_id in line["message"] for line in access)
    assert any(line["route"] == "/v1/runtimes/{rt}/claim" for line in access)
    for needle in (TOKEN, token, secret, secret.removeprefix("whsec_"), db_password):
        assert needle not in text
