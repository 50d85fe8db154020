"""`--scenario overload`: a fleet that retries at once, far past capacity, and after.

Closed-loop load, as from clients that send again the moment they are answered: wrk
posts single enqueues over 100 runtimes with `--overload-connections` (16) connections
for `--overload-phase-seconds` (8) seconds ("before": the capacity), then with
`--overload-burst-connections` (2,000) for `--overload-burst-seconds` (15) with a 2 s
client timeout ("overload"), then with 16 again ("after"). wrk ignores Retry-After, as a
misbehaving fleet would, so the gateway's refusals must be cheap. Beside wrk, a
well-behaved client sends one enqueue at a time, every 20 ms, through its own
connection: its 2xx latencies are what a client that gets in sees.

Run twice: with admission control as configured, and with it off
(`GATEWAY_DB_QUEUE_BUDGET_MS` at its largest), which shows the collapse the targets
catch: the overload's requests waiting until their client gives up, and the backlog
still there once the overload ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from pathlib import Path
from typing import Any

import aiohttp

from .infra import Servers, log, serving
from .scenarios import HANG_GRACE_SECONDS
from .stats import Result

RUNTIMES = 100
CLIENT_TIMEOUT_SECONDS = 2
PROBE_INTERVAL_SECONDS = 0.02
# The well-behaved client's percentiles need at least this many 2xx answers.
PROBE_MIN_SAMPLES = 20
ADMISSION_OFF = {"GATEWAY_DB_QUEUE_BUDGET_MS": "600000"}
ON, OFF = "admission control on", "admission control off"

# wrk's script: single enqueues over RUNTIMES runtimes; `done` prints the phase's
# figures as one JSON line (the status errors are the non-2xx answers).
WRK_SCRIPT = """
local n = 0
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %(token)s"}
request = function()
  n = n + 1
  local path = "/v1/runtimes/bench-overload-" .. (n %% %(runtimes)d) .. "/tasks"
  return wrk.format("POST", path, headers, '{"payload": {"n": ' .. n .. '}}')
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"seconds": %%f, "requests": %%d, "non_2xx": %%d, "timeouts": %%d, "socket_errors": %%d,'
    .. ' "p50_ms": %%f, "p99_ms": %%f}\\n',
    summary.duration / 1e6, summary.requests, e.status, e.timeout,
    e.connect + e.read + e.write, latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
"""


def _more_files() -> None:
    """wrk needs a descriptor per connection (and a few): raised to the hard limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    """One phase of wrk: its JSON line, with the 2xx answers per second."""
    argv = [
        "wrk",
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        f"--timeout={CLIENT_TIMEOUT_SECONDS}s",
        "-s",
        str(script),
        url,
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_more_files,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 30 + HANG_GRACE_SECONDS)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode()[-500:]}")
    phase: dict[str, Any] = json.loads(lines[-1])
    ok = phase["requests"] - phase["non_2xx"]
    phase["ok_per_second"] = round(ok / phase["seconds"], 1) if phase["seconds"] else None
    phase["timeout_share"] = (
        round(phase["timeouts"] / phase["requests"], 4) if phase["requests"] else None
    )
    return phase


async def _probe(url: str, token: str, stop: asyncio.Event) -> dict[str, Any]:
    """A well-behaved client: one enqueue at a time on its own connection, every
    PROBE_INTERVAL_SECONDS: its 2xx latencies, and how many it sent."""
    ok: list[float] = []
    refused = failed = 0
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS)
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1), timeout=timeout, headers=headers
    ) as http:
        n = 0
        while not stop.is_set():
            n += 1
            started = time.perf_counter()
            try:
                async with http.post(
                    f"{url}/v1/runtimes/bench-overload-probe/tasks", json={"payload": {"n": n}}
                ) as resp:
                    await resp.read()
                    if resp.status < 300:
                        ok.append(time.perf_counter() - started)
                    else:
                        refused += 1
            except (aiohttp.ClientError, TimeoutError):
                failed += 1
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)
    ok.sort()

    def pct(q: float) -> float | None:
        if len(ok) < PROBE_MIN_SAMPLES:
            return None  # too few answers to say anything of a p99
        return round(1000 * ok[min(len(ok) - 1, int(q * len(ok)))], 2)

    return {
        "ok": len(ok),
        "refused": refused,
        "failed": failed,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
    }


async def _phase(
    url: str, token: str, script: Path, connections: int, seconds: float
) -> dict[str, Any]:
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(url, token, stop))
    try:
        phase = await _wrk(url, script, connections, seconds)
    finally:
        stop.set()
        phase_probe = await probe
    phase["probe"] = phase_probe
    phase["connections"] = connections
    return phase


async def _one_run(
    opts: argparse.Namespace, servers: Servers, workdir: Path, label: str, env: dict[str, str]
) -> Result:
    result = Result("overload", label)
    log_path = workdir / ("overload-on.log" if label == ON else "overload-off.log")
    async with serving(opts, servers, log_path, env=env) as (proc, _db):
        script = workdir / "overload.lua"
        script.write_text(WRK_SCRIPT % {"token": proc.token, "runtimes": RUNTIMES})
        phases: dict[str, Any] = {}
        steps = [
            ("before", opts.overload_connections, opts.overload_phase_seconds),
            ("overload", opts.overload_burst_connections, opts.overload_burst_seconds),
            ("after", opts.overload_connections, opts.overload_phase_seconds),
        ]
        for name, connections, seconds in steps:
            log(f"overload ({label}): {name}, {connections} connections for {seconds:g} s")
            phases[name] = await _phase(proc.url, proc.token, script, connections, seconds)
        result.numbers = {**phases, **_ratios(phases)}
    return result


def _ratios(phases: dict[str, Any]) -> dict[str, float | None]:
    """The targets' inputs: goodput under overload against the capacity, the
    well-behaved client's p99 under overload against before, the share of requests
    that reached the client timeout, and the p99 after against before."""

    def div(a: Any, b: Any) -> float | None:
        return (
            round(a / b, 3)
            if isinstance(a, int | float) and isinstance(b, int | float) and b
            else None
        )

    before, over, after = phases["before"], phases["overload"], phases["after"]
    return {
        "goodput_x_before": div(over["ok_per_second"], before["ok_per_second"]),
        "accepted_p99_x_before": div(over["probe"]["p99_ms"], before["probe"]["p99_ms"]),
        "timeout_share": over["timeout_share"],
        "after_p99_x_before": div(after["p99_ms"], before["p99_ms"]),
    }


async def overload(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    results = [await _one_run(opts, servers, workdir, ON, {})]
    if opts.overload_compare_off:
        results.append(await _one_run(opts, servers, workdir, OFF, ADMISSION_OFF))
    return results
