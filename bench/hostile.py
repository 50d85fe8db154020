"""`python -m bench.hostile`: the gateway's memory while hostile clients are refused.

Starts `gateway serve` as a separate process on a fresh database (servers are found
as for `python -m bench`: flags, BENCH_* then TEST_* URLs, else embedded), then runs
six phases (--phases picks some), one after the other, over loopback:

- bodies: --clients clients each start a 2 GB request body and send junk until the
  gateway cuts them; half announce it (Content-Length), half stream it chunked.
  Every one must be answered 413.
- heads: --clients clients each send a 2 MB head. Every one must be answered 431.
- slow: --slow connections each trickle a head, one header line every 0.5 s. Every
  one must be answered 408 within GATEWAY_READ_TIMEOUT_SECONDS plus --margin-seconds.
- all at once: the three above together.
- unread answers: three waves of --unread clients, one every
  GATEWAY_READ_TIMEOUT_SECONDS plus --margin-seconds, each ask for a 2.7 MB listing
  through a small receive window; none reads until the last wave has waited that
  long. Every answer must have been cut short by then, and the memory of a wave
  reused by the next rather than added to it.
- expansion: --expansion-clients clients each send, --expansion-rounds times, four
  requests whose numbers are written short (1e4299) and answered long (4,300 digits):
  a batch enqueue of 400 payloads of 243 such numbers (0.69 MB sent, 418 MB written
  out), a single enqueue and a signed webhook delivery whose payload fits the
  payload limit written out but whose body does not fit the body limit, and a batch
  complete of 400 such results. Every one must be answered 413 payload_too_large
  naming `body`, and nothing stored: the phase's runtime holds only the 400 tasks
  claimed for the batch complete, still claimed and without a result.

The gateway's resident memory (VmRSS in /proc/<pid>/status) is sampled every 20 ms.
Exits 1 when a client was not refused as expected, the gateway's RSS grew more than
--rss-growth-mib over its baseline (for unread answers: when the clients start
reading, since building the answers takes memory first), its cut counters disagree,
it stopped answering, or it logged errors; 0 otherwise. Every phase has a hard
deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from .infra import (
    GatewayProcess,
    Servers,
    check_servers,
    delete_redis_keys,
    fresh_database,
    log,
    resolve_servers,
)
from .scenarios import gateway_log_problems

BODY_BYTES = 2 * 1024**3
HEAD_BYTES = 2 * 1024**2
CHUNK_BYTES = 64 * 1024
TRICKLE_SECONDS = 0.5
PHASE_SECONDS = 60.0  # a phase's hard limit, on top of the read timeout
MIB = 1024 * 1024
ANSWER_RUNTIME = "hostile-answers"
ANSWER_TASKS = 3  # the large answer: a listing of that many tasks with ANSWER_PAYLOAD
ANSWER_PAYLOAD = "p" * 900_000
UNREAD_WAVES = 3
RCVBUF_BYTES = 8192
# Loopback's 64 KiB segments let the kernel hold up to 4 MB of an answer per socket;
# with a real network's segments it holds about 100 KiB, and the rest waits in the gateway.
MSS_BYTES = 1400
# expansion: the security issue's request. A number with an exponent is kept exact and
# answered written out in full, as Postgres writes it: 1e4299 is sent as 6 bytes and
# answered as 4,300 digits. 243 of them are the most a payload holds within the payload
# limit written out (1,045,144 bytes); 400 such payloads make a 0.69 MB batch that,
# before the fix, was stored and answered as 418 MB.
EXPANSION_RUNTIME = "hostile-expansion"
EXPANSION_NUMBER = "1e4299"
EXPANSION_DIGITS = 4300
EXPANSION_ITEMS = 400
EXPANSION_PER_ITEM = 243
# GATEWAY_MAX_PAYLOAD_BYTES, twice its default: one payload may then be larger, written
# out, than the body limit (1 MiB), so that a single enqueue or webhook delivery can be
# refused for what its one payload becomes rather than for its own size.
PAYLOAD_BYTES = 2 * MIB
CLAIM_BATCH = 100  # the most one claim takes
ANSWER_KEPT_BYTES = 64 * 1024  # of an answer, what a client keeps to read its problem
PHASES = ("bodies", "heads", "slow", "all", "unread", "expansion")


class ServeProcess(GatewayProcess):
    """The gateway as `gateway serve` runs it, so that its server layer is measured."""

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "gateway.cli", "--log-level", "warning",
            "serve", "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip


class RssSampler:
    """VmRSS of one process, in bytes, sampled in the background; `peak` since reset()."""

    def __init__(self, pid: int, every_seconds: float = 0.02) -> None:
        self.path = Path(f"/proc/{pid}/status")
        self.every_seconds = every_seconds
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    def read(self) -> int:
        for line in self.path.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS line in {self.path}")

    def reset(self) -> int:
        self.peak = self.read()
        return self.peak

    async def _sample(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.read())
            await asyncio.sleep(self.every_seconds)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


@dataclass
class Phase:
    name: str
    expected: Counter[str]  # answer status -> how many clients must get it
    outcomes: Counter[str] = field(default_factory=Counter)
    peak_rss: int = 0
    seconds: float = 0.0
    slowest_answer_seconds: float = 0.0
    most_sent: int = 0  # bytes one client got out before it was cut
    held_rss: int = 0  # unread answers: RSS when the clients start reading
    start_rss: int = 0  # RSS when the phase starts
    after_rss: int = 0  # RSS once the phase's clients are done
    largest_answer: int = 0  # expansion: the longest answer one request got, in bytes

    @property
    def clients(self) -> int:
        return self.expected.total()

    @property
    def refused(self) -> int:
        return sum(min(n, self.outcomes[status]) for status, n in self.expected.items())


# -- clients -----------------------------------------------------------------


def _head(method: str, path: str, token: str, *lines: str) -> bytes:
    text = f"{method} {path} HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n"
    return (text + "".join(line + "\r\n" for line in lines)).encode()


def _announced_body(token: str) -> Iterator[bytes]:
    yield _head("POST", "/v1/runtimes/hostile/tasks", token, f"Content-Length: {BODY_BYTES}", "")
    junk = b"x" * CHUNK_BYTES
    for _ in range(BODY_BYTES // CHUNK_BYTES):
        yield junk


def _chunked_body(token: str) -> Iterator[bytes]:
    yield _head("POST", "/v1/runtimes/hostile/tasks", token, "Transfer-Encoding: chunked", "")
    chunk = b"%x\r\n" % CHUNK_BYTES + b"x" * CHUNK_BYTES + b"\r\n"
    for _ in range(BODY_BYTES // CHUNK_BYTES):
        yield chunk


def _big_head(token: str) -> Iterator[bytes]:
    yield _head("GET", "/healthz", token) + b"X-Junk: "
    junk = b"a" * CHUNK_BYTES
    for _ in range(HEAD_BYTES // CHUNK_BYTES):
        yield junk
    yield b"\r\n\r\n"


async def _status(reader: asyncio.StreamReader) -> str:
    """The status code of the answer, or why there was none."""
    try:
        line = await reader.readline()
    except (ConnectionError, OSError) as exc:
        return type(exc).__name__
    return line.split()[1].decode() if line.startswith(b"HTTP/1.1 ") else "no answer"


async def _refused_client(port: int, phase: Phase, pieces: Iterator[bytes]) -> None:
    """Send every piece until the gateway cuts the connection, reading its answer
    meanwhile (a client that only writes would lose it to the reset)."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        phase.outcomes[f"connect: {type(exc).__name__}"] += 1
        return
    answer = asyncio.create_task(_status(reader))
    sent = 0
    try:
        with contextlib.suppress(ConnectionError, OSError):
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
        phase.outcomes[await answer] += 1
        phase.most_sent = max(phase.most_sent, sent)
        phase.slowest_answer_seconds = max(phase.slowest_answer_seconds, time.monotonic() - started)
    finally:
        answer.cancel()
        writer.close()


