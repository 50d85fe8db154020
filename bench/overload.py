"""`--scenario overload`: a fleet that retries at once, far past capacity, and after.

Closed-loop load, as from clients that send again the moment they are answered: wrk
posts single enqueues over 100 runtimes with `--overload-connections` (16) connections
for `--overload-phase-seconds` (8) seconds ("before": the capacity), then with
`--overload-burst-connections` (2,000) for `--overload-burst-seconds` (15) with a 2 s
client timeout ("overload"), then with 16 again ("after"). wrk ignores Retry-After, as a
misbehaving fleet would, so the gateway's refusals must be cheap. Beside wrk, 64
well-behaved clients each send one enqueue at a time, every 160 ms, through a
connection of their own, and honour a refusal's Retry-After: their 2xx latencies are
what a client that gets in sees.

Three loads, each with shedding as configured:

- **enqueue**: single enqueues; run again with shedding off
  (`GATEWAY_DB_QUEUE_BUDGET_MS` at its largest), which shows the collapse the targets
  catch: the overload's requests waiting until their client gives up, and the backlog
  still there once the overload ends;
- **claim and complete**: each wrk connection claims one task (`wait_seconds` 0) from a
  backlog queued beforehand and acknowledges it with `POST /v1/tasks:complete` as its
  next request; goodput is the completes answered;
- **enqueue with 2,000 parked polls**: single enqueues as above, while
  `--overload-parked` (2,000) polls wait on 200 other, empty runtimes, each asking
  again when answered; every poll must be answered by its deadline (its wait plus
  `PARKED_SLACK_SECONDS`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import shutil
import time
import types
from pathlib import Path
from typing import Any

import aiohttp

from .infra import Servers, log, serving
from .scenarios import HANG_GRACE_SECONDS
from .stats import Result

RUNTIMES = 100
CLIENT_TIMEOUT_SECONDS = 2
# Many clients, each sending seldom: a refused client waits its Retry-After (1 s), so
# under the flood the answers that let a client in come from how many clients there
# are, not how often each sends. Eight clients every 20 ms (the same ~400 enqueues/s)
# were let in 24 to 200 times a flood, and a p99 of so few is their second largest.
PROBE_INTERVAL_SECONDS = 0.16
PROBE_CLIENTS = 64
# The well-behaved clients' percentiles need at least this many 2xx answers.
PROBE_MIN_SAMPLES = 20
# Answers to the well-behaved clients' requests sent in a phase's first second are
# reported apart, not in its percentiles. When the 2,000 connections open, all at once,
# the gateway accepts them and reads, refuses or admits their first requests, and the
# well-behaved clients' connections, opened in the same instant, take their turn among
# them. Until 2026-11-29 the gateway accepted one connection per turn of its event loop
# (uvloop's server), about 150 a second beside 2,000 parked polls: the onset then lasted
# seconds, and whether the handful of requests sent in it were let in decided the p99
# of a whole run (2.1x in one, 9.3x in the next). Accepting up to 256 per turn
# (gateway/http/acceptor.py), all are in within 0.7 s, and the onset's largest answer
# was 0.6 to 0.7 s in the runs of that day. The targets judge the flood as it stands;
# the onset's largest answer is shown beside them.
PROBE_ONSET_SECONDS = 1.0
ADMISSION_OFF = {"GATEWAY_DB_QUEUE_BUDGET_MS": "600000"}
ON, OFF = "shedding on", "shedding off"
ENQUEUE, CLAIM_COMPLETE, WITH_PARKED = "enqueue", "claim and complete", "enqueue, 2,000 parked"
# The parked polls: their wait, the runtimes they spread over, and how late an answer
# may come after its wait and still count as on time.
PARKED_WAIT_SECONDS = 5.0
PARKED_RUNTIMES = 200
PARKED_SLACK_SECONDS = 1.0

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


# wrk's script for claims each followed by a complete: a connection's answer to a claim
# that got a task queues that task's complete, which the thread sends next. The 2xx
# answers to completes are counted per thread (`completed`), read by `done`.
WRK_CLAIM_SCRIPT = """
local n = 0
local pending = {}
completed = 0  -- a global: done() reads it from each thread
local threads = {}
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer %(token)s"}
local claim_body = '{"worker_id": "wrk", "wait_seconds": 0, "max_tasks": 1}'
setup = function(thread)
  table.insert(threads, thread)
