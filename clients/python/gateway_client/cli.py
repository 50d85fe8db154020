"""`work`, `enqueue`, `runtime` and `schedule` (schedule_cli.py): the client's commands,
in `gateway` (the server's command) and in `gateway-client` (this distribution's). Only
the standard library is imported until a command runs, so that building the parser costs
nothing."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from .schedule_cli import add_schedule_command

# `enqueue`'s exit codes.
EXIT_ERROR = 1  # the gateway refused the call, or no answer came
EXIT_BAD_PAYLOAD = 2
EXIT_NOT_COMPLETED = 3  # --wait: the task ended dead, expired or cancelled
EXIT_WAIT_TIMED_OUT = 4  # --wait: the task had not finished within --wait-seconds
DEFAULT_WAIT_SECONDS = 600.0

CONNECTION_HELP = (
    "The gateway is GATEWAY_URL (default http://127.0.0.1:8080) and the bearer token "
    "GATEWAY_TOKEN, unless --url / --token say otherwise."
)


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="the gateway's base URL (default: $GATEWAY_URL)")
    parser.add_argument("--token", help="bearer token (default: $GATEWAY_TOKEN)")


def add_commands(sub: Any) -> None:
    """Adds `work`, `enqueue`, `runtime` and `schedule` to an argparse subparsers object."""
    work = sub.add_parser(
        "work",
        help="run a command for each task of a runtime",
        description="Long-poll RUNTIME and run CMD once per task, in a process group of its "
        "own: the payload as JSON on stdin, GATEWAY_TASK_ID, GATEWAY_TASK_ATTEMPT and "
        "GATEWAY_RUNTIME in its environment, and TRACEPARENT and TRACESTATE when the task "
        "carries a trace context (never the worker's own). Exit 0 completes the task with "
        'stdout (its JSON, else {"stdout": ...}); another exit fails it with the exit code and the '
        "last 4 KiB of stderr. A cancelled task's process group gets SIGTERM, then SIGKILL. "
        "SIGTERM or SIGINT: claim no more, let running commands finish within "
        "--grace-seconds, then release what still runs; a second signal releases at once. "
        "With OTEL_EXPORTER_OTLP_ENDPOINT set and claim-gateway-client[otel] installed, each "
        "task's run is a consumer span exported over OTLP/HTTP, and its command's TRACEPARENT "
        "names that span. " + CONNECTION_HELP,
    )
    work.add_argument("runtime", metavar="RUNTIME")
    work.add_argument("--concurrency", type=int, default=1, help="commands at once (%(default)s)")
    work.add_argument(
        "--lease-seconds", type=int, default=60, help="lease length, heartbeated every third"
    )
    work.add_argument(
        "--max-tasks-per-poll", type=int, default=10, help="most tasks one claim asks for"
    )
    work.add_argument(
        "--grace-seconds", type=float, default=30.0, help="shutdown wait for commands"
    )
    work.add_argument(
        "--wait-seconds", type=float, default=20.0, help="long poll length (%(default)s)"
    )
    work.add_argument("--worker-id", help="default: HOSTNAME-PID")
    work.add_argument(
        "--max-result-bytes",
        type=int,
        default=1024 * 1024,
        help="stdout kept as the result; the gateway's GATEWAY_MAX_PAYLOAD_BYTES",
    )
    _connection_options(work)
    # Filled from what follows `--` (see parse_args): CMD's own options stay CMD's.
    work.add_argument("argv", nargs="*", metavar="-- CMD ARGS", help="the command to run")
    work.set_defaults(func=cmd_work)

    enqueue = sub.add_parser(
        "enqueue",
        help="enqueue one task and print it as JSON (or, with --wait, its result)",
        description="Enqueue a task for RUNTIME and print the task as JSON. With --wait, "
        "wait for the task to finish instead and print its result as JSON; exit codes: "
        f"0 completed, {EXIT_ERROR} the gateway refused or could not be reached, "
        f"{EXIT_BAD_PAYLOAD} a bad --payload, {EXIT_NOT_COMPLETED} the task ended dead, "
        f"expired or cancelled, {EXIT_WAIT_TIMED_OUT} it had not finished within "
        "--wait-seconds (then the task, as JSON, is printed instead of a result, and the "
        "reason goes to stderr). " + CONNECTION_HELP,
    )
    enqueue.add_argument("runtime", metavar="RUNTIME")
    enqueue.add_argument("--payload", required=True, help="JSON; @FILE reads a file, - reads stdin")
    enqueue.add_argument("--priority", type=int, help="0-1000, higher first (50)")
    enqueue.add_argument("--delay-seconds", type=float, help="not claimable before then")
    enqueue.add_argument("--idempotency-key", help="a repeat with this key is not stored twice")
    enqueue.add_argument(
        "--wait", action="store_true", help="wait for the task to finish; print its result"
    )
    enqueue.add_argument(
        "--wait-seconds",
        type=float,
        help=f"how long --wait waits in all (default {DEFAULT_WAIT_SECONDS:g}); implies --wait",
    )
    _connection_options(enqueue)
    enqueue.set_defaults(func=cmd_enqueue)
    _add_runtime_command(sub)
    add_schedule_command(sub)


# `runtime`'s exit codes (argparse's own usage errors are 2 as well).
EXIT_BAD_ARGUMENTS = 2
RUNTIME_HELP = (
    "Each action prints the runtime's controls afterwards as JSON: paused, paused_reason, "
    "paused_since, paused_until, max_in_flight, claims_per_second, updated_at. Exit codes: "
    f"0 done, {EXIT_ERROR} the gateway refused the call or could not be reached (the "
    f"reason goes to stderr), {EXIT_BAD_ARGUMENTS} bad arguments. pause, resume and limits "
    "need a token with the control scope (or admin) that covers the runtime; show needs "
    "the read scope. "
)
UNTIL_HELP = (
    "when the pause ends by itself: an RFC 3339 time with a zone "
    "(2026-11-26T18:00:00Z) or a duration from now (90s, 30m, 2h, 1d); "
    "default: until `gateway runtime resume`"
)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _add_runtime_command(sub: Any) -> None:
    runtime = sub.add_parser(
        "runtime",
        help="pause, resume, limit or show a runtime",
        description="Runtime controls, through the gateway's HTTP API. A paused runtime "
        "hands out no tasks to its workers (their claims wait), while tasks can still be "
        "enqueued; limits bound how many of its tasks are worked on at once "
        "(--max-in-flight) and how many are handed out per second (--claims-per-second), "
        "over every gateway instance. " + RUNTIME_HELP + CONNECTION_HELP,
    )
    actions = runtime.add_subparsers(dest="action", metavar="ACTION", required=True)
    pause = actions.add_parser(
        "pause",
        help="stop handing out the runtime's tasks, optionally with a reason and an end",
        description="Pause RUNTIME: its workers get no tasks until it is resumed, or until "
        "--until. Pausing a paused runtime replaces its reason and end. "
        + RUNTIME_HELP
        + CONNECTION_HELP,
    )
    pause.add_argument("runtime", metavar="RUNTIME")
    pause.add_argument(
        "--reason",
        metavar="TEXT",
        help="why, shown with the runtime's controls, stats and in the console (at most "
        "500 characters)",
    )
    pause.add_argument("--until", metavar="TIME", help=UNTIL_HELP)
    resume = actions.add_parser(
        "resume",
        help="hand out the runtime's tasks again",
        description="Resume RUNTIME: its waiting workers get tasks at once. Resuming a "
        "runtime that is not paused changes nothing. " + RUNTIME_HELP + CONNECTION_HELP,
    )
    resume.add_argument("runtime", metavar="RUNTIME")
    limits = actions.add_parser(
        "limits",
        help="set or remove the runtime's limits",
        description="Set or remove RUNTIME's limits; give at least one option. A limit left "
        "out keeps its value; `none` removes it. " + RUNTIME_HELP + CONNECTION_HELP,
    )
    limits.add_argument("runtime", metavar="RUNTIME")
    limits.add_argument(
        "--max-in-flight",
        metavar="N|none",
        help="at most N (1-100000) of the runtime's tasks being worked on at once",
    )
    limits.add_argument(
        "--claims-per-second",
        metavar="R|none",
        help="at most R tasks handed out per second (above 0, at most 100000; fractions "
        "allowed: 0.5 is one every two seconds)",
    )
    show = actions.add_parser(
        "show",
        help="print the runtime's controls",
        description="Print RUNTIME's controls as JSON. A runtime never paused or limited "
        "shows paused false, no limits and updated_at null. " + RUNTIME_HELP + CONNECTION_HELP,
    )
    show.add_argument("runtime", metavar="RUNTIME")
    for parser in (pause, resume, limits, show):
        _connection_options(parser)
        parser.set_defaults(func=cmd_runtime)


def parse_until(value: str) -> str:
    """--until: an RFC 3339 time as given, or a duration from now (90s, 30m, 2h, 1d)
    as an RFC 3339 UTC time. ValueError for anything else."""
    from datetime import UTC, datetime, timedelta

    text = value.strip()
    if text[:-1].replace(".", "", 1).isdigit() and text[-1:] in _UNITS:
        seconds = float(text[:-1]) * _UNITS[text[-1]]
        if seconds <= 0:
            raise ValueError("a duration must be more than 0")
        return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()
    if "T" not in text and "t" not in text and " " not in text:
        raise ValueError(
            "give an RFC 3339 time such as 2026-11-26T18:00:00Z or a duration such as 30m"
        )
    return text  # the gateway checks it, and answers naming `until`


def parse_limit(option: str, value: str | None, kind: type[int] | type[float]) -> Any:
    """A limit option: KEEP when not given, None for `none`, else the number."""
    from .models import KEEP

    if value is None:
        return KEEP
    if value.strip().lower() == "none":
        return None
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{option} must be {what} or none, not {value!r}") from None


def cmd_runtime(args: argparse.Namespace) -> int:
    from .client import AsyncClient
    from .models import KEEP

    name = f"runtime {args.action}"
    try:
        if args.action == "pause":
            until = None if args.until is None else parse_until(args.until)
        if args.action == "limits":
            max_in_flight = parse_limit("--max-in-flight", args.max_in_flight, int)
            rate = parse_limit("--claims-per-second", args.claims_per_second, float)
            if max_in_flight is KEEP and rate is KEEP:
                raise ValueError("give --max-in-flight, --claims-per-second or both")
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS

    async def run() -> dict[str, Any]:
        async with AsyncClient(args.url, args.token) as client:
            if args.action == "pause":
                controls = await client.pause(args.runtime, reason=args.reason, until=until)
            elif args.action == "resume":
                controls = await client.resume(args.runtime)
            elif args.action == "limits":
                controls = await client.set_controls(
                    args.runtime, max_in_flight=max_in_flight, claims_per_second=rate
                )
            else:
                controls = await client.get_controls(args.runtime)
            return controls.to_json()

    needed = "read" if args.action == "show" else "control (or admin)"
    return print_answer(name, args.runtime, needed, run)


def print_answer(
    name: str, runtime: str, needed: str, run: Callable[[], Coroutine[Any, Any, Any]]
) -> int:
    """Run a command's call (`run`) and print its answer as JSON: 0; or say on stderr
    why the gateway refused it (a forbidden call names the scope `needed` on `runtime`):
    EXIT_ERROR."""
    import asyncio

    from .errors import Forbidden, GatewayError

    try:
        answer = asyncio.run(run())
    except Forbidden as exc:
        print(
            f"{name}: forbidden: {exc.detail}. This needs a token with the {needed} scope "
            f"that covers runtime {runtime}.",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except GatewayError as exc:
        field = f" (field {exc.field})" if exc.field else ""
        print(f"{name}: {exc.code}: {exc.detail}{field}", file=sys.stderr)
        return EXIT_ERROR
    print(json.dumps(answer))
    return 0


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parses what comes before the first `--`; what follows is `work`'s command, so
    that `gateway work rt --concurrency 4 -- cmd --concurrency 9` means what it says."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        return parser.parse_args(argv)
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    if getattr(args, "func", None) is not cmd_work:
        parser.error("only `work` takes a command after --")
    args.argv = [*args.argv, *argv[cut + 1 :]]
    return args


def read_payload(value: str) -> Any:
    """`--payload`: JSON text, @FILE or - (stdin)."""
    if value == "-":
        text = sys.stdin.read()
    elif value.startswith("@"):
        with open(value[1:], encoding="utf-8") as f:
            text = f.read()
    else:
        text = value
    return json.loads(text)


def cmd_enqueue(args: argparse.Namespace) -> int:
    import asyncio

    from .client import AsyncClient
    from .errors import GatewayError, WaitTimedOut

    try:
        payload = read_payload(args.payload)
    except (OSError, ValueError) as exc:
        print(f"enqueue: --payload: {exc}", file=sys.stderr)
        return EXIT_BAD_PAYLOAD
    wait_seconds = args.wait_seconds
    if wait_seconds is None and args.wait:
        wait_seconds = DEFAULT_WAIT_SECONDS
    if wait_seconds is not None and wait_seconds < 0:
        print("enqueue: --wait-seconds must not be negative", file=sys.stderr)
        return EXIT_ERROR

    async def enqueue() -> dict[str, Any]:
        async with AsyncClient(args.url, args.token) as client:
            task = await client.enqueue(
                args.runtime,
                payload,
                priority=args.priority,
                delay_seconds=args.delay_seconds,
                idempotency_key=args.idempotency_key,
            )
            if wait_seconds is not None:
                task = await client.wait(task.id, timeout_seconds=wait_seconds)
            return task.raw

    try:
        task = asyncio.run(enqueue())
    except WaitTimedOut as exc:
        print(json.dumps(exc.task.raw))
        print(f"enqueue: {exc.detail}", file=sys.stderr)
        return EXIT_WAIT_TIMED_OUT
    except GatewayError as exc:
        print(f"enqueue: {exc.code}: {exc.detail}", file=sys.stderr)
        return EXIT_ERROR
    if wait_seconds is None:
        print(json.dumps(task))
        return 0
    if task["status"] != "completed":
        print(json.dumps(task))
        reason = f": {task['last_error']}" if task.get("last_error") else ""
        print(f"enqueue: task {task['id']} ended {task['status']}{reason}", file=sys.stderr)
        return EXIT_NOT_COMPLETED
    print(json.dumps(task.get("result")))
    return 0


def cmd_work(args: argparse.Namespace) -> int:
    import asyncio

    from .client import AsyncClient
    from .command import CommandHandler
    from .options import WorkerOptions
    from .tracing.export import exporting_provider
    from .worker import Worker

    command = args.argv
    if not command:
        print(
            "work: give the command after --, e.g. gateway work demo -- ./run.sh", file=sys.stderr
        )
        return 2
    if shutil.which(command[0]) is None:
        print(f"work: {command[0]}: command not found", file=sys.stderr)
        return 2
    try:
        options = WorkerOptions(
            concurrency=args.concurrency,
            lease_seconds=args.lease_seconds,
            max_tasks_per_poll=args.max_tasks_per_poll,
            grace_seconds=args.grace_seconds,
            wait_seconds=args.wait_seconds,
            **({"worker_id": args.worker_id} if args.worker_id else {}),
        )
    except ValueError as exc:
        print(f"work: {exc}", file=sys.stderr)
        return 2
    handler = CommandHandler(command, max_result_bytes=args.max_result_bytes)
    # The consumer spans' exporter, when OTEL_* asks for one (tracing/export.py).
    provider = exporting_provider()

    async def work() -> None:
        # Every claim may be parked at once, plus the calls of running tasks.
        async with AsyncClient(args.url, args.token, connections=options.concurrency + 4) as gw:
            worker = Worker(gw, args.runtime, handler, options, tracer_provider=provider)
            worker.install_signal_handlers()
            logging.getLogger("gateway_client").info(
                "runtime=%s worker=%s concurrency=%d working: %s",
                args.runtime,
                options.worker_id,
                options.concurrency,
                " ".join(command),
            )
            await worker.run()

    try:
        asyncio.run(work())
    finally:
        if provider is not None:
            provider.shutdown()  # sends the spans still waiting in its batch
    return 0


def main(argv: list[str] | None = None) -> None:
    """`gateway-client work|enqueue|runtime ...`, for an install of the client alone."""
    parser = argparse.ArgumentParser(prog="gateway-client", description=__doc__)
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    add_commands(parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True))
    args = parse_args(parser, argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise SystemExit(args.func(args))


if __name__ == "__main__":
    main()
