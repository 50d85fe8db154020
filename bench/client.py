"""The load generator's side of HTTP: one shared aiohttp session, a per-endpoint tally
of statuses and latencies, and a /metrics scraper.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import aiohttp
import orjson

SAMPLE_CHARS = 300
SCRAPE_SECONDS = 5.0


# What names a request the gateway refused before any work because its line for a
# database connection was too long (load shedding), which the load retries: the
# setting in its problem's detail. A 503 database_busy after the whole acquire timeout
# (a stalled Postgres) is not shedding, and stays a failure.
SHED_CODE = b"GATEWAY_DB_QUEUE_BUDGET_MS"


class Tally:
    """What one kind of request got back: statuses, latencies, transport errors, and
    the first body seen for each unexpected outcome."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.statuses: Counter[int] = Counter()
        self.transport: Counter[str] = Counter()
        self.samples: dict[str, str] = {}
        self.shed = 0  # 503 database_busy: refused before any work, under overload

    @property
    def responses(self) -> int:
        return sum(self.statuses.values())

    def failed(self, exc: BaseException) -> None:
        name = type(exc).__name__
        self.transport[name] += 1
        self.sample(name, str(exc) or repr(exc))

    def sample(self, key: str, text: str) -> None:
        self.samples.setdefault(key, text[:SAMPLE_CHARS])

    def record(self, status: int, seconds: float, body: bytes) -> None:
        self.statuses[status] += 1
        self.latencies.append(seconds)
        if status == 503 and SHED_CODE in body:
            self.shed += 1
        elif status >= 300:
            self.sample(f"HTTP {status}", body.decode("utf-8", "replace"))

    def unexpected(self) -> dict[str, int]:
        """Outcomes other than 2xx and load shed, which the design allows under
        overload: 429 (a claim refused), and 503 database_busy (anything else refused
        before any work, gateway/admission.py), both to be retried."""
        out = {f"HTTP {s}": n for s, n in self.statuses.items() if s >= 300 and s != 429}
        if self.shed:
            out["HTTP 503"] -= self.shed
            if not out["HTTP 503"]:
                del out["HTTP 503"]
        out.update(self.transport)
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "transport_errors": dict(self.transport),
            "shed": self.shed,
            "samples": dict(self.samples),
        }


class Api:
    """POSTs JSON with the bearer token; never raises for HTTP or transport errors."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str) -> None:
        self.session = session
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def post(
        self,
        path: str,
        body: Any,
        tally: Tally,
        *,
        seconds: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any] | None:
        """(status, parsed body) or None after a transport error (recorded in tally).
        `body` is sent as JSON, or as it is when it is bytes (JSON made beforehand);
        `headers` are sent beside the token's."""
        return await self.send("POST", path, body, tally, seconds=seconds, headers=headers)

    async def send(
        self,
        method: str,
        path: str,
        body: Any,
        tally: Tally,
        *,
        seconds: float = 30.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any] | None:
        """As `post`, with another method (a PUT)."""
        started = time.perf_counter()
        try:
            async with self.session.request(
                method,
                self.base_url + path,
                data=body if isinstance(body, bytes) else orjson.dumps(body),
                headers=self.headers if headers is None else {**self.headers, **headers},
                timeout=aiohttp.ClientTimeout(total=seconds),
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.failed(exc)
            return None
        tally.record(status, time.perf_counter() - started, raw)
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            tally.sample(f"HTTP {status} (not JSON)", raw.decode("utf-8", "replace"))
            data = None
        return status, data


def session(connections: int) -> aiohttp.ClientSession:
    """One session for every simulated daemon, with room for all of them at once."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections)
    return aiohttp.ClientSession(connector=connector)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {'name{labels}': value}; comments and odd lines are skipped."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, raw = line.rpartition(" ")
        try:
            values[key] = float(raw)
        except ValueError:
            continue
    return values


async def scrape(
    http: aiohttp.ClientSession, base_url: str, problems: list[str] | None = None
) -> dict[str, float]:
    """The gateway's counters. With `problems` given, a failed scrape is appended there
    (and {} returned) instead of raising."""
    try:
        async with http.get(
            base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=SCRAPE_SECONDS)
        ) as resp:
            resp.raise_for_status()
            return parse_metrics(await resp.text())
    except (aiohttp.ClientError, TimeoutError) as exc:
        if problems is None:
            raise
        problems.append(
            f"GET /metrics failed ({type(exc).__name__}: {exc or 'no answer'} "
            f"within {SCRAPE_SECONDS:g} s); Postgres claim counts are missing"
        )
        return {}


def seconds_delta(before: dict[str, float], after: dict[str, float], key: str) -> float | None:
    """How much a sample grew (a histogram's sum of seconds); None when a scrape is
    missing."""
    if not before or not after:
        return None
    return after.get(key, 0.0) - before.get(key, 0.0)


def delta(before: dict[str, float], after: dict[str, float], key: str) -> int | None:
    """How much a counter grew; None when a scrape is missing."""
    grew = seconds_delta(before, after, key)
    return None if grew is None else int(grew)


PG_CLAIMS = "gateway_postgres_claims_total"
PG_CLAIM_SECONDS = "gateway_postgres_claim_seconds_sum"
LONG_POLL_SECONDS = "gateway_long_poll_wait_seconds_sum"
LONG_POLLS = "gateway_long_poll_wait_seconds_count"
PG_COMPLETES = "gateway_complete_statements_total"
VERDICT_HIT = 'gateway_verdict_checks_total{outcome="hit"}'
VERDICT_MISS = 'gateway_verdict_checks_total{outcome="miss"}'
VERDICT_ERROR = 'gateway_verdict_checks_total{outcome="error"}'
LEASES_RETURNED = "gateway_leases_returned_total"
REDIS_ERRORS = "gateway_redis_errors_total"