end
request = function()
  local body = table.remove(pending)
  if body then
    return wrk.format("POST", "/v1/tasks:complete", headers, body)
  end
  n = n + 1
  local path = "/v1/runtimes/bench-overload-" .. (n %% %(runtimes)d) .. "/claim"
  return wrk.format("POST", path, headers, claim_body)
end
response = function(status, headers, body)
  if status ~= 200 then
    return
  end
  if body:find('"results"', 1, true) then
    completed = completed + 1
    return
  end
  local id, lease = body:match('"id":"([^"]+)".-"lease_id":"([^"]+)"')
  if id then
    table.insert(pending, '{"tasks": [{"id": "' .. id .. '", "lease_id": "' .. lease .. '"}]}')
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  local total = 0
  for _, thread in ipairs(threads) do
    total = total + thread:get("completed")
  end
  io.write(string.format(
    '{"seconds": %%f, "requests": %%d, "non_2xx": %%d, "timeouts": %%d, "socket_errors": %%d,'
    .. ' "p50_ms": %%f, "p99_ms": %%f, "completed": %%d}\\n',
    summary.duration / 1e6, summary.requests, e.status, e.timeout,
    e.connect + e.read + e.write, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    total))
end
"""


def _more_files() -> None:
    """wrk needs a descriptor per connection (and a few): raised to the hard limit."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _wrk(url: str, script: Path, connections: int, seconds: float) -> dict[str, Any]:
    """One phase of wrk: its JSON line, with the work done per second (`ok_per_second`:
    the 2xx answers, or for claims and completes the completes answered)."""
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
    done = phase.get("completed", phase["requests"] - phase["non_2xx"])
    phase["ok_per_second"] = round(done / phase["seconds"], 1) if phase["seconds"] else None
    phase["timeout_share"] = (
        round(phase["timeouts"] / phase["requests"], 4) if phase["requests"] else None
    )
    return phase


async def _probe(url: str, token: str, stop: asyncio.Event) -> dict[str, Any]:
    """Well-behaved clients: PROBE_CLIENTS of them, each one enqueue at a time on its
    own connection, every PROBE_INTERVAL_SECONDS, and after a refusal its Retry-After
    later, as a client should: their 2xx latencies, and how many were refused. Those
    of requests sent in the first PROBE_ONSET_SECONDS are counted apart (`onset`)."""
    ok: list[float] = []
    onset: list[float] = []
    onset_ends = time.perf_counter() + PROBE_ONSET_SECONDS
    counts = {"refused": 0, "failed": 0}
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_SECONDS)
    headers = {"Authorization": f"Bearer {token}"}

    async def client(k: int) -> None:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1), timeout=timeout, headers=headers
        ) as http:
            # Spread over one interval, so that the clients do not send in step.
            await asyncio.sleep(k * PROBE_INTERVAL_SECONDS / PROBE_CLIENTS)
            n = 0
            while not stop.is_set():
                n += 1
                pause = PROBE_INTERVAL_SECONDS
                started = time.perf_counter()
                try:
                    async with http.post(
                        f"{url}/v1/runtimes/bench-overload-probe-{k}/tasks",
                        json={"payload": {"n": n}},
                    ) as resp:
                        await resp.read()
                        if resp.status < 300:
                            took = time.perf_counter() - started
                            (onset if started < onset_ends else ok).append(took)
                        else:
                            counts["refused"] += 1
                            pause = float(resp.headers.get("Retry-After", pause))
                except (aiohttp.ClientError, TimeoutError):
                    counts["failed"] += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)

    await asyncio.gather(*(client(k) for k in range(PROBE_CLIENTS)))
    ok.sort()

    def pct(q: float) -> float | None:
        if len(ok) < PROBE_MIN_SAMPLES:
            return None  # too few answers to say anything of a p99
        return round(1000 * ok[min(len(ok) - 1, int(q * len(ok)))], 2)

    return {
        "ok": len(ok),
        **counts,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "onset": {"ok": len(onset), "max_ms": round(1000 * max(onset), 2) if onset else None},
    }


