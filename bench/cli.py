"""Command line: parse options, find the servers, run the scenarios, print the tables."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .infra import Servers, check_servers, log, resolve_servers
from .scenarios import SCENARIOS
from .stats import Result, claim_throughput_table, empty_polls_table

DESCRIPTION = """\
Benchmark claim-gateway on this machine.

Each scenario run creates a fresh database (CREATE DATABASE bench_<random>, migrated,
dropped afterwards), starts the gateway as a separate process

  python -m uvicorn --factory gateway.app:create_app --host 127.0.0.1 --port <free>
         --no-access-log --loop uvloop --http httptools

with DATABASE_URL, REDIS_URL, a random GATEWAY_ADMIN_TOKEN, GATEWAY_REDIS_PREFIX=
bench<random> and GATEWAY_CACHE=on|off, waits for GET /readyz, drives it over HTTP
from this process (one aiohttp session), and stops it by pid (SIGTERM, then SIGKILL
after 10 s).

Scenarios:
  empty-polls       --pollers clients loop POST /v1/runtimes/{rt}/claim with
                    wait_seconds 0 on --runtimes empty runtimes for the duration.
                    Reports requests/s, p50/p99 latency, and Postgres claim statements
                    per request (gateway_postgres_claims_total, scraped from /metrics
                    before and after).
  claim-throughput  enqueues --tasks tasks one by one (POST /v1/runtimes/{rt}/tasks),
                    then --pollers daemons long-poll (wait_seconds --wait-seconds,
                    max_tasks --max-tasks) and complete every task. Reports tasks
                    completed/s and latency; fails when any task is handed out or
                    completed twice, or Postgres disagrees with what the clients saw.
  all               both of the above.
Each scenario runs once per --cache mode (default: both, GATEWAY_CACHE=on and off).

Servers: --database-url / --redis-url, else BENCH_DATABASE_URL / BENCH_REDIS_URL,
else TEST_DATABASE_URL / TEST_REDIS_URL, else embedded Postgres / Valkey started in
a temporary folder (needs the `embedded` extra). The Postgres URL must allow CREATE
DATABASE; only loopback gateways are started.

Exit status: 0 when every check passed; 1 when any run saw an unexpected answer
(any status other than 2xx or 429, a transport error), a hang, a stalled gateway
(GET /healthz unanswered for 5 s: the phase is aborted), errors in the gateway's log,
a duplicate, or a mismatch with Postgres; 2 for bad options; 130 when interrupted
(Ctrl-C or SIGTERM; gateways are stopped and databases dropped first).
"""

EPILOG = """\
examples:
  make bench
  make bench BENCH_ARGS="--scenario empty-polls --duration-seconds 5"
  python -m bench --scenario claim-throughput --cache on --tasks 20000 --json out.json
