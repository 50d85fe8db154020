"""Running gateways for a test, every way the suite runs them:

- in this process, on the test's own event loop: `running_gateway(make_settings(...))`
  gives an `Instance` (base URL, Gateway object, HTTP session). It is the bench's
  (bench/gateways.py), taken from there: the tests may import the bench, never the
  reverse;
- the same with the janitor quiet and a connection per request: `gateway(...)`, the
  module-scoped `gw` of tests/e2e/conftest.py;
- in a thread of its own, for synchronous clients such as schemathesis:
  `gateway_thread(...)`;
- as a real `gateway serve` process: `serve_process(..., env=serve_env(...))`, or
  `serve_refused(...)` for one whose start must fail; and the environment of the
  client commands (`gateway work`, `gateway runtime`) that call one: `client_env(...)`,
  and a `gateway work` process that runs tests/e2e/work_task.py: `work(...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp

from bench.gateways import TOKEN, Instance, make_settings, running_gateway
from gateway.instance import Gateway
from tests.support.net import free_port
from tests.support.redis_keys import new_prefix

__all__ = [
    "JANITOR_OFF",
    "TOKEN",
    "Instance",
    "Served",
    "client_env",
    "gateway",
    "gateway_thread",
    "make_settings",
    "running_gateway",
    "serve_env",
    "serve_process",
    "serve_refused",
    "start_serving",
]

ROOT = Path(__file__).resolve().parents[2]

# A janitor interval long enough that the loop's first pass (run at start) is the only
# background one during a test; the test drives `janitor.run_once()` itself.
JANITOR_OFF = 3600.0


@contextlib.asynccontextmanager
async def gateway(
    database_url: str, redis_url: str, *, connection_per_request: bool = True, **overrides: Any
) -> AsyncIterator[Instance]:
    """A gateway with a Redis prefix of its own, whose janitor runs once at start-up and
    then not for an hour, so that a test decides when the janitor passes
    (`inst.gateway.janitor.run_once()`); `overrides` set any other setting.

    Its HTTP session opens a connection per request: a server that closes a connection
    after an error answer must not break the next test's request on a pooled socket.
    `connection_per_request=False` keeps running_gateway's pooled session."""
    overrides.setdefault("janitor_interval_seconds", JANITOR_OFF)
    settings = make_settings(database_url, redis_url, new_prefix(), **overrides)
    async with running_gateway(settings) as gw:
        if not connection_per_request:
            yield gw
            return
        connector = aiohttp.TCPConnector(limit=500, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            yield Instance(gw.url, gw.gateway, http)


@dataclass
class Served:
    """A gateway running in a thread of its own (see gateway_thread)."""

    url: str
    gateway: Gateway
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a coroutine on the gateway's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)


@contextlib.contextmanager
def gateway_thread(**settings: Any) -> Iterator[Served]:
    """running_gateway(make_settings(**settings)) on an event loop in a thread of its
    own; stops it and waits for the thread afterwards."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = box["stop"] = asyncio.Event()
        async with running_gateway(make_settings(**settings)) as inst:
            box["served"] = Served(inst.url, inst.gateway, asyncio.get_running_loop())
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="served-gateway", daemon=True)
    thread.start()
    ready.wait(60)
    try:
        if "served" not in box:
            raise RuntimeError(f"the gateway did not start: {box.get('error')!r}")
        yield box["served"]
    finally:
        if "served" in box:
            box["served"].loop.call_soon_threadsafe(box["stop"].set)
        thread.join(60)
        assert not thread.is_alive(), "the served gateway did not stop"


def serve_env(
    database_url: str, redis_url: str, redis_prefix: str, **variables: str
) -> dict[str, str]:
    """This process's environment, plus what `gateway serve` needs to serve on these
    servers with the admin token TOKEN and keys under `redis_prefix`; `variables`
    (GATEWAY_READ_TIMEOUT_SECONDS="1", ...) are added last."""
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "GATEWAY_ADMIN_TOKEN": TOKEN,
        "GATEWAY_REDIS_PREFIX": redis_prefix,
        **variables,
    }


@contextlib.asynccontextmanager
async def serve_process(
    *args: str,
    env: dict[str, str],
    ready_within: float = 20,
    log_level: str = "info",
    stdout: int = asyncio.subprocess.DEVNULL,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`gateway --log-level LEVEL serve ARGS` as a real process on a free port, once
    /readyz answers 200. Yields (process, base URL); kills it afterwards if the test did
    not stop it. `stdout=PIPE` keeps what it prints there (uvicorn's access log)."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", log_level,
        "serve", "--port", str(port), *args,
        env=env, stdout=stdout, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(ready_within):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError((await proc.stderr.read()).decode())  # type: ignore[union-attr]
                try:
                    async with http.get(base + "/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        yield proc, base
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def start_serving(
    *args: str, env: dict[str, str], port: int, log_level: str = "info"
) -> asyncio.subprocess.Process:
    """`gateway --log-level LEVEL serve --port PORT ARGS` started, its stderr piped, not
    waited for: the caller owns the process (and kills it)."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "--log-level", log_level,
        "serve", "--port", str(port), *args,
        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def serve_refused(
    *args: str,
    env: dict[str, str],
    port: int | None = None,
    log_level: str = "info",
    within: float = 20,
) -> tuple[int, list[str]]:
    """A real `gateway serve` whose start must fail, run to its end (on a free port
    unless `port`): its exit code and the lines of its stderr. A process still running
    after `within` seconds fails the test (and is killed)."""
    proc = await start_serving(*args, env=env, port=port or free_port(), log_level=log_level)
    try:
        async with asyncio.timeout(within):
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode().splitlines()


async def client_command(url: str, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    """`gateway ARGS`, a client command (runtime, schedule…) against the gateway at
    `url` with `token`: (exit code, stdout, stderr), within 20 s."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args,
        env=client_env(url, token), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def client_env(url: str, token: str) -> dict[str, str]:
    """The client commands find the gateway by GATEWAY_URL and GATEWAY_TOKEN, and the
    packages in this checkout whether or not it is installed."""
    path = [str(ROOT), str(ROOT / "clients" / "python"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "GATEWAY_URL": url,
        "GATEWAY_TOKEN": token,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }


def _opened(log: Path | None) -> BinaryIO:
    return open(log or os.devnull, "ab")


# What `work` runs for each task (see its docstring): it echoes what it was given.
WORK_TASK = str(ROOT / "tests" / "e2e" / "work_task.py")


@contextlib.asynccontextmanager
async def work(
    url: str,
    runtime: str,
    *options: str,
    log: Path | None = None,
    environ: dict[str, str] | None = None,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`gateway work RUNTIME OPTIONS -- python work_task.py`, its log in `log` (a pipe
    nobody reads could fill and block it), `environ` added to its environment; killed
    afterwards if alive."""
    env = {**client_env(url, TOKEN), **(environ or {})}
    with _opened(log) as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "work", runtime, "--wait-seconds", "1",
            *options, "--", sys.executable, WORK_TASK,
            env=env, stderr=out,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
