"""The `gateway` command: serve, migrate, doctor, token, webhook-secret, and the client's
work, enqueue, runtime and schedule. Server modules are imported when their command runs,
so that the client's commands load no more than the client does."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import secrets
import shutil
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, GatewayError
from ..settings import Settings, check_database_url

if TYPE_CHECKING:  # the same source, under the name a type checker can find
    from gateway_client import cli as client_cli
else:
    from .._client import cli as client_cli

log = logging.getLogger("gateway")

DEFAULT_DATA_DIR = ".gateway"


def _setup_logging(level: str, serving: bool) -> None:
    """`gateway serve` logs in GATEWAY_LOG_FORMAT, uvicorn's lines included; the other
    commands print for people, and log as text."""
    if serving:
        from ..logs import configure, format_from_env

        configure(format_from_env(os.environ.get("GATEWAY_LOG_FORMAT")), level)
        return
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _dev_token(data_dir: Path) -> str:
    """A development admin token kept in the data folder, so it survives restarts."""
    path = data_dir / "dev-token"
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(24)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token


def _command() -> str:
    """How to run this `gateway` again from here: its name when the shell finds this very
    program by it, else its path (`.venv/bin/gateway` after `make run`, whose venv is not
    on the PATH), relative to the working folder when inside it."""
    program = Path(sys.argv[0])
    found = shutil.which("gateway")
    if program.name != "gateway" or (found and Path(found).resolve() == program.resolve()):
        return "gateway"
    try:
        return str(program.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(program.resolve())


def _banner(
    host: str,
    port: int,
    settings: Settings,
    token_file: Path | None,
    embedded_database_url: str | None = None,
    console_token: str | None = None,
) -> str:
    base = f"http://{host}:{port}"
    # The web console. With the development token, a link that signs in at once: the
    # token rides in the fragment, which the browser never sends to the server.
    console = f"{base}/console" + (f"#token={console_token}" if console_token else "")
    database_line = (
        [
            f"  database:  {embedded_database_url}",
            f"             (export DATABASE_URL='{embedded_database_url}' for `gateway token` "
            "and `gateway webhook-secret`)",
        ]
        if embedded_database_url
        else []
    )
    if settings.auth_enabled:
        auth_line = (
            f"  token:     {token_file}  (export TOKEN=$(cat {token_file}))"
            if token_file
            else "  token:     the value of GATEWAY_ADMIN_TOKEN"
        )
        header = '-H "Authorization: Bearer $TOKEN" '
    else:
        auth_line = "  auth:      OFF (GATEWAY_AUTH=off) - local development only"
        header = ""
    # `gateway work` finds the gateway and its token through the environment.
    worker_env = "" if base == "http://127.0.0.1:8080" else f"GATEWAY_URL={base} "
    worker_env += "GATEWAY_TOKEN=$TOKEN " if settings.auth_enabled else ""
    return "\n".join(
        [
            "",
            "claim-gateway is up",
            f"  api:       {base}",
            f"  health:    {base}/healthz  {base}/readyz  {base}/metrics",
            f"  console:   {console}",
            auth_line,
            *database_line,
            "  try:",
            f'    curl -s {header}-d \'{{"payload": {{"hello": "world"}}}}\' '
            f"{base}/v1/runtimes/demo/tasks",
            f'    curl -s {header}-d \'{{"worker_id": "me", "wait_seconds": 5}}\' '
            f"{base}/v1/runtimes/demo/claim",
            f"    {worker_env}{_command()} work demo -- python3 examples/hello.py   (a worker)",
            "  Ctrl-C stops the gateway"
            + (" and the embedded servers." if token_file is not None else "."),
            "",
        ]
    )


def freeze_startup_heap() -> int:
    """Collects what start-up left as garbage, then moves every object alive (modules,
    the app, settings: what lives as long as the process) out of the garbage
    collector's reach (gc.freeze); returns how many. Each full collection walks every
    tracked object, and start-up leaves hundreds of thousands: without this, one
    request in a hundred or so waited 20 to 35 ms for a collection (a batch enqueue of
    1,000 tasks: p99 35 to 43 ms against a p50 of 12). Once per serving process.

    Then collections start after GC_YOUNG_THRESHOLD new objects instead of 700: see
    there."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    return gc.get_freeze_count()


