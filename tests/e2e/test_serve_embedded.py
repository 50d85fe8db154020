"""`gateway serve --embedded` (what `make run` does): zero configuration, then Ctrl-C
stops the gateway and the servers it started."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import psutil

from tests.harness import free_port


async def test_serve_embedded_starts_everything_and_ctrl_c_stops_it(tmp_path, runtime_id):
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GATEWAY_", "DATABASE_URL", "REDIS_URL"))
    }
    data = tmp_path / "data"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--embedded",
        "--port",
        str(port),
        "--data-dir",
        str(data),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while True:
                    assert proc.returncode is None, (await proc.stderr.read()).decode()
                    try:
                        async with http.get(base + "/readyz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.2)
            children = psutil.Process(proc.pid).children(recursive=True)
            token = (data / "dev-token").read_text().strip()
            headers = {"Authorization": f"Bearer {token}"}
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/tasks", json={"payload": 1}, headers=headers
            ) as resp:
                assert resp.status == 201
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/claim", json={"worker_id": "w"}, headers=headers
            ) as resp:
                assert resp.status == 200 and len((await resp.json())["tasks"]) == 1
        pids = {p.pid for p in children} | _embedded_pids(data)
        assert pids, "no embedded server processes found"
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        async with asyncio.timeout(10):
            while any(_alive(pid) for pid in pids):
                await asyncio.sleep(0.1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


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