"""


LOAD_AT_START = [0.0]  # 1-minute load average when main() began: other work skews results


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        choices=[*SCENARIOS, "all"],
        default="all",
        help="which scenario to run (default: all)",
    )
    p.add_argument(
        "--cache",
        choices=["on", "off", "both"],
        default="both",
        help="GATEWAY_CACHE for the gateway; 'both' runs each scenario twice (default: both)",
    )
    p.add_argument(
        "--duration-seconds",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="how long each measured loop runs; the enqueue phase of claim-throughput "
        "is bounded by it too (default: 10)",
    )
    p.add_argument(
        "--pollers",
        type=_positive_int,
        default=200,
        metavar="N",
        help="concurrent polling clients / daemons (default: 200)",
    )
    p.add_argument(
        "--runtimes",
        type=_positive_int,
        default=20,
        metavar="N",
        help="runtimes the pollers are spread over, round robin (default: 20)",
    )
    p.add_argument(
        "--tasks",
        type=_positive_int,
        default=5000,
        metavar="N",
        help="claim-throughput: tasks enqueued before the daemons start (default: 5000)",
    )
    p.add_argument(
        "--max-tasks",
        type=_positive_int,
        default=10,
        metavar="N",
        help="claim-throughput: max_tasks per claim, 1-100 (default: 10)",
    )
    p.add_argument(
        "--wait-seconds",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="claim-throughput: wait_seconds of each long poll (default: 5)",
    )
    p.add_argument(
        "--enqueue-concurrency",
        type=_positive_int,
        default=50,
        metavar="N",
        help="claim-throughput: concurrent enqueue requests (default: 50)",
    )
    p.add_argument(
        "--warmup-seconds",
        type=_non_negative_float,
        default=1.0,
        metavar="S",
        help="empty-polls: unmeasured polling before the measured loop, so that "
        "connections are open and verdicts written (default: 1)",
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="Postgres server URL (its database is only used to CREATE/DROP bench_*); "
        "default: $BENCH_DATABASE_URL, else $TEST_DATABASE_URL, else embedded",
    )
    p.add_argument(
        "--redis-url",
        metavar="URL",
        help="Redis URL; default: $BENCH_REDIS_URL, else $TEST_REDIS_URL, else embedded",
    )
    p.add_argument(
        "--gateway-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the gateway process, e.g. GATEWAY_DB_POOL_MAX=40 (repeatable)",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write every number, status count and check to this JSON file",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        metavar="DIR",
        help="keep the gateway processes' logs here (default: a temporary folder, removed)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.max_tasks > 100:
        p.error("--max-tasks must be at most 100 (the API's limit)")
    args.gateway_env = dict(args.gateway_env)
    return args


def _plan(args: argparse.Namespace) -> list[tuple[str, bool]]:
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.cache]
    return [(name, cache) for name in names for cache in modes]


async def _run_all(args: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    # SIGTERM cancels the run like Ctrl-C does, so that gateways and databases are cleaned up.
    main_task = asyncio.current_task()
    if main_task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    await check_servers(servers)
    results: list[Result] = []
    for name, cache in _plan(args):
        log(f"--- {name}, GATEWAY_CACHE={'on' if cache else 'off'} ---")
        try:
            result = await SCENARIOS[name](args, servers, cache, workdir)
        except Exception as exc:
            result = Result(name, "on" if cache else "off")
            where = traceback.extract_tb(exc.__traceback__)[-1]
            result.failures.append(
                f"the run could not complete: {type(exc).__name__}: {exc} "
                f"(raised at {Path(where.filename).name}:{where.lineno} in {where.name})"
            )
            log(traceback.format_exc())
        results.append(result)
        for failure in result.failures:
            log(f"FAILED: {failure}")
    return results


def _run(coro: Any) -> Any:
    """The load generator gets uvloop too, so that the client is not the first bottleneck."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _report(args: argparse.Namespace, servers: Servers, results: list[Result]) -> str:
    out = [
        f"claim-gateway bench: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{args.pollers} pollers over {args.runtimes} runtimes, "
        f"{args.duration_seconds:g} s per run",
        f"Postgres from {servers.database_source}, Redis from {servers.redis_source}; "
        f"load average before the first run {LOAD_AT_START[0]:.2f}",
    ]
    empty = [r for r in results if r.scenario == "empty-polls"]
    work = [r for r in results if r.scenario == "claim-throughput"]
    if empty:
        out += [
            "",
            "empty polls (wait_seconds 0, runtimes with no tasks)",
            empty_polls_table(empty),
        ]
    if work:
        out += [
            "",
            f"claim throughput ({args.tasks} tasks queued first, long polls of "
            f"{args.wait_seconds:g} s, max_tasks {args.max_tasks})",
            claim_throughput_table(work),
        ]
    for r in results:
        for note in r.notes:
            out.append(f"note  [{r.scenario}, cache {r.cache}] {note}")
    for r in results:
        for failure in r.failures:
            out.append(f"FAIL  [{r.scenario}, cache {r.cache}] {failure}")
    failed = sum(1 for r in results if not r.ok)
    out += ["", f"{len(results) - failed} of {len(results)} runs passed every check"]
    return "\n".join(out)


def _write_json(
    path: Path, args: argparse.Namespace, servers: Servers, results: list[Result]
) -> None:
    doc = {
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_start": LOAD_AT_START[0],
        },
        "options": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("database_url", "redis_url")
        },
        "servers": {"postgres": servers.database_source, "redis": servers.redis_source},
        "results": [asdict(r) for r in results],
        "ok": all(r.ok for r in results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOAD_AT_START[0] = os.getloadavg()[0]
    started = time.monotonic()
    temp_logs = args.log_dir is None
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-logs-")) if temp_logs else args.log_dir
    workdir.mkdir(parents=True, exist_ok=True)
    servers = resolve_servers(args.database_url, args.redis_url)
    try:
        results = _run(_run_all(args, servers, workdir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: gateways stopped, databases dropped")
        return 130
    finally:
        servers.close()
        if temp_logs:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
    print(_report(args, servers, results))
    if args.json:
        _write_json(args.json, args, servers, results)
        log(f"results written to {args.json}")
    log(f"done in {time.monotonic() - started:.1f} s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