# How many container objects are made, less those freed, before the youngest
# generation is collected (Python's default is 700). Requests make and free objects by
# the thousand, and every collection of the young generations also walks whatever
# survived the last ones: the connections, requests and parked polls alive at the time.
# Beside 2,000 parked polls and 2,000 flooding connections, the default had the gateway
# collecting so often that it served 0.75 to 0.78 times the enqueues it served before
# the flood (four runs); with 10,000, 0.95 to 1.11 (three runs; bench/README.md, the
# overload scenario). The cost: garbage in reference cycles lives longer. A cycle still
# young waits for at most this many new objects; one that survived a collection (in
# use then) waits for the older generations' collections, which come as many times
# less often: about twice the cycles of 64 KiB bodies were alive at the peak in a
# test made to keep them (1,190 to 1,240 against 479 to 701).
GC_YOUNG_THRESHOLD = 10_000


def cmd_serve(args: argparse.Namespace) -> int:
    from ..http.app import create_app
    from ..http.server_config import server_config
    from ..http.startup import DrainingServer, StartupGate, run, serve
    from ..tracing import setup as tracing_setup
    from . import startup

    env = dict(os.environ)
    json_log = env.get("GATEWAY_LOG_FORMAT", "").strip().lower() == "json"
    embedded = None
    token_file: Path | None = None
    embedded_database_url: str | None = None
    sockets: list[socket.socket] = []
    try:
        if not args.embedded:
            # Before every other setting: without a database nothing else matters.
            check_database_url(env.get("DATABASE_URL"))
        if args.embedded and not (env.get("DATABASE_URL") and env.get("REDIS_URL")):
            from .embedded import EmbeddedServers

            data_dir = Path(args.data_dir).resolve()
            try:
                data_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--data-dir {data_dir} cannot be used: {exc.strerror}") from exc
            embedded = EmbeddedServers(data_dir)
            if not env.get("DATABASE_URL"):
                env["DATABASE_URL"] = embedded_database_url = embedded.start_postgres()
                log.info("embedded Postgres data in %s", data_dir / "postgres")
            if not env.get("REDIS_URL"):
                env["REDIS_URL"] = embedded.start_redis()
            if not env.get("GATEWAY_ADMIN_TOKEN") and env.get("GATEWAY_AUTH", "on") != "off":
                env["GATEWAY_ADMIN_TOKEN"] = _dev_token(data_dir)
                token_file = data_dir / "dev-token"
        settings = Settings.from_env(env)
        tracing_setup.check(env)  # OTEL_* variables that ask for traces need the SDK
        sockets = startup.bind(args.host, args.port)
        app = create_app(settings)
        gate = StartupGate(app)
        # log_config=None: uvicorn's loggers keep propagating to the handler that
        # _setup_logging installed, in GATEWAY_LOG_FORMAT. lifespan="off": serve() runs
        # the app's lifespan itself, after the checks.
        config = server_config(
            app,
            settings,
            args.host,
            args.port,
            serving=gate,
            log_level=args.log_level.lower(),
            timeout_keep_alive=args.keep_alive_seconds,
            log_config=None,
            lifespan="off",
        )
        if not args.access_log:
            logging.getLogger("gateway.access").setLevel(logging.WARNING)
        server = DrainingServer(config, on_exit_signal=app.state.gateway.claimer.drain)
        database = startup.DatabaseWait(settings, migrate=args.migrate or embedded is not None)
        gate.waiting_for = database.waiting_for

        def announce() -> None:
            # The sign-in link holds the development token: printed on the terminal,
            # never written into a JSON log stream.
            printed = token_file is not None and settings.log_format != "json"
            console_token = settings.admin_token if printed else None
            banner = _banner(
                args.host, args.port, settings, token_file, embedded_database_url, console_token
            )
            if settings.log_format == "json":
                log.info(banner.strip())  # one JSON line like every other
            else:
                print(banner, file=sys.stderr, flush=True)
            frozen = freeze_startup_heap()
            log.info(
                "garbage collector: %d objects from start-up frozen; collections skip them",
                frozen,
            )

        # Waiting for Postgres, the sockets are served already (/healthz, /readyz 503).
        listen_first = settings.startup_retry_seconds > 0
        run(server, serve(server, sockets, app, gate, database, listen_first, announce))
        return 0
    except KeyboardInterrupt:
        return 130  # Ctrl-C before the server took over the signal
    except Exception as exc:
        return startup.report(exc, env, json_log=json_log)
    finally:
        for sock in sockets:
            sock.close()
        if embedded is not None:
            embedded.stop()


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import cmd_doctor as run

    return run(args)


