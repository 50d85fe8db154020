"""Watching the gateway process while it is under load: is its event loop still
answering (GET /healthz on a connection of its own), and how much CPU do it and the
load generator (this process) use."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import aiohttp
import psutil

PROBE_INTERVAL_SECONDS = 0.5
PROBE_TIMEOUT_SECONDS = 1.0
# No answer to /healthz for this long means the gateway is stuck: the phase is aborted.
STALL_SECONDS = 5.0


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process and its children (uvicorn --workers forks
    them), from /proc (Linux); None elsewhere."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class Watchdog:
    """Probes /healthz every half second on its own session (so that the load's
    connection pool cannot starve it) and sets `stalled` after STALL_SECONDS without
    an answer."""

    def __init__(
        self, base_url: str, pid: int | None, also_set: asyncio.Event | None = None
    ) -> None:
        self.base_url = base_url
        self.pid = pid
        self.stalled = asyncio.Event()
        self._also_set = also_set
        self.stalled_after: float | None = None  # seconds from start to the last answer
        self.probes = 0
        self.failed_probes = 0
        self.max_probe: float = 0.0
        self._started = 0.0
        self._cpu_start: float | None = None
        self._own_cpu_start = 0.0
        self.own_cpu_used = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watchdog:
        self._started = time.perf_counter()
        self._cpu_start = cpu_seconds(self.pid)
        self._own_cpu_start = time.process_time()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self._started
        self.own_cpu_used = time.process_time() - self._own_cpu_start
        cpu_end = cpu_seconds(self.pid)
        self.cpu_used = (
            None if cpu_end is None or self._cpu_start is None else cpu_end - self._cpu_start
        )
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
        last_ok = time.perf_counter()
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                started = time.perf_counter()
                self.probes += 1
                try:
                    async with http.get(self.base_url + "/healthz") as resp:
                        await resp.read()
                        ok = resp.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                now = time.perf_counter()
                if ok:
                    last_ok = now
                    self.max_probe = max(self.max_probe, now - started)
                else:
                    self.failed_probes += 1
                    if now - last_ok >= STALL_SECONDS:
                        self.stalled_after = last_ok - self._started
                        self.stalled.set()
                        if self._also_set is not None:
                            self._also_set.set()
                        return
                await asyncio.sleep(PROBE_INTERVAL_SECONDS)

    def numbers(self) -> dict[str, Any]:
        elapsed = getattr(self, "elapsed", 0.0)
        cpu = getattr(self, "cpu_used", None)
        return {
            "gateway_cpu_percent": round(100.0 * cpu / elapsed, 1)
            if cpu is not None and elapsed > 0
            else None,
            "bench_cpu_percent": round(100.0 * self.own_cpu_used / elapsed, 1)
            if elapsed > 0
            else None,
            "healthz_probes": self.probes,
            "healthz_failed_probes": self.failed_probes,
            "healthz_max_ms": round(self.max_probe * 1000.0, 1),
        }

    def failure(self, phase: str) -> str | None:
        if not self.stalled.is_set():
            return None
        return (
            f"the gateway stopped answering GET /healthz {self.stalled_after:.1f} s into the "
            f"{phase} (no answer for {STALL_SECONDS:g} s; {self.numbers()['gateway_cpu_percent']}% "
            "CPU over the phase): its event loop is blocked; the phase was aborted"
        )
