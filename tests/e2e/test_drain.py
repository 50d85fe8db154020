"""I10: on SIGTERM the process stops being ready, answers parked polls at once, takes no
new claims, finishes in-flight work and exits inside the grace period."""

from __future__ import annotations

import asyncio
import signal
import time

import aiohttp

from tests.support.gateways import TOKEN, make_settings, running_gateway, serve_env, serve_process
from tests.support.waiting import wait_until

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_drain_answers_parked_polls_and_refuses_new_claims(
    database_url, redis_url, redis_prefix, runtime_id
):
    async with running_gateway(make_settings(database_url, redis_url, redis_prefix)) as gw:
        polls = [
            asyncio.create_task(
                gw.call(
                    "POST",
                    f"/v1/runtimes/{runtime_id}/claim",
                    {"worker_id": f"w{i}", "wait_seconds": 30},
                )
            )
            for i in range(5)
        ]
        await wait_until(lambda: gw.gateway.claimer.parked(runtime_id) >= 5, 5, "5 parked polls")
        started = time.monotonic()
        gw.gateway.claimer.drain()  # what SIGTERM calls
        answers = await asyncio.wait_for(asyncio.gather(*polls), 2)
        assert time.monotonic() - started < 1.0
        assert answers == [(200, {"tasks": []})] * 5
        status, body = await gw.call("GET", "/readyz")
        assert status == 503 and "shutting down" in body["problems"]
        status, body = await gw.call(
            "POST", f"/v1/runtimes/{runtime_id}/claim", {"worker_id": "late"}
        )
        assert status == 503 and body["code"] == "draining", body
        # Producers are not refused: enqueues still land in Postgres for other instances.
        status, _ = await gw.call("POST", f"/v1/runtimes/{runtime_id}/tasks", {"payload": 1})
        assert status == 201


async def test_sigterm_to_gateway_serve_drains_and_exits(
    database_url, redis_url, redis_prefix, runtime_id
):
    env = serve_env(database_url, redis_url, redis_prefix)
    async with serve_process(env=env) as (proc, base), aiohttp.ClientSession() as http:

        async def parked() -> tuple[int, dict]:
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/claim",
                json={"worker_id": "w", "wait_seconds": 30},
                headers=AUTH,
            ) as resp:
                return resp.status, await resp.json()

        poll = asyncio.create_task(parked())
        await asyncio.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(poll, 3) == (200, {"tasks": []})
        code = await asyncio.wait_for(proc.wait(), 10)
        assert time.monotonic() - started < 5
        assert code == 0, (await proc.stderr.read()).decode()
