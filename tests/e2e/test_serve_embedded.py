"""`gateway serve --embedded` (what `make run` does): zero configuration, then Ctrl-C
stops the gateway and the servers it started."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import aiohttp
import psutil

from tests.support.gateways import serve_process


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
            # The banner names the embedded database, for the token commands.
            database_url = await _banner_database_url(proc)
            claim_token = await _create_token(database_url, runtime_id, env)
            scoped = {"Authorization": f"Bearer {claim_token}"}
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}/claim", json={"worker_id": "w"}, headers=scoped
            ) as resp:
                assert resp.status == 200, await resp.text()
            async with http.post(
                f"{base}/v1/runtimes/{runtime_id}-other/claim",
                json={"worker_id": "w"},
                headers=scoped,
            ) as resp:
                assert resp.status == 403
        pids = {p.pid for p in children} | _embedded_pids(data)
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        async with asyncio.timeout(10):
            while any(_alive(pid) for pid in pids):
                await asyncio.sleep(0.1)


async def _banner_database_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    async with asyncio.timeout(10):
        while line := (await proc.stderr.readline()).decode():
            if line.strip().startswith("database:"):
                return line.split("database:", 1)[1].strip()
    raise AssertionError("the banner names no database")


async def _create_token(database_url: str, runtime_id: str, env: dict[str, str]) -> str:
    made = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "token", "create", "--name", "daemons",
        "--scopes", "claim", "--runtime", runtime_id,
        env={**env, "DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(30):
        out, err = await made.communicate()
    assert made.returncode == 0, err
    return out.decode().strip()


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