def cmd_migrate(args: argparse.Namespace) -> int:
    import asyncpg

    from ..store.hosts import Hosts
    from ..store.migrate import CONNECT_TIMEOUT_SECONDS, apply_migrations, pending_migrations

    # The migration lock is a session advisory lock: it needs a connection that no
    # transaction pooler shares, so the direct URL wins when set.
    url = os.environ.get("GATEWAY_DIRECT_DATABASE_URL") or os.environ.get("DATABASE_URL")
    if not url:
        print("gateway migrate: DATABASE_URL is not set", file=sys.stderr)
        return 2

    async def check() -> int:
        conn = await Hosts(url, CONNECT_TIMEOUT_SECONDS).connect()
        try:
            pending = await pending_migrations(conn)
        finally:
            await conn.close()
        for m in pending:
            print(f"pending: {m.name}")
        if not pending:
            print("schema is current")
        return 1 if pending else 0

    try:
        if args.check:
            return asyncio.run(check())
        applied = asyncio.run(apply_migrations(url, log=print))
        print(f"applied {len(applied)} migration(s); schema is current")
        return 0
    except GatewayError as exc:
        print(f"gateway migrate: {exc.detail}", file=sys.stderr)
        return 1
    except (OSError, asyncpg.PostgresError) as exc:
        print(f"gateway migrate: cannot reach the database: {exc}", file=sys.stderr)
        return 2


# -- credentials: token, webhook-secret ------------------------------------------------

# The commands themselves are in cli_credentials; their options are here.
CREDENTIALS_HELP = (
    "Needs DATABASE_URL only. Exit codes: 0 done; 1 nothing matched, or the database "
    "failed; 2 bad input (nothing is stored) or DATABASE_URL unset."
)
SCOPES_HELP = (
    "enqueue: enqueue, batch, cancel, retry; claim: claim, heartbeat, complete, fail, "
    "release; read: get, list, stats; admin: everything, including tokens and webhook secrets"
)


def cmd_token(args: argparse.Namespace) -> int:
    from .credentials import cmd_token as run

    return run(args)


def cmd_webhook_secret(args: argparse.Namespace) -> int:
    from .credentials import cmd_webhook_secret as run

    return run(args)