async def _slow_client(port: int, phase: Phase) -> None:
    """Trickle a head, one header line every TRICKLE_SECONDS, until answered."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        phase.outcomes[f"connect: {type(exc).__name__}"] += 1
        return
    started = time.monotonic()
    answer = asyncio.create_task(_status(reader))
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n")
        line = 0
        while not answer.done():
            await asyncio.wait([answer], timeout=TRICKLE_SECONDS)
            with contextlib.suppress(ConnectionError, OSError):
                writer.write(b"X-Slow-%d: 1\r\n" % line)
            line += 1
        phase.outcomes[answer.result()] += 1
        phase.slowest_answer_seconds = max(phase.slowest_answer_seconds, time.monotonic() - started)
    finally:
        answer.cancel()
        writer.close()


def answer_size(data: bytes | bytearray) -> int | None:
    """The full length of the HTTP answer that `data` begins, once its head is in (the
    gateway always sends Content-Length; an answer without one is an error)."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    for line in data[:end].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return end + 4 + int(value)
    raise AssertionError(f"an answer without Content-Length: {data[:end]!r}")


async def _unread_client(port: int, token: str, phase: Phase, ask: float, read: float) -> None:
    """Ask for the large listing `ask` seconds from now through a small receive
    window, read nothing until `read` seconds from now, then read what is left:
    "cut" if the answer ends early."""
    loop = asyncio.get_running_loop()
    read_at = loop.time() + read
    await asyncio.sleep(ask)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, MSS_BYTES)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            path = f"/v1/runtimes/{ANSWER_RUNTIME}/tasks"
            await loop.sock_sendall(sock, _head("GET", path, token, ""))
        except OSError as exc:
            phase.outcomes[f"connect: {type(exc).__name__}"] += 1
            return
        await asyncio.sleep(read_at - loop.time())
        data = bytearray()
        size = None
        with contextlib.suppress(ConnectionError, OSError):
            while size is None or len(data) < size:
                chunk = await loop.sock_recv(sock, CHUNK_BYTES)
                if not chunk:
                    break
                data += chunk
                size = size or answer_size(data)
        phase.outcomes["whole" if size is not None and len(data) >= size else "cut"] += 1


