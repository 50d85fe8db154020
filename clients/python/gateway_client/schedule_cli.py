"""`schedule`: a runtime's schedules from the command line (`gateway schedule put|list|get|
delete|trigger|pause|resume|backfill`), through the gateway's HTTP API. Only the standard
library is imported until the command runs."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

EXIT_ERROR = 1  # the gateway refused the call, or no answer came
EXIT_BAD_ARGUMENTS = 2
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SCHEDULE_HELP = (
    "Each action prints the gateway's answer as JSON: the schedule (with next_run_at, "
    "upcoming, last_tick_at, last_task_id and last_task_status), the tick a trigger "
    "decided, or what a backfill enqueued. Exit codes: 0 done, "
    f"{EXIT_ERROR} the gateway refused the call or could not be reached (the reason goes "
    f"to stderr), {EXIT_BAD_ARGUMENTS} bad arguments. Changing schedules needs a token "
    "with the enqueue scope on the runtime; list and get need the read scope. The "
    "gateway is GATEWAY_URL (default http://127.0.0.1:8080) and the bearer token "
    "GATEWAY_TOKEN, unless --url / --token say otherwise."
)


def _named(actions: Any, action: str, help_text: str, description: str) -> Any:
    parser = actions.add_parser(
        action, help=help_text, description=description + " " + SCHEDULE_HELP
    )
    parser.add_argument("runtime", metavar="RUNTIME")
    if action != "list":
        parser.add_argument("name", metavar="NAME", help="the schedule's name")
    parser.add_argument("--url", help="the gateway's base URL (default: $GATEWAY_URL)")
    parser.add_argument("--token", help="bearer token (default: $GATEWAY_TOKEN)")
    parser.set_defaults(func=cmd_schedule)
    return parser


def add_schedule_command(sub: Any) -> None:
    """Adds `schedule` to an argparse subparsers object."""
    schedule = sub.add_parser(
        "schedule",
        help="create, list, trigger, pause or backfill a runtime's schedules",
        description="Recurring tasks: a schedule enqueues a task on its runtime at every "
        "tick of a cron expression or a fixed interval, one task per tick however many "
        "gateway instances run. " + SCHEDULE_HELP,
    )
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)
    put = _named(
        actions,
        "put",
        "create or replace a schedule",
        "Create NAME on RUNTIME, or replace its whole definition (idempotent). Give "
        "--cron or --every.",
    )
    timing = put.add_mutually_exclusive_group(required=True)
    timing.add_argument(
        "--cron",
        help="5 fields (minute hour day month weekday), or 6 with seconds first: '0 3 * * *'",
    )
    timing.add_argument(
        "--every",
        type=int,
        metavar="SECONDS",
        help="tick every SECONDS, on multiples since the epoch",
    )
    put.add_argument("--timezone", help="the IANA zone the cron is read in (default: UTC)")
    put.add_argument(
        "--payload", default="null", help="each task's payload: JSON text, @FILE or - (stdin)"
    )
    put.add_argument(
        "--overlap",
        choices=["skip", "allow", "buffer_one", "cancel_previous"],
        help="while the previous task is queued or running (default: skip)",
    )
    for option, kind, text in (
        ("--priority", int, "each task's priority, 0-1000 (default: 50)"),
        ("--ttl-seconds", float, "each task expires if not claimed this long after it is due"),
        ("--max-attempts", int, "claims allowed per task (default: 5)"),
        ("--catch-up-seconds", float, "after downtime, ticks older than this are skipped (60)"),
        ("--jitter-seconds", float, "each task becomes due up to this much after its tick (0)"),
    ):
        put.add_argument(option, type=kind, help=text)
    put.add_argument("--paused", action="store_true", help="create it paused")
    put.add_argument("--note", help="why it is as it is, shown with it")
    _named(actions, "list", "print the runtime's schedules", "Print RUNTIME's schedules.")
    _named(actions, "get", "print one schedule", "Print NAME with its next ticks.")
    _named(actions, "delete", "delete a schedule", "Delete NAME; its tasks stay.")
    _named(actions, "trigger", "run a schedule now", "A tick now, under NAME's overlap policy.")
    pause = _named(
        actions,
        "pause",
        "pause a schedule",
        "Pause NAME: ticks that fall while it is paused are neither run nor recorded.",
    )
    pause.add_argument("--note", help="why, shown with the schedule")
    _named(actions, "resume", "resume a schedule", "Resume NAME from its next tick after now.")
    backfill = _named(
        actions,
        "backfill",
        "enqueue the ticks of a past range",
        "Enqueue each tick of NAME between --start and --end (at most 1,000), each at most "
        "once: a tick whose task was made before makes none.",
    )
    backfill.add_argument(
        "--start",
        required=True,
        help="an RFC 3339 time, or a duration ago (90s, 30m, 2h, 1d)",
    )
    backfill.add_argument("--end", help="likewise (default: now)")


def parse_when(value: str, now: datetime) -> str:
    """An RFC 3339 time as given, or a duration ago (`90s`, `30m`, `2h`, `1d`)."""
    unit = value[-1:]
    if unit in _UNITS and value[:-1].replace(".", "", 1).isdigit():
        return (now - timedelta(seconds=float(value[:-1]) * _UNITS[unit])).isoformat()
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is neither an RFC 3339 time nor a duration") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no zone: add Z or an offset")
    return value


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    from .cli import read_payload

    options = {
        "priority": args.priority,
        "ttl_seconds": args.ttl_seconds,
        "max_attempts": args.max_attempts,
        "catch_up_seconds": args.catch_up_seconds,
        "jitter_seconds": args.jitter_seconds,
        "note": args.note,
    }
    out = {k: v for k, v in options.items() if v is not None}
    if args.paused:
        out["paused"] = True
    out["payload"] = read_payload(args.payload)
    return out


def cmd_schedule(args: argparse.Namespace) -> int:
    from .client import AsyncClient

    name = f"schedule {args.action}"
    now = datetime.now(UTC)
    try:
        if args.action == "put":
            definition = _definition(args)
        if args.action == "backfill":
            start = parse_when(args.start, now)
            end = now.isoformat() if args.end is None else parse_when(args.end, now)
    except (ValueError, OSError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS

    async def run() -> Any:
        async with AsyncClient(args.url, args.token) as client:
            rt = args.runtime
            if args.action == "put":
                payload = definition.pop("payload")
                made = await client.put_schedule(
                    rt,
                    args.name,
                    payload,
                    cron=args.cron,
                    every_seconds=args.every,
                    timezone=args.timezone,
                    overlap=args.overlap,
                    **definition,
                )
                return made.raw
            if args.action == "list":
                return {"schedules": [s.raw for s in await client.list_schedules(rt)]}
            if args.action == "get":
                return (await client.get_schedule(rt, args.name)).raw
            if args.action == "delete":
                await client.delete_schedule(rt, args.name)
                return {"deleted": args.name}
            if args.action == "trigger":
                return (await client.trigger_schedule(rt, args.name)).to_json()
            if args.action == "pause":
                return (await client.pause_schedule(rt, args.name, args.note)).raw
            if args.action == "resume":
                return (await client.resume_schedule(rt, args.name)).raw
            done = await client.backfill_schedule(rt, args.name, start, end)
            return {
                "ticks": done.ticks,
                "enqueued": [t.to_json() for t in done.enqueued],
                "already_enqueued": done.already_enqueued,
            }

    from .cli import print_answer

    needed = "read" if args.action in ("list", "get") else "enqueue"
    return print_answer(name, args.runtime, needed, run)