def _credential_actions(parser: argparse.ArgumentParser, noun: str) -> argparse.ArgumentParser:
    """Adds list and revoke to `parser`; returns the create subparser for its options."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser(
        "create",
        help=f"create a {noun}; print its secret alone on stdout, once",
        description=f"Create a {noun} and print its secret alone on stdout; notes go to "
        "stderr. The secret is never shown again.",
    )
    create.add_argument("--name", required=True, help=f"unique among live {noun}s")
    listing = actions.add_parser(
        "list",
        help=f"list live {noun}s, never their secrets",
        description=f"List live {noun}s, oldest first; --all adds revoked ones with the time "
        "they were revoked. Secrets are never shown.",
    )
    listing.add_argument("--all", action="store_true", help=f"include revoked {noun}s")
    listing.add_argument("--json", action="store_true", help="print JSON, as the admin API")
    revoke = actions.add_parser(
        "revoke",
        help=f"revoke a {noun} by id or name",
        description=f"Revoke a {noun} by id, or the live one with that name. Every gateway "
        "instance refuses it within 2 s.",
    )
    revoke.add_argument("ref", metavar="ID_OR_NAME")
    return create


def _add_credential_commands(sub: Any) -> None:
    token = sub.add_parser(
        "token",
        help="create, list and revoke scoped API tokens",
        description="Scoped API tokens. Scopes: " + SCOPES_HELP + ". Runtime patterns limit "
        "a token to some runtimes (* matches any run of characters); without any it covers "
        "every runtime. Only the SHA-256 of a token's secret is stored. " + CREDENTIALS_HELP,
    )
    token.set_defaults(func=cmd_token)
    create = _credential_actions(token, "token")
    create.add_argument(
        "--scopes",
        required=True,
        help="comma-separated, of enqueue, claim, read, control and admin",
    )
    create.add_argument(
        "--runtime",
        action="extend",
        nargs="+",
        metavar="PATTERN",
        help="a runtime id or glob (ci-*) the token may act on; repeatable; default: every one",
    )
    create.add_argument(
        "--json", action="store_true", help="print {id, name, scopes, runtimes, token, created_at}"
    )

    hook = sub.add_parser(
        "webhook-secret",
        help="create, list and revoke webhook signing secrets",
        description="Secrets (whsec_...) that sign Standard Webhooks deliveries to POST "
        "/v1/runtimes/{rt}/webhooks, each for one or more runtime patterns. The key is "
        "stored in clear in the database, since verifying a signature needs it, and is "
        "shown only at creation. " + CREDENTIALS_HELP,
    )
    hook.set_defaults(func=cmd_webhook_secret)
    create = _credential_actions(hook, "webhook secret")
    create.add_argument(
        "--runtime",
        action="extend",
        nargs="+",
        metavar="PATTERN",
        required=True,
        help="a runtime id or glob (ci-*) deliveries may enqueue into; repeatable",
    )
    create.add_argument(
        "--json", action="store_true", help="print {id, name, runtimes, secret, created_at}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description=(
            "claim-gateway: daemons long-poll it for tasks; producers enqueue tasks into it. "
            "Postgres holds the tasks, Redis answers empty polls. Configuration comes from "
            "the environment (DATABASE_URL, REDIS_URL, GATEWAY_*); see the README."
        ),
    )
    parser.add_argument(
        "--log-level",
        default="info",
        help="debug, info, warning, error; debug also shows the traceback of a failed start",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser(
        "serve",
        help="run the HTTP server",
        description=(
            "Run the HTTP API. Needs DATABASE_URL and REDIS_URL, unless --embedded starts "
            "local servers for whichever is unset. On SIGTERM it stops taking claims, answers "
            "parked polls at once, finishes in-flight requests and exits. A start that cannot "
            "be made says why on stderr and exits 2 (configuration), 3 (Postgres or an "
            "embedded server unreachable, or the port in use) or 4 (the schema needs "
            "`gateway migrate`); GATEWAY_STARTUP_RETRY_SECONDS makes it wait that long for "
            "Postgres, listening meanwhile (/readyz answers 503)."
        ),
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (%(default)s)")
    serve.add_argument(
        "--embedded",
        action="store_true",
        help="start an embedded Postgres and Redis-compatible server for whichever of "
        "DATABASE_URL / REDIS_URL is unset, keep their data under --data-dir, apply "
        "migrations, and create a development token when GATEWAY_ADMIN_TOKEN is unset",
    )
    serve.add_argument(
        "--data-dir", default=DEFAULT_DATA_DIR, help="folder for --embedded data (%(default)s)"
    )
    serve.add_argument(
        "--migrate", action="store_true", help="apply pending migrations before serving"
    )
    serve.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the access log (logger gateway.access; on by default): a line for every "
        "error and slow request, and GATEWAY_ACCESS_LOG_SAMPLE of the others",
    )
    serve.add_argument(
        "--keep-alive-seconds",
        type=int,
        default=5,
        metavar="S",
        help="close a client's idle keep-alive connection after S seconds (%(default)s); "
        "behind a proxy or load balancer, make it longer than the proxy's idle timeout "
        "for its upstream connections, so that the proxy always closes first",
    )
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser(
        "migrate",
        help="apply database migrations",
        description=(
            "Apply pending migrations to GATEWAY_DIRECT_DATABASE_URL if set, else "
            "DATABASE_URL, in order, each recorded with its checksum. Safe to run from "
            "several pods at once (a session advisory lock serializes them, so never "
            "through a transaction pooler). Refuses edited or duplicate migration files."
        ),
    )
    migrate.add_argument(
        "--check",
        action="store_true",
        help="apply nothing; list pending migrations and exit 1 if there are any",
    )
    migrate.set_defaults(func=cmd_migrate)

    doctor = sub.add_parser(
        "doctor",
        help="check the configuration and the servers it names, and explain what is wrong",
        description=(
            "Check what `gateway serve` would use: the settings (secrets masked), Postgres "
            "(reachable, its version, the schema's migrations, a transaction pooler in "
            "between), Redis in its mode (reachable, pub/sub, memory limit and eviction "
            "policy), the clocks of this host, Postgres and Redis, and the admin token. "
            "One line per check: ✓ fine, ⚠ works with a cost worth knowing, ✗ a problem. "
            "Writes nothing. Exit codes: 0 no problem (warnings or not); 1 a problem."
        ),
    )
    doctor.set_defaults(func=cmd_doctor)
    _add_credential_commands(sub)
    client_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = client_cli.parse_args(build_parser(), argv)
    _setup_logging(args.log_level, serving=args.func is cmd_serve)
    raise SystemExit(args.func(args))
