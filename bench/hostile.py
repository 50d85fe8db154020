"""`python -m bench.hostile`: the gateway's memory while hostile clients are refused.

Starts `gateway serve` as a separate process on a fresh database (servers are found
as for `python -m bench`: flags, BENCH_* then TEST_* URLs, else embedded), then runs
five phases, one after the other, over loopback:

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
import contextlib
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


# -- the run -----------------------------------------------------------------


async def _run_phase(
    phase: Phase, rss: RssSampler, clients: list[Coroutine[Any, Any, None]], limit: float
) -> None:
    rss.reset()
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
        "GATEWAY_READ_TIMEOUT_SECONDS": f"{args.read_timeout_seconds:g}",
        "GATEWAY_MAX_BODY_BYTES": str(args.max_body_bytes),
    }
    async with fresh_database(servers.database_url) as database_url:
        gw = ServeProcess(database_url, servers.redis_url, True, log_path, extra_env=env)
        try:
            await gw.start()
            assert gw.pid is not None
            log(f"gateway serve pid {gw.pid} ready at {gw.url}")
            return await _measure(args, gw, gw.pid)
        finally:
            await gw.stop()
            with contextlib.suppress(Exception):
                await delete_redis_keys(servers.redis_url, gw.prefix)


async def _measure(args: argparse.Namespace, gw: GatewayProcess, pid: int) -> tuple[str, bool]:
    timeout = aiohttp.ClientTimeout(total=10)
    headers = {"Authorization": f"Bearer {gw.token}"}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
        listing = f"{gw.url}/v1/runtimes/{ANSWER_RUNTIME}/tasks"
        for _ in range(ANSWER_TASKS):
            async with http.post(listing, json={"payload": ANSWER_PAYLOAD}) as resp:
                resp.raise_for_status()
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

        everything = Counter({"413": n, "431": n, "408": args.slow})
        phases = [
            (Phase("bodies (2 GB)", Counter({"413": n})), [bodies]),
            (Phase("heads (2 MB)", Counter({"431": n})), [heads]),
            (Phase("slow heads", Counter({"408": args.slow})), [slow]),
            (Phase("all at once", everything), [bodies, heads, slow]),
            (Phase("unread answers", Counter({"cut": UNREAD_WAVES * args.unread})), [unread]),
        ]
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
    want = {
        "body_unread": 2 * n,
        "head_too_large": 2 * n,
        "read_timeout": 2 * args.slow,
        "write_timeout": UNREAD_WAVES * args.unread,
    }
    if alive and {k: int(cuts.get(k, 0)) for k in want} != want:
        failures.append(f"gateway_connections_cut_total is {cuts}, expected {want}")
    failures += [f"the gateway logged: {line.strip()}" for line in gateway_log_problems(gw)]

    out = [
        "claim-gateway hostile clients, against gateway serve with GATEWAY_READ_TIMEOUT_SECONDS="
        f"{args.read_timeout_seconds:g} and GATEWAY_MAX_BODY_BYTES={args.max_body_bytes}",
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; RSS in MiB",
        "",
        f"{'phase':<14}{'clients':>8}{'refused':>9}{'peak RSS':>10}{'growth':>8}"
        f"{'slowest s':>11}{'most sent MiB':>15}{'time s':>8}",
        f"{'baseline':<31}{baseline / MIB:>10.1f}",
    ]
    for p, _ in phases:
        out.append(
            f"{p.name:<14}{p.clients:>8}{p.refused:>9}{p.peak_rss / MIB:>10.1f}"
            f"{(p.peak_rss - baseline) / MIB:>+8.1f}{p.slowest_answer_seconds:>11.1f}"
            f"{p.most_sent / MIB:>15.1f}{p.seconds:>8.1f}"
        )
    unread_phase = phases[-1][0]
    out += [
        f"{'after':<31}{after / MIB:>10.1f}",
        "",
        f"unread answers: RSS {unread_phase.held_rss / MIB:.1f} MiB "
        f"({(unread_phase.held_rss - baseline) / MIB:+.1f}) when the clients start reading",
        f"gateway_connections_cut_total: {cuts}",
    ]
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
        "make it hold this much before its 413 (1048576)",
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
    if args.clients < 2 or args.slow < 1 or args.unread < 0 or args.read_timeout_seconds < 0.1:
        p.error(
            "--clients must be at least 2, --slow at least 1, --unread at least 0, "
            "the read timeout at least 0.1"
        )
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
