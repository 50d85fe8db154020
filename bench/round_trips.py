"""The `round-trips` scenario: how often the gateway waits for Postgres per request,
counted on the wire rather than by the gateway's own counters.

The gateway is given a DATABASE_URL that points at a relay in this process: a TCP
proxy on a loopback port in front of the real server. The relay reads the protocol
messages the gateway sends and counts those that end a round trip, Sync (the end of
an extended-protocol exchange: Parse, Bind, Execute, ...) and Query (a simple-protocol
statement, such as a BEGIN or COMMIT sent alone). Postgres answers each with one
ReadyForQuery, which the client waits for. A claim written as BEGIN, CLAIM, NEXT_DUE,
COMMIT counts 4; the one-statement claim counts 1.

The counts are the requests' own:
- The janitor's leader lock goes around the relay (GATEWAY_DIRECT_DATABASE_URL) and
  the janitor's passes are an hour apart.
- The schedule pass, which the leader runs every half second whatever the requests (in
  a transaction: one probe for due schedules; then one for the earliest next tick), is
  told by its statements' text, which the relay reads from each Parse and matches to
  the Bind before each Sync. Its round trips, and those of the transaction around it,
  are counted apart (`background_round_trips`).
- The driver prepares a statement on each pooled connection the first time it runs
  there: a Parse that names it, and for types it does not know yet on that connection
  its type introspection. These are counted apart too (`set_up_round_trips`): a
  connection the pool opens while requests are measured pays them once.

Each request kind is sent one at a time, first unmeasured, then
`--round-trip-requests` times measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from gateway.store.sql import schedules as schedule_sql

from . import client
from .client import Api, Tally
from .infra import Servers, serving
from .scenarios import check_tally, finish
from .stats import Result

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
# Sync and Query: each is answered by one ReadyForQuery.
ROUND_TRIP_MESSAGES = frozenset(b"SQ")
PARSE, BIND, EXECUTE = ord("P"), ord("B"), ord("E")
# Parse, Bind and Query are read whole: they name the statement that runs.
READ_WHOLE = frozenset(b"PBQ")
WARM_UP_ROUNDS = 2  # unmeasured passes, each `requests` long


# The statements of the leader's schedule pass, which runs whatever the requests do.
BACKGROUND_STATEMENTS = frozenset(
    q.encode() for q in (schedule_sql.DUE_SCHEDULES, schedule_sql.NEXT_DUE_IN)
)
# In the statements asyncpg runs while it prepares a statement whose types it does not
# know yet on that connection (its type introspection, with JIT switched off around it).
DRIVER_INTROSPECTION = (b"typeinfo_tree", b"set_config('jit'", b"current_setting('jit')")


class FrontendMessages:
    """The client's side of one Postgres connection, fed in chunks as they pass; counts
    the messages that end a round trip: apart, those of a background statement
    (BACKGROUND_STATEMENTS, by the text its Parse named) and of a transaction that ran
    one, and those that prepare a statement on the connection (once per connection,
    whatever the request). The first packets (an SSL or GSS encryption request, then
    the startup message or a cancel request) carry no type byte."""

    def __init__(self) -> None:
        self.round_trips = 0
        self.background_round_trips = 0
        self.set_up_round_trips = 0
        # Since the last round trip: a statement was parsed; one was run.
        self._parsed = self._executed = False
        self._buffer = bytearray()
        self._skip = 0  # bytes of a message body still to pass unread
        self._startup = True
        self._statements: dict[bytes, bytes] = {}  # prepared statement name: its text
        self._bound = b""  # the text of the statement bound since the last round trip
        # An open transaction's round trips so far (0: none open), and whether one of
        # them ran a background statement.
        self._transaction_trips = 0
        self._transaction_background = False

    def feed(self, data: bytes) -> None:
        if self._skip:
            passed = min(self._skip, len(data))
            self._skip -= passed
            data = data[passed:]
        self._buffer += data
        while True:
            if self._startup:
                if len(self._buffer) < 8:
                    return
                length = int.from_bytes(self._buffer[:4], "big")
                code = int.from_bytes(self._buffer[4:8], "big")
                # Typed messages follow the startup message (or a cancel request, after
                # which the server closes the connection).
                self._startup = code in (SSL_REQUEST, GSSENC_REQUEST)
                self._consume(length)
            else:
                if len(self._buffer) < 5:
                    return
                kind = self._buffer[0]
                size = 1 + int.from_bytes(self._buffer[1:5], "big")
                if kind in READ_WHOLE:
                    if len(self._buffer) < size:
                        return  # read whole: the statement's name or text is wanted
                    self._statement(kind, bytes(self._buffer[5:size]))
                elif kind == EXECUTE:
                    self._executed = True
                if kind in ROUND_TRIP_MESSAGES:
                    self._round_trip()
                self._consume(size)

    def _statement(self, kind: int, body: bytes) -> None:
        """A Parse (name, text), a Bind (portal, statement name) or a Query (text):
        which text runs."""
        first, _, rest = body.partition(b"\0")
        if kind == PARSE:
            self._statements[first] = self._bound = rest.partition(b"\0")[0]
            self._parsed = True
        elif kind == BIND:
            self._bound = self._statements.get(rest.partition(b"\0")[0], b"")
        else:
            self._bound = first

    def _round_trip(self) -> None:
        """One round trip, of the statement bound. Preparing a statement (an exchange
        with a Parse and no Execute, or the driver's type introspection) is set-up: an
        unnamed statement parsed on every run (no statement cache, as behind PgBouncer)
        is parsed in the exchange that runs it.
        Those of a transaction (BEGIN to COMMIT or ROLLBACK, sent as Query messages) are
        counted at its end, all as background when a background statement ran in it."""
        bound, self._bound = self._bound, b""
        preparing = self._parsed and not self._executed
        self._parsed = self._executed = False
        if preparing or any(text in bound for text in DRIVER_INTROSPECTION):
            self.set_up_round_trips += 1
            return
        background = bound in BACKGROUND_STATEMENTS
        trips = 1
        if self._transaction_trips or bound.startswith(b"BEGIN"):
            self._transaction_trips += 1
            self._transaction_background |= background
            if not bound.startswith((b"COMMIT", b"ROLLBACK")):
                return
            trips, background = self._transaction_trips, self._transaction_background
            self._transaction_trips, self._transaction_background = 0, False
        if background:
            self.background_round_trips += trips
        else:
            self.round_trips += trips

    def _consume(self, size: int) -> None:
        if size <= len(self._buffer):
            del self._buffer[:size]
        else:
            self._skip = size - len(self._buffer)
            self._buffer.clear()


class RoundTripRelay:
    """A loopback TCP relay in front of the Postgres server of `database_url`, counting
    the round trips of every connection made through it (`round_trips`)."""

    def __init__(self, database_url: str) -> None:
        parts = urlsplit(database_url)
        query = dict(parse_qsl(parts.query))
        host = query.get("host") or parts.hostname or "localhost"
        self._port = int(query.get("port") or parts.port or 5432)
        # A host given as a folder is the server's Unix socket there.
        self._socket = f"{host}/.s.PGSQL.{self._port}" if host.startswith("/") else None
        self._host = host
        self._connections: list[FrontendMessages] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def round_trips(self) -> int:
        return sum(c.round_trips for c in self._connections)

    @property
    def background_round_trips(self) -> int:
        """Round trips of the schedule pass (BACKGROUND_STATEMENTS), not counted above."""
        return sum(c.background_round_trips for c in self._connections)

    @property
    def set_up_round_trips(self) -> int:
        """Round trips that prepared a statement on a connection, not counted above."""
        return sum(c.set_up_round_trips for c in self._connections)

    @property
    def port(self) -> int:
        assert self._server is not None, "the relay is not started"
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, database_url: str) -> str:
        """`database_url` through the relay: its host and port replaced by the relay's,
        without TLS (the relay reads the messages)."""
        parts = urlsplit(database_url)
        query = {k: v for k, v in parse_qsl(parts.query) if k not in ("host", "port", "sslmode")}
        query["sslmode"] = "disable"
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), ""))

    async def __aenter__(self) -> RoundTripRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._socket is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._socket)
            else:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:
            writer.close()
            return
        messages = FrontendMessages()
        self._connections.append(messages)
        await asyncio.gather(
            _pipe(reader, up_writer, messages.feed),
            _pipe(up_reader, writer, None),
        )


async def _pipe(
    source: asyncio.StreamReader,
    sink: asyncio.StreamWriter,
    seen: Callable[[bytes], None] | None,
) -> None:
    try:
        while data := await source.read(65536):
            if seen is not None:
                seen(data)
            sink.write(data)
            await sink.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()


# The janitor's passes an hour apart: its leader lock goes around the relay (serving's
# database_via), and no pass runs while requests are counted.
JANITOR_ASIDE = {"GATEWAY_JANITOR_INTERVAL_SECONDS": "3600"}


async def _variant(
    opts: argparse.Namespace, servers: Servers, workdir: Path, cache: bool
) -> Result:
    label = "cache on" if cache else "cache off"
    result = Result("round-trips", label)
    n = opts.round_trip_requests
    log_path = workdir / f"round-trips-{label.replace(' ', '-')}.log"
    async with (
        RoundTripRelay(servers.database_url) as relay,
        serving(
            opts, servers, log_path, cache=cache, env=JANITOR_ASIDE, database_via=relay.url
        ) as (proc, _database_url),
        client.session(4) as http,
    ):
        api = Api(http, proc.url, proc.token)
        tally = Tally()
        runtime = "rt-" + secrets.token_hex(4)
        claim_body = {"worker_id": "bench-rt", "max_tasks": 1, "wait_seconds": 0}
        leases: list[dict[str, Any]] = []

        async def post(path: str, body: Any) -> Any:
            got = await api.post(path, body, tally)
            return got[1] if got is not None and got[0] in (200, 201) else None

        async def empty_claim(_: int) -> None:
            await post(f"/v1/runtimes/{runtime}-empty/claim", claim_body)

        async def enqueue(i: int) -> None:
            await post(f"/v1/runtimes/{runtime}/tasks", {"payload": {"i": i}})

        async def claim(_: int) -> None:
            answer = await post(f"/v1/runtimes/{runtime}/claim", claim_body)
            leases.extend((answer or {}).get("tasks") or [])

        async def complete(_: int) -> None:
            task = leases.pop()
            body = {"lease_id": task["lease_id"], "result": {"ok": True}}
            await post(f"/v1/tasks/{task['id']}/complete", body)

        async def batch_enqueue(_: int) -> None:
            items = [{"payload": {"i": i}} for i in range(100)]
            await post(f"/v1/runtimes/{runtime}-batch/tasks:batch", {"tasks": items})

        steps: list[tuple[str, Callable[[int], Awaitable[None]], int]] = [
            ("empty_claim", empty_claim, n),
            ("enqueue", enqueue, n),
            ("claim", claim, n),
            ("complete", complete, n),
            ("batch_enqueue", batch_enqueue, max(1, n // 10)),
        ]
        # Every kind runs the same number of rounds, so that each round's claims find
        # the tasks its enqueues made, and its completes the leases its claims took.
        for name, step, count in steps:
            for _ in range(WARM_UP_ROUNDS):
                for i in range(count):
                    await step(i)
            before = relay.round_trips
            for i in range(count):
                await step(i)
            result.numbers[f"{name}_round_trips"] = round((relay.round_trips - before) / count, 3)
        result.numbers["requests_each"] = n
        result.numbers["background_round_trips"] = relay.background_round_trips
        result.numbers["set_up_round_trips"] = relay.set_up_round_trips
        check_tally(result, "requests", tally)
        finish(result, proc)
    return result


async def round_trips(opts: argparse.Namespace, servers: Servers, workdir: Path) -> list[Result]:
    return [await _variant(opts, servers, workdir, cache) for cache in (False, True)]
