"""Command line: parse options, find the servers, run the scenarios, print the tables."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .bulk_insert import bulk_insert
from .infra import Servers, check_servers, log, resolve_servers
from .peers import PGQUEUER_VERSION
from .plots import write_png
from .scale import scale
from .scenarios import SCENARIOS
from .stats import Result, claim_throughput_table, table
from .suite import SUITES
from .targets import evaluate, targets_table

# Every scenario of the comparison suite, in the order `all` runs them.
SUITE_ORDER = [
    "empty-polls",
    "round-trips",
    "enqueue",
    "drain",
    "wake-latency",
    "parked-polls",
    "scale",
    "bulk-insert",
    "workers",
    "overload",
    "schedules",
]
LEGACY = {"claim-throughput": SCENARIOS["claim-throughput"]}

DESCRIPTION = """\
Benchmark claim-gateway on this machine against its peers, in one run.

Each gateway figure is measured beside its peers in the same invocation, so that the
table shows ratios (absolute figures on a shared 2-core machine are noise). Every
process (the gateway, the bare Starlette floor, pgqueuer's driver) is started here,
on loopback, and stopped by pid; every database (bench_<random>) is dropped and every
Redis key under the run's prefix deleted afterwards.

Scenarios (--scenario, comma-separated, default all; about 15 minutes on 2 cores):
  empty-polls     --connections clients claim with wait_seconds 0, rotating over
                  --poll-runtimes empty runtimes, for --poll-seconds: the gateway with
                  the cache on (access log off, then on as `gateway serve` starts by
                  default), with it off, the bare Starlette floor, and the floor
                  plus one Redis MGET per request. req/s, p50/p99, Postgres claims
                  per poll (the gateway's own counter).
  round-trips     each kind of request (empty claim, claim of a task, enqueue,
                  complete, batch enqueue of 100) --round-trip-requests times, one
                  at a time, with the cache off and on, through a relay that counts
                  the gateway's round trips to Postgres on the wire.
  enqueue         batch enqueue (1,000 per request) tasks/s against pgqueuer's batch
                  enqueue, answering the new tasks' ids (Prefer: return=minimal,
                  as pgqueuer answers its jobs' ids) and whole tasks; single
                  enqueues/s beside it.
  drain           --drain-tasks queued tasks, --drain-workers workers, max_tasks
                  --drain-max-tasks: one complete per task, then batch
                  acknowledgement (POST /v1/tasks:complete); then max_tasks 1,
                  the complete sent beside the next claim, then carried by it;
                  against pgqueuer's drain; every task handed out and completed
                  exactly once.
  wake-latency    --wake-parked long polls over --wake-runtimes runtimes; one task
                  enqueued at a time; enqueue answered -> parked claim answered.
  parked-polls    --park-sizes long polls parked in one gateway; RSS per parked poll
                  and Postgres statements/s over --park-window-seconds.
  scale           --scale-sizes rows of each shape (delayed, finished, many
                  runtimes), then --scale-table-rows in all with retention
                  deleting old history; claim, stats, janitor pass, enqueue and
                  claim cost against the small-runtime baseline. Then a burst:
                  --scale-burst tasks of one runtime claimed and completed, no
                  VACUUM from the bench, its claims and stats watched for 90 s
                  against quiet runtimes.
  bulk-insert     one INSERT of --bulk-rows finished tasks each (10^5, 10^6),
                  triggers on and off: the time must grow linearly with the rows
                  (the finished-task counters are kept once per statement).
  workers         uvicorn --workers 2 against 1: empty polls and a drain; Redis
                  connections per process.
  overload        wrk posting single enqueues (then claims and completes, then
                  enqueues beside --overload-parked polls): --overload-connections (16) for
                  --overload-phase-seconds, then --overload-burst-connections
                  (2,000) for --overload-burst-seconds with a 2 s client timeout,
                  then 16 again; a well-behaved client beside it. Goodput, the
                  accepted p99, client timeouts, recovery; again with admission
                  control off (--no-overload-compare-off to skip).
  schedules       --schedules (10,000) schedules over 1,000 runtimes, every 10 s,
                  created with PUT over --schedule-connections (32), ticking for
                  --schedule-seconds (40) while --schedule-workers (4) drain their
                  tasks, then until that window's ticks are all decided: tick
                  lag (task created vs its tick's time), ticks expected vs made,
                  duplicate ticks, the tick pass's transactions; read from
                  Postgres. About a minute.
  claim-throughput  the earlier scenario (--tasks enqueued one by one, --pollers
                  daemons), once per --cache mode; not part of all.

Servers: --database-url / --redis-url, else BENCH_DATABASE_URL / BENCH_REDIS_URL,
else TEST_DATABASE_URL / TEST_REDIS_URL, else embedded Postgres / Valkey started in
a temporary folder (needs the `embedded` extra). The Postgres URL must allow CREATE
DATABASE. pgqueuer is installed on first use into .gateway/bench-peers/ (its own
virtual environment, never the project's).

Output: the targets table (measured, target, PASS/MISS/n/a) and one table per
scenario on stdout, progress on stderr, --json PATH with every number, --png PATH
with the latency distributions, the ratios and the scale plot.

Exit status: 0 when every check passed; 1 when any run saw an unexpected answer
(any status other than 2xx or 429, a transport error), a hang, a stalled gateway,
errors in the gateway's log, a duplicate, or a mismatch with Postgres (a MISS is a
finding, not a failure); 2 for bad options; 130 when interrupted.
"""

EPILOG = """\
examples:
  make bench
  make bench BENCH_ARGS="--scenario empty-polls,drain --poll-seconds 3"
  python -m bench --scenario scale --scale-sizes 10000,100000 --json out.json
  python -m bench --scenario claim-throughput --cache on --tasks 20000
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


def _non_negative_int(text: str) -> int:
    value = int(text)
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


def _scenarios(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(SUITE_ORDER)
    known = [*SUITE_ORDER, *LEGACY]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown scenario {', '.join(unknown) or text!r}; choose from "
            + ", ".join([*known, "all"])
        )
    return names


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(n.replace("_", "")) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers like 10000,100000, got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be at least 1, got {text!r}")
    return sizes


def _sizes_one(text: str) -> int:
    try:
        n = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number like 10000000, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return n


def _park_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        n, sep, r = part.strip().partition("x")
        if not sep or not n.isdigit() or not r.isdigit() or int(n) < 1 or int(r) < 1:
            raise argparse.ArgumentTypeError(f"expected NxR like 2000x200, got {part!r}")
        out.append((int(n), int(r)))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        type=_scenarios,
        default=list(SUITE_ORDER),
        metavar="NAMES",
        help="comma-separated: " + ", ".join([*SUITE_ORDER, *LEGACY]) + ", or all (default: all)",
    )
    p.add_argument(
        "--connections",
        type=_positive_int,
        default=64,
        metavar="N",
        help="empty-polls, enqueue: concurrent connections (default: 64)",
    )
    p.add_argument(
        "--poll-runtimes",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="empty-polls: runtimes the claims rotate over (default: 1000)",
    )
    p.add_argument(
        "--poll-seconds",
        type=_positive_float,
        default=5.0,
        metavar="S",
        help="empty-polls, single enqueue: measured seconds per variant (default: 5)",
    )
    p.add_argument(
        "--park-sizes",
        type=_park_sizes,
        default=_park_sizes("2000x200,10000x200,10000x1000"),
        metavar="NxR,...",
        help="parked-polls: N polls over R runtimes, one gateway each "
        "(default: 2000x200,10000x200,10000x1000)",
    )
    p.add_argument(
        "--park-window-seconds",
        type=_positive_float,
        default=15.0,
        metavar="S",
        help="parked-polls: window for Postgres statements/s; pg_stat_database "
        "publishes late, so keep it >= 15 (default: 15)",
    )
    p.add_argument(
        "--wake-parked",
        type=_positive_int,
        default=2000,
        metavar="N",
        help="wake-latency: parked long polls (default: 2000)",
    )
    p.add_argument(
        "--wake-runtimes",
        type=_positive_int,
        default=200,
        metavar="N",
        help="wake-latency: runtimes they park on (default: 200)",
    )
    p.add_argument(
        "--wakes",
        type=_positive_int,
        default=200,
        metavar="N",
        help="wake-latency: tasks enqueued one at a time (default: 200)",
    )
    p.add_argument(
        "--wake-seconds",
        type=_positive_float,
        default=30.0,
        metavar="S",
        help="wake-latency: bound on the wakes (default: 30)",
    )
    p.add_argument(
        "--drain-tasks",
        type=_positive_int,
        default=20_000,
        metavar="N",
        help="drain: tasks (and pgqueuer jobs) (default: 20000)",
    )
    p.add_argument(
        "--round-trip-requests",
        type=_positive_int,
        default=100,
        metavar="N",
        help="round-trips: measured requests of each kind, after two unmeasured "
        "rounds as long (default: 100)",
    )
    p.add_argument(
        "--enqueue-tasks",
        type=_positive_int,
        default=100_000,
        metavar="N",
        help="enqueue: tasks of the batch enqueue, and pgqueuer's jobs beside it; "
        "100 requests of 1,000 by default, so that one slow request moves the ratio "
        "little (default: 100000)",
    )
    p.add_argument(
        "--drain-workers",
        type=_positive_int,
        default=16,
        metavar="N",
        help="drain: workers, gateway daemons and pgqueuer queue managers (default: 16)",
    )
    p.add_argument(
        "--drain-runtimes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="drain: runtimes the gateway's tasks are spread over; 1 is "
        "pgqueuer's single entrypoint (default: 1)",
    )
    p.add_argument(
        "--drain-max-tasks",
        type=_positive_int,
        default=10,
        metavar="N",
        help="drain: claim max_tasks, and pgqueuer's batch size (default: 10)",
    )
    p.add_argument(
        "--drain-seconds",
        type=_positive_float,
        default=60.0,
        metavar="S",
        help="drain, enqueue: bound on each phase (default: 60)",
    )
    p.add_argument(
        "--drain-analyze",
        action="store_true",
        help="drain: ANALYZE the task table once the tasks are queued, before the workers "
        "start, as autovacuum soon does on a gateway that has been up a while (default: "
        "the drain runs on a table without statistics)",
    )
    p.add_argument(
        "--workers-drain-tasks",
        type=_positive_int,
        default=5_000,
        metavar="N",
        help="workers: tasks of each drain (default: 5000)",
    )
    p.add_argument(
        "--scale-sizes",
        type=_sizes,
        default=[10_000, 100_000, 1_000_000],
        metavar="N,...",
        help="scale: rows of each shape (default: 10000,100000,1000000)",
    )
    p.add_argument(
        "--overload-connections",
        type=int,
        default=16,
        help="overload: wrk's connections before and after the overload (default: 16)",
    )
    p.add_argument(
        "--overload-burst-connections",
        type=int,
        default=2000,
        help="overload: wrk's connections during the overload (default: 2000)",
    )
    p.add_argument(
        "--overload-phase-seconds",
        type=float,
        default=8.0,
        help="overload: seconds before and after the overload, each (default: 8)",
    )
    p.add_argument(
        "--overload-burst-seconds",
        type=float,
        default=15.0,
        help="overload: seconds of the overload (default: 15)",
    )
    p.add_argument(
        "--overload-parked",
        type=int,
        default=2000,
        help="overload: polls parked during the third load (default: 2000)",
    )
    p.add_argument(
        "--overload-backlog",
        type=int,
        default=100_000,
        help="overload: tasks queued before the claim-and-complete load (default: 100000)",
    )
    p.add_argument(
        "--overload-budget-ms",
        type=_positive_int,
        default=None,
        metavar="MS",
        help="overload: GATEWAY_DB_QUEUE_BUDGET_MS of the gateway under test, for "
        "tuning it (default: the gateway's own default)",
    )
    p.add_argument(
        "--overload-compare-off",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overload: run it again with shedding off, to show the collapse (default: on)",
    )
    p.add_argument(
        "--schedules",
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="schedules: schedules created, spread over 1,000 runtimes (default: 10000)",
    )
    p.add_argument(
        "--schedule-seconds",
        type=_positive_float,
        default=40.0,
        metavar="S",
        help="schedules: seconds the schedules tick once all are created; at 10 s a "
        "tick, 40 s is 4 ticks each (default: 40)",
    )
    p.add_argument(
        "--schedule-workers",
        type=_non_negative_int,
        default=4,
        metavar="N",
        help="schedules: workers draining the tasks, each claiming up to 10 tasks of a "
        "runtime at a time; 0 leaves them queued (default: 4)",
    )
    p.add_argument(
        "--schedule-connections",
        type=_positive_int,
        default=32,
        metavar="N",
        help="schedules: concurrent connections creating the schedules (default: 32)",
    )
    p.add_argument(
        "--bulk-rows",
        type=_sizes,
        default=[100_000, 1_000_000],
        metavar="N,...",
        help="bulk-insert: rows of each timed INSERT, two or more sizes (default: 100000,1000000)",
    )
    p.add_argument(
        "--scale-table-rows",
        type=_sizes_one,
        default=10_000_000,
        metavar="N",
        help="scale: after the shapes, grow the table to N rows with finished tasks, "
        "half of them past retention, and measure again while retention deletes them "
        "(default: 10000000; 0: skip)",
    )
    p.add_argument(
        "--scale-burst",
        type=_sizes_one,
        default=1_000_000,
        metavar="N",
        help="scale: last, N queued tasks of one runtime claimed and completed through the "
        "gateway's statements, with no VACUUM or ANALYZE after them; claims and stats "
        "watched for 90 s against quiet runtimes (default: 1000000; 0: skip)",
    )
    p.add_argument(
        "--scale-samples",
        type=_positive_int,
        default=30,
        metavar="N",
        help="scale: timings of each operation per size (default: 30)",
    )
    p.add_argument(
        "--scale-seconds",
        type=_positive_float,
        default=20.0,
        metavar="S",
        help="scale: time bound on the timings at each size; at least 5 of each are "
        "taken (default: 20)",
    )
    p.add_argument(
        "--png",
        type=Path,
        default=Path("bench/results/bench.png"),
        metavar="PATH",
        help="the figure (default: bench/results/bench.png)",
    )
    p.add_argument(
        "--cache",
        choices=["on", "off", "both"],
        default="both",
        help="claim-throughput: GATEWAY_CACHE for the gateway; 'both' runs it twice "
        "(default: both)",
    )
    p.add_argument(
        "--duration-seconds",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="claim-throughput: how long each measured loop runs; its enqueue phase is "
        "bounded by it too (default: 10)",
    )
    p.add_argument(
        "--pollers",
        type=_positive_int,
        default=200,
        metavar="N",
        help="claim-throughput: concurrent daemons (default: 200)",
    )
    p.add_argument(
        "--runtimes",
        type=_positive_int,
        default=20,
        metavar="N",
        help="claim-throughput: runtimes the daemons are spread over, round robin (default: 20)",
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
    if len(set(args.bulk_rows)) < 2:
        p.error("--bulk-rows needs two different sizes at least, e.g. 100000,1000000")
    args.gateway_env = dict(args.gateway_env)
    args.pgqueuer_version = PGQUEUER_VERSION
    return args


async def _guarded(name: str, label: str, coro: Any) -> list[Result]:
    """A scenario that raised becomes a failed result; the run goes on."""
    try:
        out = await coro
        return out if isinstance(out, list) else [out]
    except Exception as exc:
        result = Result(name, label)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        result.failures.append(
            f"the run could not complete: {type(exc).__name__}: {exc} "
            f"(raised at {Path(where.filename).name}:{where.lineno} in {where.name})"
        )
        log(traceback.format_exc())
        return [result]


async def _run_all(args: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    # SIGTERM cancels the run like Ctrl-C does, so that gateways and databases are cleaned up.
    main_task = asyncio.current_task()
    if main_task is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    await check_servers(servers)
    results: list[Result] = []
    for name in args.scenario:
        log(f"--- {name} ---")
        seen = len(results)
        if name in LEGACY:
            modes = {"on": [True], "off": [False], "both": [True, False]}[args.cache]
            for cache in modes:
                label = "on" if cache else "off"
                results += await _guarded(name, label, LEGACY[name](args, servers, cache, workdir))
        elif name == "scale":
            results += await _guarded(name, "all", scale(args, servers, workdir))
        elif name == "bulk-insert":
            results += await _guarded(name, "all", bulk_insert(args, servers, workdir))
        else:
            results += await _guarded(name, "all", SUITES[name](args, servers, workdir))
        for r in results[seen:]:
            for failure in r.failures:
                log(f"FAILED [{r.scenario}, {r.cache}]: {failure}")
    return results


def _run(coro: Any) -> Any:
    """The load generator gets uvloop too, so that the client is not the first bottleneck."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _scalars(numbers: dict[str, Any], keys: list[str]) -> list[str]:
    out = []
    for key in keys:
        value = numbers.get(key)
        if isinstance(value, float):
            out.append(f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.5f}")
        elif value is None:
            out.append("-")
        else:
            out.append(f"{value:,}" if isinstance(value, int) else str(value))
    return out


# Per scenario: the columns of its detail table (keys of Result.numbers).
DETAIL_COLUMNS: dict[str, list[str]] = {
    "empty-polls": [
        "requests_per_second",
        "p50_ms",
        "p99_ms",
        "pg_claims",
        "pg_claims_per_poll",
        "pg_stat_xacts",
        "server_cpu_percent",
        "server_cpu_us_per_request",
        "bench_cpu_percent",
        "errors",
    ],
    "workers: empty polls": [
        "requests_per_second",
        "p50_ms",
        "p99_ms",
        "pg_claims_per_poll",
        "server_cpu_percent",
        "redis_connections_by_process",
    ],
    "round-trips": [
        "empty_claim_round_trips",
        "claim_round_trips",
        "enqueue_round_trips",
        "complete_round_trips",
        "batch_enqueue_round_trips",
        "requests_each",
        "background_round_trips",
        "set_up_round_trips",
    ],
    "enqueue": [
        "tasks",
        "seconds",
        "tasks_per_second",
        "requests_per_second",
        "request_p50_ms",
        "request_p99_ms",
        "server_cpu_ms_per_request",
        "bench_cpu_ms_per_request",
    ],
    "wake-latency": [
        "wakes",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "from_enqueue_sent_p50_ms",
        "from_enqueue_sent_p99_ms",
        "claim_answered_before_enqueue_answer",
        "pg_claims_per_wake",
        "verdict_reads_per_wake",
        "sync_matches",
    ],
    "parked-polls": [
        "parked_at_end",
        "rss_before_mib",
        "rss_parked_mib",
        "kib_per_parked_poll",
        "pg_claims_per_second",
        "pg_stat_xacts_per_second",
        "window_seconds",
        "stop_seconds",
    ],
    "schedules": [
        "schedules",
        "ticks_expected",
        "ticks_made",
        "duplicate_ticks",
        "silent_gaps",
        "decided_ahead_share",
        "lag_p50_ms",
        "lag_p99_ms",
        "lag_max_ms",
        "tick_write_p50_ms",
        "tick_write_max_ms",
        "batches_per_tick",
        "insert_per_batch_p50_ms",
        "between_batches_p50_ms",
        "gateway_pass_mean_ms",
        "settle_seconds",
        "put_seconds",
        "tasks_completed",
    ],
    "scale": ["sizes", "shape_rows", "runtimes", "p50_ms", "p99_ms", "x_baseline_p50"],
    "bulk-insert": [
        "rows",
        "seconds",
        "seconds_triggers_off",
        "x_triggers_off",
        "counter_writes",
        "rows_per_second",
    ],
}


def _details(results: list[Result]) -> list[str]:
    out: list[str] = []
    order: list[str] = []
    for r in results:
        if r.scenario not in order:
            order.append(r.scenario)
    for name in order:
        group = [r for r in results if r.scenario == name]
        out.append("")
        out.append(name)
        if name in ("drain", "claim-throughput", "workers: drain"):
            out.append(claim_throughput_table(group))
        elif name == "pgqueuer":
            r = group[0]
            rows = [[k, json.dumps(v)] for k, v in r.numbers.items()] or [["-", "not measured"]]
            out.append(table([r.cache, "numbers"], rows))
        else:
            cols = DETAIL_COLUMNS.get(name) or sorted(
                {k for r in group for k, v in r.numbers.items() if isinstance(v, int | float)}
            )
            rows = [
                [r.scenario, r.cache, *_scalars(r.numbers, cols), "ok" if r.ok else "FAIL"]
                for r in group
            ]
            out.append(table(["scenario", "variant", *cols, "checks"], rows))
    return out


def _report(args: argparse.Namespace, servers: Servers, results: list[Result]) -> str:
    rows = evaluate(results)
    out = [
        f"claim-gateway bench: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"Postgres from {servers.database_source}, Redis from {servers.redis_source}; "
        f"load average before the first run {LOAD_AT_START[0]:.2f}",
        "",
        "targets (ratios are to peers measured in this same run)",
        targets_table(rows),
        *_details(results),
    ]
    for r in results:
        for note in r.notes:
            out.append(f"note  [{r.scenario}, {r.cache}] {note}")
    for r in results:
        for failure in r.failures:
            out.append(f"FAIL  [{r.scenario}, {r.cache}] {failure}")
    failed = sum(1 for r in results if not r.ok)
    out += ["", f"{len(results) - failed} of {len(results)} results passed every check"]
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
        "targets": [row.as_dict() for row in evaluate(results)],
        "results": [asdict(r) for r in results],
        "ok": all(r.ok for r in results),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def raise_open_files_limit() -> int:
    """Parked polls hold a socket each, here and in the gateway (which inherits this):
    raise the soft limit on open files to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    LOAD_AT_START[0] = os.getloadavg()[0]
    limit = raise_open_files_limit()
    biggest = max([n for n, _ in args.park_sizes] + [args.wake_parked])
    if limit < biggest + 1000:
        log(f"open-files limit is {limit}: fewer than the {biggest:,} parked polls need")
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
    problem = write_png(args.png, results, evaluate(results))
    log(problem or f"figure written to {args.png}")
    log(f"done in {time.monotonic() - started:.1f} s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