class Parked:
    """`count` polls parked on PARKED_RUNTIMES empty runtimes, each asking again when
    answered, while `stop` is unset: how many were answered by their deadline, how
    many late or never, and their statuses.

    The polls start spread over one wait (PARKED_WAIT_SECONDS), as a fleet's parked
    polls come back spread over theirs. Started at once, they stayed in step: every
    5 s the gateway answered all 2,000 in the same instant and read 2,000 more. In one
    run (2026-11-29) the well-behaved clients' p99 "before" was 255 ms beside them,
    against 25 ms without them, and wrk's p99 "after" 1.61x its "before".

    A poll's deadline counts from when its request was sent, not from before its
    connection was made: this client took up to 0.6 s to make 2,000 connections at
    once on 2 cores beside the gateway (2026-11-28), which made up to 12% of a run's
    polls look late when the gateway had answered each within its wait and the slack
    of when it was sent."""

    def __init__(self, url: str, token: str, count: int) -> None:
        self.url, self.token, self.count = url, token, count
        self.on_time = 0
        self.late = 0
        self.statuses: dict[str, int] = {}
        self.stop = asyncio.Event()

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=PARKED_WAIT_SECONDS + CLIENT_TIMEOUT_SECONDS + 5)
        headers = {"Authorization": f"Bearer {self.token}"}
        connector = aiohttp.TCPConnector(limit=self.count + 10)
        sending = aiohttp.TraceConfig()
        sending.on_request_headers_sent.append(_sent)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=headers, trace_configs=[sending]
        ) as http:
            await asyncio.gather(*(self._poll(http, i) for i in range(self.count)))

    async def _poll(self, http: aiohttp.ClientSession, i: int) -> None:
        path = f"{self.url}/v1/runtimes/bench-overload-parked-{i % PARKED_RUNTIMES}/claim"
        body = {"worker_id": f"parked-{i}", "wait_seconds": PARKED_WAIT_SECONDS}
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), PARKED_WAIT_SECONDS * i / self.count)
        while not self.stop.is_set():
            sent: dict[str, float] = {}
            status = "no answer"
            try:
                async with http.post(path, json=body, trace_request_ctx=sent) as resp:
                    await resp.read()
                    status = str(resp.status)
            except (aiohttp.ClientError, TimeoutError):
                pass
            # Never sent (its connection failed): late, as it was never answered.
            took = time.perf_counter() - sent.get("at", float("-inf"))
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status != "no answer" and took <= PARKED_WAIT_SECONDS + PARKED_SLACK_SECONDS:
                self.on_time += 1
            else:
                self.late += 1
            if status not in ("200", "no answer"):
                await asyncio.sleep(1.0)  # a refusal: as its Retry-After says

    def summary(self) -> dict[str, Any]:
        answered = self.on_time + self.late
        return {
            "polls": self.count,
            "answers": answered,
            "on_time": self.on_time,
            "late_share": round(self.late / answered, 4) if answered else None,
            "statuses": dict(sorted(self.statuses.items())),
        }


