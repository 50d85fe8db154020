"""`gateway serve --embedded` (what `make run` does): zero configuration, then Ctrl-C
stops the gateway and the servers it started."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import psutil

from tests.harness import serve_process


async def test_serve_embedded_starts_everything_and_ctrl_c_stops_it(tmp_path, runtime_id):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GATEWAY_", "DATABASE_URL", "REDIS_URL"))
    }
    data = tmp_path / "data"
    async with serve_process("--embedded", "--data-dir", str(data), env=env, ready_within=60) as (
        proc,
        base,
    ):
        children = psutil.Process(proc.pid).children(recursive=True)
        token = (data / "dev-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/tasks", json={"payload": 1}
            ) as resp:
                assert resp.status == 201
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/claim", json={"worker_id": "w"}
            ) as resp:
                assert resp.status == 200 and len((await resp.json())["tasks"]) == 1
        pids = {p.pid for p in children} | _embedded_pids(data)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        async with asyncio.timeout(10):
            while any(_alive(pid) for pid in pids):
                await asyncio.sleep(0.1)


def _embedded_pids(data) -> set[int]:
    """Postgres and Valkey daemonize: find them by their data folder and pid file."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(str(data) in part for part in p.info["cmdline"] or []):
            found.add(p.info["pid"])
    valkey = int((data / "redis" / "valkey.pid").read_text())
    assert psutil.pid_exists(valkey)
    return found | {valkey}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