async def _held_rss(rss: RssSampler, phase: Phase, after: float) -> None:
    await asyncio.sleep(after)
    phase.held_rss = rss.read()


# -- expansion ---------------------------------------------------------------


def numbers(count: int) -> bytes:
    """A JSON list of `count` EXPANSION_NUMBERs."""
    return b"[" + b",".join([EXPANSION_NUMBER.encode()] * count) + b"]"


def written_out(raw: bytes) -> int:
    """The length of `raw` with each EXPANSION_NUMBER in it written out in full."""
    extra = EXPANSION_DIGITS - len(EXPANSION_NUMBER)
    return len(raw) + raw.count(EXPANSION_NUMBER.encode()) * extra


def over_the_body_limit(max_body_bytes: int) -> bytes:
    """A payload that, written out, is larger than `max_body_bytes` and fits the payload
    limit (PAYLOAD_BYTES): 244 numbers, 1.7 KB as sent, with a 1 MiB body limit."""
    payload = numbers(max_body_bytes // EXPANSION_DIGITS + 1)
    assert max_body_bytes < written_out(payload) <= PAYLOAD_BYTES
    return payload


def sign(secret: str, msg_id: str, body: bytes) -> dict[str, str]:
    """Standard Webhooks headers: HMAC-SHA256 of "<id>.<timestamp>.<body>" under the
    key of a `whsec_<base64 key>` secret, at the current time."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    timestamp = str(int(time.time()))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


@dataclass(frozen=True)
class Expanding:
    """One of the phase's requests: its body is sent as is, or signed afresh each time."""

    name: str
    path: str
    body: bytes
    webhook_secret: str | None = None


async def expansion_setup(
    http: aiohttp.ClientSession, url: str, max_body_bytes: int
) -> list[Expanding]:
    """The phase's requests. Before them, EXPANSION_ITEMS tasks are queued and claimed
    (for the batch complete) and a webhook secret covering the runtime is made."""
    runtime = f"/v1/runtimes/{EXPANSION_RUNTIME}"
    queued = {"tasks": [{"payload": i} for i in range(EXPANSION_ITEMS)]}
    async with http.post(url + runtime + "/tasks:batch", json=queued) as resp:
        resp.raise_for_status()
    leases: list[tuple[str, str]] = []
    claim = {"worker_id": "hostile", "max_tasks": CLAIM_BATCH, "lease_seconds": 3600}
    while len(leases) < EXPANSION_ITEMS:
        async with http.post(url + runtime + "/claim", json=claim) as resp:
            resp.raise_for_status()
            got = (await resp.json())["tasks"]
        if not got:
            raise RuntimeError(f"claimed {len(leases)} of the {EXPANSION_ITEMS} tasks queued")
        leases += [(t["id"], t["lease_id"]) for t in got]
    made = {"name": "hostile-expansion", "runtimes": [EXPANSION_RUNTIME]}
    async with http.post(url + "/v1/admin/webhook-secrets", json=made) as resp:
        resp.raise_for_status()
        secret = (await resp.json())["secret"]

    payload = orjson.Fragment(numbers(EXPANSION_PER_ITEM))
    # Written out, one payload fits the payload limit; nothing else is in the way.
    assert written_out(numbers(EXPANSION_PER_ITEM)) <= PAYLOAD_BYTES
    results = [{"id": i, "lease_id": lease, "result": payload} for i, lease in leases]
    return [
        Expanding(
            "batch enqueue",
            runtime + "/tasks:batch",
            orjson.dumps({"tasks": [{"payload": payload}] * EXPANSION_ITEMS}),
        ),
        Expanding(
            "enqueue",
            runtime + "/tasks",
            b'{"payload": ' + over_the_body_limit(max_body_bytes) + b"}",
        ),
        Expanding("batch complete", "/v1/tasks:complete", orjson.dumps({"tasks": results})),
        Expanding(
            "webhook",
            runtime + "/webhooks",
            over_the_body_limit(max_body_bytes),
            webhook_secret=secret,
        ),
    ]


def expansion_verdict(status: int, answer: bytes) -> str:
    """`413` for the refusal the phase expects (payload_too_large naming `body`, its
    detail naming GATEWAY_MAX_BODY_BYTES); otherwise the status, and for a 413 what
    its problem says instead."""
    if status != 413:
        return str(status)
    try:
        problem = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return "413, not a problem document"
    if not isinstance(problem, dict):
        return "413, not a problem document"
    code, named = problem.get("code"), problem.get("field")
    if code == "payload_too_large" and named == "body":
        if "GATEWAY_MAX_BODY_BYTES" in str(problem.get("detail")):
            return "413"
    return f"413 {code} naming {named}"


async def _expansion_client(
    http: aiohttp.ClientSession, url: str, phase: Phase, requests: list[Expanding], rounds: int
) -> None:
    """Send each request `rounds` times, one at a time, reading every answer whole (and
    keeping only its start); the phase's deadline cancels what is left."""
    timeout = aiohttp.ClientTimeout(total=PHASE_SECONDS)
    for _ in range(rounds):
        for request in requests:
            headers = {"Content-Type": "application/json"}
            if request.webhook_secret is not None:
                msg_id = "msg_" + os.urandom(8).hex()
                headers.update(sign(request.webhook_secret, msg_id, request.body))
            kept = bytearray()
            size = 0
            try:
                async with http.post(
                    url + request.path, data=request.body, headers=headers, timeout=timeout
                ) as resp:
                    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                        size += len(chunk)
                        if len(kept) < ANSWER_KEPT_BYTES:
                            kept += chunk
                    verdict = expansion_verdict(resp.status, bytes(kept))
            except (aiohttp.ClientError, TimeoutError) as exc:
                verdict = type(exc).__name__
            phase.outcomes[f"{request.name}: {verdict}"] += 1
            phase.largest_answer = max(phase.largest_answer, size)


async def expansion_stored(database_url: str) -> dict[str, int]:
    """What the phase's runtime holds: its tasks, those not claimed, those with a result."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) AS tasks, count(*) FILTER (WHERE status <> 'claimed') AS "
            "not_claimed, count(result) AS results FROM tasks WHERE runtime_id = $1",
            EXPANSION_RUNTIME,
        )
    finally:
        await conn.close()
    return dict(row)


# -- the run -----------------------------------------------------------------


async def _run_phase(
    phase: Phase, rss: RssSampler, clients: list[Coroutine[Any, Any, None]], limit: float
) -> None:
    phase.start_rss = rss.reset()
    started = time.monotonic()
    tasks = [asyncio.create_task(c) for c in clients]
    _, pending = await asyncio.wait(tasks, timeout=limit)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if pending:
        phase.outcomes["still running at the phase's deadline"] += len(pending)
    phase.seconds = time.monotonic() - started
    phase.peak_rss = rss.peak
    phase.after_rss = rss.read()
    log(f"{phase.name}: {dict(phase.outcomes)} in {phase.seconds:.1f} s")


async def _cut_counts(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    counts = {}
    for line in text.splitlines():
        if line.startswith("gateway_connections_cut_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


async def run(args: argparse.Namespace, servers: Servers, log_path: Path) -> tuple[str, bool]:
    """Run the phases against a fresh gateway; returns the report and whether it passed."""
    await check_servers(servers)
    env = {
        **args.gateway_env,
        "GATEWAY_READ_TIMEOUT_SECONDS": f"{args.read_timeout_seconds:g}",
        "GATEWAY_MAX_BODY_BYTES": str(args.max_body_bytes),
        "GATEWAY_MAX_PAYLOAD_BYTES": str(PAYLOAD_BYTES),
    }
    async with fresh_database(servers.database_url) as database_url:
        gw = ServeProcess(database_url, servers.redis_url, True, log_path, extra_env=env)
        try:
            await gw.start()
            assert gw.pid is not None
            log(f"gateway serve pid {gw.pid} ready at {gw.url}")
            return await _measure(args, gw, gw.pid, database_url)
        finally:
            await gw.stop()
            with contextlib.suppress(Exception):
                await delete_redis_keys(servers.redis_url, gw.prefix)


async def _measure(
    args: argparse.Namespace, gw: GatewayProcess, pid: int, database_url: str
) -> tuple[str, bool]:
    timeout = aiohttp.ClientTimeout(total=10)
    headers = {"Authorization": f"Bearer {gw.token}"}
    chosen = set(args.phases)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        listing = f"{gw.url}/v1/runtimes/{ANSWER_RUNTIME}/tasks"
        for _ in range(ANSWER_TASKS if "unread" in chosen else 0):
            async with http.post(listing, json={"payload": ANSWER_PAYLOAD}) as resp:
                resp.raise_for_status()
        expanding = []
        if "expansion" in chosen:
            expanding = await expansion_setup(http, gw.url, args.max_body_bytes)
        # Warm up what a normal request touches, so that the baseline includes it.
        for _ in range(20):
            async with http.post(gw.url + "/v1/runtimes/warm/tasks", json={"payload": 1}):
                pass
            async with http.post(
                gw.url + "/v1/runtimes/warm/claim", json={"worker_id": "w", "max_tasks": 1}
            ):
                pass
        async with http.get(listing) as resp:
            await resp.read()
        await asyncio.sleep(1)
        rss = RssSampler(pid)
        baseline = rss.reset()
        rss.start()
        port, token, n, half = gw.port, gw.token, args.clients, args.clients // 2

        def bodies(phase: Phase) -> list[Coroutine[Any, Any, None]]:
            announced = [_refused_client(port, phase, _announced_body(token)) for _ in range(half)]
            chunked = [_refused_client(port, phase, _chunked_body(token)) for _ in range(n - half)]
            return announced + chunked

        def heads(phase: Phase) -> list[Coroutine[Any, Any, None]]:
            return [_refused_client(port, phase, _big_head(token)) for _ in range(n)]

        def slow(phase: Phase) -> list[Coroutine[Any, Any, None]]:
            return [_slow_client(port, phase) for _ in range(args.slow)]

        wait = args.read_timeout_seconds + args.margin_seconds

        def unread(phase: Phase) -> list[Coroutine[Any, Any, None]]:
            last = UNREAD_WAVES * wait
            clients = [
                _unread_client(port, token, phase, wave * wait, last)
                for wave in range(UNREAD_WAVES)
                for _ in range(args.unread)
            ]
            return [*clients, _held_rss(rss, phase, last - 0.1)]

        def expansion(phase: Phase) -> list[Coroutine[Any, Any, None]]:
            rounds = args.expansion_rounds
            return [
                _expansion_client(http, gw.url, phase, expanding, rounds)
                for _ in range(args.expansion_clients)
            ]

        everything = Counter({"413": n, "431": n, "408": args.slow})
        each = args.expansion_clients * args.expansion_rounds
        refused = Counter({f"{e.name}: 413": each for e in expanding})
        every_phase = {
            "bodies": (Phase("bodies (2 GB)", Counter({"413": n})), [bodies]),
            "heads": (Phase("heads (2 MB)", Counter({"431": n})), [heads]),
            "slow": (Phase("slow heads", Counter({"408": args.slow})), [slow]),
            "all": (Phase("all at once", everything), [bodies, heads, slow]),
            "unread": (
                Phase("unread answers", Counter({"cut": UNREAD_WAVES * args.unread})),
                [unread],
            ),
            "expansion": (Phase("expansion", refused), [expansion]),
        }
        phases = [every_phase[key] for key in PHASES if key in chosen]
        try:
            for phase, makers in phases:
                clients = [c for make in makers for c in make(phase)]
                waits = UNREAD_WAVES * wait if unread in makers else args.read_timeout_seconds
                await _run_phase(phase, rss, clients, waits + PHASE_SECONDS)
        finally:
            rss.stop()
        after = rss.read()
        try:
            async with http.get(gw.url + "/healthz") as resp:
                alive = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            alive = False
        cuts = await _cut_counts(http, gw.url) if alive else {}
    stored = await expansion_stored(database_url) if expanding else {}

    failures = []
    for p, _ in phases:
        if p.outcomes != p.expected:
            failures.append(f"{p.name}: expected {dict(p.expected)}, got {dict(p.outcomes)}")
        grown = (p.held_rss or p.peak_rss) - baseline
        if grown > args.rss_growth_mib * MIB:
            failures.append(
                f"{p.name}: RSS grew {grown / MIB:.1f} MiB, "
                f"more than --rss-growth-mib {args.rss_growth_mib:g}"
            )
        if p.most_sent >= BODY_BYTES:
            failures.append(f"{p.name}: a client sent its whole 2 GB body without being cut")
        late = p.slowest_answer_seconds - args.read_timeout_seconds
        if late > args.margin_seconds:
            failures.append(
                f"{p.name}: the slowest client was answered {late:.1f} s after the read "
                f"timeout, more than --margin-seconds {args.margin_seconds:g}"
            )
    if not alive:
        failures.append("the gateway stopped answering GET /healthz")
    ran = {"bodies": 0, "heads": 0, "slow": 0, "all": 0, "unread": 0} | dict.fromkeys(chosen, 1)
    want = {
        "body_unread": (ran["bodies"] + ran["all"]) * n,
        "head_too_large": (ran["heads"] + ran["all"]) * n,
        "read_timeout": (ran["slow"] + ran["all"]) * args.slow,
        "write_timeout": ran["unread"] * UNREAD_WAVES * args.unread,
    }
    if alive and {k: int(cuts.get(k, 0)) for k in want} != want:
        failures.append(f"gateway_connections_cut_total is {cuts}, expected {want}")
    if stored and stored != {"tasks": EXPANSION_ITEMS, "not_claimed": 0, "results": 0}:
        failures.append(
            f"expansion: runtime {EXPANSION_RUNTIME} holds {stored}, expected only the "
            f"{EXPANSION_ITEMS} tasks claimed before the phase, claimed and without results"
        )
    failures += [f"the gateway logged: {line.strip()}" for line in gateway_log_problems(gw)]

    out = [
        "claim-gateway hostile clients, against gateway serve with GATEWAY_READ_TIMEOUT_SECONDS="
        f"{args.read_timeout_seconds:g}, GATEWAY_MAX_BODY_BYTES={args.max_body_bytes} and "
        f"GATEWAY_MAX_PAYLOAD_BYTES={PAYLOAD_BYTES}"
        + "".join(f", {key}={value}" for key, value in args.gateway_env.items()),
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; RSS in MiB",
        "",
        f"{'phase':<14}{'clients':>8}{'refused':>9}{'peak RSS':>10}{'growth':>8}"
        f"{'after':>8}{'slowest s':>11}{'most sent MiB':>15}{'time s':>8}",
        f"{'baseline':<31}{baseline / MIB:>10.1f}",
    ]
    for p, _ in phases:
        out.append(
            f"{p.name:<14}{p.clients:>8}{p.refused:>9}{p.peak_rss / MIB:>10.1f}"
            f"{(p.peak_rss - baseline) / MIB:>+8.1f}{p.after_rss / MIB:>8.1f}"
            f"{p.slowest_answer_seconds:>11.1f}{p.most_sent / MIB:>15.1f}{p.seconds:>8.1f}"
        )
    out += [f"{'after':<31}{after / MIB:>10.1f}", ""]
    if "unread" in chosen:
        held = every_phase["unread"][0].held_rss
        out.append(
            f"unread answers: RSS {held / MIB:.1f} MiB ({(held - baseline) / MIB:+.1f}) "
            "when the clients start reading"
        )
    if expanding:
        p = every_phase["expansion"][0]
        out.append(
            f"expansion: {args.expansion_clients} clients, {args.expansion_rounds} rounds; "
            "bytes per request, as sent and written out"
        )
        for e in expanding:
            out.append(f"  {e.name:<15}{len(e.body):>10,} {written_out(e.body):>13,}")
        out += [
            f"  answers: {dict(p.outcomes)}; the longest {p.largest_answer:,} bytes",
            f"  RSS at its start {p.start_rss / MIB:.1f} MiB, peak {p.peak_rss / MIB:.1f} "
            f"({(p.peak_rss - baseline) / MIB:+.1f} over the baseline), after it "
            f"{p.after_rss / MIB:.1f} ({(p.after_rss - baseline) / MIB:+.1f})",
            f"  runtime {EXPANSION_RUNTIME} afterwards: {stored}",
        ]
    out.append(f"gateway_connections_cut_total: {cuts}")
    out += [f"FAIL  {f}" for f in failures] or [
        f"ok: every client refused as expected, RSS growth within {args.rss_growth_mib:g} MiB"
    ]
    return "\n".join(out), not failures


# -- command line ------------------------------------------------------------


def _raise_file_limit(needed: int) -> None:
    """Both ends of every connection are open at once: lift the soft limit on open
    files towards the hard one (the gateway process inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(
            f"bench.hostile: needs {needed} open files, the hard limit is {hard}; "
            "lower --slow or raise the limit (ulimit -Hn)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _phases(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(unknown) or '(none given)'}; choose from {','.join(PHASES)}"
        )
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.hostile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--clients",
        type=int,
        default=50,
        metavar="N",
        help="clients sending 2 GB bodies, and clients sending 2 MB heads (50)",
    )
    p.add_argument(
        "--slow", type=int, default=1000, metavar="N", help="connections trickling a head (1000)"
    )
    p.add_argument(
        "--unread",
        type=int,
        default=10,
        metavar="N",
        help="clients per wave asking for a 2.7 MB answer and not reading it (10)",
    )
    p.add_argument(
        "--expansion-clients",
        type=int,
        default=4,
        metavar="N",
        help="clients sending requests whose numbers expand when written out (4)",
    )
    p.add_argument(
        "--expansion-rounds",
        type=int,
        default=3,
        metavar="N",
        help="times each expansion client sends each of its four requests (3)",
    )
    p.add_argument(
        "--phases",
        type=_phases,
        default=PHASES,
        metavar="LIST",
        help=f"comma-separated phases to run, in this order: {','.join(PHASES)} (all)",
    )
    p.add_argument(
        "--read-timeout-seconds",
        type=float,
        default=2.0,
        metavar="S",
        help="GATEWAY_READ_TIMEOUT_SECONDS for the gateway (2)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=MIB,
        metavar="N",
        help="GATEWAY_MAX_BODY_BYTES for the gateway: each chunked client may "
        "make it hold this much before its 413; 1048576 to 1572864 for the expansion "
        "phase, whose bodies are up to 0.72 MB as sent (1048576)",
    )
    p.add_argument(
        "--rss-growth-mib",
        type=float,
        default=64.0,
        metavar="MIB",
        help="largest growth of the gateway's RSS over its baseline (64)",
    )
    p.add_argument(
        "--margin-seconds",
        type=float,
        default=3.0,
        metavar="S",
        help="how late after the read timeout a slow client may be cut (3)",
    )
    p.add_argument(
        "--gateway-env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the gateway, e.g. GATEWAY_DB_STATEMENT_TIMEOUT_MS=60000 "
        "(repeatable); the read timeout and the body and payload limits stay the script's",
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="Postgres; default $BENCH_DATABASE_URL, else $TEST_DATABASE_URL, else embedded",
    )
    p.add_argument(
        "--redis-url",
        metavar="URL",
        help="Redis; default $BENCH_REDIS_URL, else $TEST_REDIS_URL, else embedded",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        metavar="DIR",
        help="keep the gateway's log here (default: a temporary folder, removed)",
    )
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    args.gateway_env = dict(args.gateway_env)
    if args.clients < 2 or args.slow < 1 or args.unread < 0 or args.read_timeout_seconds < 0.1:
        p.error(
            "--clients must be at least 2, --slow at least 1, --unread at least 0, "
            "the read timeout at least 0.1"
        )
    if args.expansion_clients < 1 or args.expansion_rounds < 1:
        p.error("--expansion-clients and --expansion-rounds must be at least 1")
    if "expansion" in args.phases and not MIB <= args.max_body_bytes <= MIB * 3 // 2:
        # Below, its bodies would be refused as sent, not for what they expand to; above,
        # a payload larger than the body limit written out would not fit PAYLOAD_BYTES.
        p.error(f"the expansion phase needs --max-body-bytes from {MIB} to {MIB * 3 // 2}")
    _raise_file_limit(args.slow + 4 * args.clients + 2 * UNREAD_WAVES * args.unread + 256)
    started = time.monotonic()
    workdir = args.log_dir or Path(tempfile.mkdtemp(prefix="gateway-hostile-"))
    workdir.mkdir(parents=True, exist_ok=True)
    servers = resolve_servers(args.database_url, args.redis_url)

    async def guarded() -> tuple[str, bool]:
        # SIGTERM cancels the run like Ctrl-C, so the gateway is stopped and the database dropped.
        main_task = asyncio.current_task()
        if main_task is not None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
        return await run(args, servers, workdir / "gateway.log")

    try:
        report, ok = asyncio.run(guarded())
    except (KeyboardInterrupt, asyncio.CancelledError):
        log("interrupted: gateway stopped, database dropped")
        return 130
    finally:
        servers.close()
        if args.log_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report)
    log(f"done in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