async def _sent(
    _session: aiohttp.ClientSession,
    context: types.SimpleNamespace,
    _params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    """aiohttp's trace hook: when a request's head went out (Parked's clock starts)."""
    context.trace_request_ctx["at"] = time.perf_counter()


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


async def _backlog(url: str, token: str, tasks: int) -> None:
    """`tasks` tasks queued over the load's runtimes, in batches of 1,000, before the
    claims begin."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for first in range(0, tasks, 1000):
            runtime = f"bench-overload-{(first // 1000) % RUNTIMES}"
            items = [{"payload": {"n": first + i}} for i in range(min(1000, tasks - first))]
            async with http.post(
                f"{url}/v1/runtimes/{runtime}/tasks:batch",
                json={"tasks": items},
                headers={"Prefer": "return=minimal"},
            ) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"queueing the backlog: HTTP {resp.status}")


async def _one_run(
    opts: argparse.Namespace,
    servers: Servers,
    workdir: Path,
    load: str,
    label: str,
    env: dict[str, str],
) -> Result:
    result = Result("overload", f"{load}, {label}")
    if "GATEWAY_DB_QUEUE_BUDGET_MS" in env and env is not ADMISSION_OFF:
        result.notes.append(f"GATEWAY_DB_QUEUE_BUDGET_MS={env['GATEWAY_DB_QUEUE_BUDGET_MS']}")
    slug = f"{load}-{label}".replace(" ", "-").replace(",", "")
    async with serving(opts, servers, workdir / f"overload-{slug}.log", env=env) as (proc, _db):
        script = workdir / f"overload-{slug}.lua"
        text = WRK_CLAIM_SCRIPT if load == CLAIM_COMPLETE else WRK_SCRIPT
        script.write_text(text % {"token": proc.token, "runtimes": RUNTIMES})
        steps = [
            ("before", opts.overload_connections, opts.overload_phase_seconds),
            ("overload", opts.overload_burst_connections, opts.overload_burst_seconds),
            ("after", opts.overload_connections, opts.overload_phase_seconds),
        ]
        if load == CLAIM_COMPLETE:
            # Enough for the whole run at several times the capacity measured elsewhere.
            await _backlog(proc.url, proc.token, opts.overload_backlog)
        parked = None
        if load == WITH_PARKED:
            parked = Parked(proc.url, proc.token, opts.overload_parked)
            polls = asyncio.create_task(parked.run())
            # All parked before the load starts: the last starts one wait after the first.
            await asyncio.sleep(PARKED_WAIT_SECONDS + 2.0)
        phases: dict[str, Any] = {}
        try:
            for name, connections, seconds in steps:
                log(f"overload ({load}, {label}): {name}, {connections} connections, {seconds:g} s")
                phases[name] = await _phase(proc.url, proc.token, script, connections, seconds)
        finally:
            if parked is not None:
                parked.stop.set()
                await polls
        result.numbers = {**phases, **_ratios(phases)}
        if parked is not None:
            result.numbers["parked"] = parked.summary()
            result.numbers["parked_late_share"] = parked.summary()["late_share"]
    return result


def _ratios(phases: dict[str, Any]) -> dict[str, float | None]:
    """The targets' inputs: goodput under overload against the capacity, the
    well-behaved clients' p99 under overload against before, the share of requests
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
    if shutil.which("wrk") is None:
        raise RuntimeError(
            "wrk is not installed, and the overload scenario drives its load with it "
            "(Debian and Ubuntu: apt-get install wrk; macOS: brew install wrk)"
        )
    on: dict[str, str] = {}
    if opts.overload_budget_ms is not None:
        on["GATEWAY_DB_QUEUE_BUDGET_MS"] = str(opts.overload_budget_ms)
    results = [await _one_run(opts, servers, workdir, ENQUEUE, ON, on)]
    if opts.overload_compare_off:
        results.append(await _one_run(opts, servers, workdir, ENQUEUE, OFF, ADMISSION_OFF))
    results.append(await _one_run(opts, servers, workdir, CLAIM_COMPLETE, ON, on))
    results.append(await _one_run(opts, servers, workdir, WITH_PARKED, ON, on))
    return results
