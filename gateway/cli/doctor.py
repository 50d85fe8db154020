"""`gateway doctor`: checks the configuration and the servers it names, and explains
each finding in a line. A check is ✓ (fine), ⚠ (works, with a cost worth knowing) or
✗ (the gateway will not work as it should). Exit 0 when nothing is ✗, 1 otherwise.

It reads the same environment as `gateway serve`, writes nothing to Postgres, and
publishes one message on a Redis channel of its own."""

from __future__ import annotations

import asyncio
import math
import os
import string
import sys
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..redis import probe as redis_probe
from ..settings import ENV_NAMES, Settings, _mask_url
from ..store import probe as pg_probe
from ..store import startup as pg_startup
from ..store.migrate import MigrationError

Status = Literal["ok", "warn", "fail"]
MARKS: dict[Status, str] = {"ok": "✓", "warn": "⚠", "fail": "✗"}
ASCII_MARKS: dict[Status, str] = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}

# Clock skew between this host and Postgres or Redis, in seconds. Pause ends, result
# waits and the parked-poll reports that instances share through Redis compare one
# server's time with another's: a second is noise, ten seconds shifts them visibly.
SKEW_WARN_SECONDS = 1.0
SKEW_FAIL_SECONDS = 10.0
# An admin token drawn from fewer distinct characters than this looks typed, not
# generated (a random 32-character token holds about 25).
TOKEN_MIN_DISTINCT_CHARS = 12
TOKEN_MIN_BITS = 128
SECRET_NAMES = frozenset({"GATEWAY_ADMIN_TOKEN"})
URL_NAMES = frozenset({"DATABASE_URL", "GATEWAY_DIRECT_DATABASE_URL", "REDIS_URL"})


@dataclass
class Finding:
    """One line of the report, and the lines that explain it."""

    status: Status
    text: str
    details: list[str] = field(default_factory=list)


def _where(url: str) -> str:
    """host:port of a Redis URL, for messages (never its credentials)."""
    parts = urlsplit(url)
    try:
        port = parts.port or 6379
    except ValueError:  # not a number: shown as written
        return parts.netloc.rpartition("@")[2]
    return f"{parts.hostname or 'localhost'}:{port}"


def check_settings(env: Mapping[str, str]) -> tuple[Finding, Settings]:
    """The settings as `gateway serve` would resolve them, secrets masked. When they do
    not validate, the servers are still checked with the URLs as given."""
    shown = []
    for name in sorted(n for n in ENV_NAMES if env.get(n)):
        value = env[name]
        if name in SECRET_NAMES:
            value = f"*** ({len(value)} characters)"
        elif name in URL_NAMES:
            value = _mask_url(value) or ""
        shown.append(f"{name}={value}")
    unset = len(ENV_NAMES) - len(shown)
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:
        fallback = Settings(
            database_url=env.get("DATABASE_URL") or None,
            direct_database_url=env.get("GATEWAY_DIRECT_DATABASE_URL") or None,
            redis_url=env.get("REDIS_URL") or None,
            redis_mode=(env.get("GATEWAY_REDIS_MODE") or "standalone").strip().lower(),
            redis_sentinel_master=env.get("GATEWAY_REDIS_SENTINEL_MASTER") or None,
            admin_token=env.get("GATEWAY_ADMIN_TOKEN") or None,
            auth_enabled=(env.get("GATEWAY_AUTH") or "on").strip().lower()
            not in ("off", "0", "false", "no"),
        )
        return Finding("fail", f"settings: {exc.detail}", shown), fallback
    return (
        Finding("ok", f"settings: valid; {len(shown)} set, {unset} at their defaults", shown),
        settings,
    )


async def check_postgres(settings: Settings) -> list[Finding]:
    """Reachable, its version, the schema's migrations, and what pools in between."""
    url = settings.database_url
    if not url:
        return [
            Finding(
                "fail",
                "Postgres: DATABASE_URL is not set: point it at Postgres "
                "(postgresql://user:password@host:5432/database)",
            )
        ]
    where = pg_startup.server(url).removeprefix("Postgres at ")
    try:
        started = time.monotonic()
        conn = await pg_probe.connect(url)
    except pg_probe.ProbeFailed as exc:
        return [
            Finding(
                "fail",
                f"Postgres at {where} cannot be reached: {exc}",
                ["check DATABASE_URL, that the server is up, and that it accepts this host"],
            )
        ]
    try:
        ms = (time.monotonic() - started) * 1000
        version = (await pg_probe.bounded(pg_probe.server_version(conn))).split(" ")[0]
        database = urlsplit(url).path.lstrip("/") or "(the user's default)"
        findings = [
            Finding("ok", f"Postgres {version} at {where}, database {database} ({ms:.0f} ms)")
        ]
        findings.append(await _check_schema(conn, database))
        offset = await pg_probe.bounded(pg_probe.clock_offset_seconds(conn))
    except pg_probe.ProbeFailed as exc:
        return [Finding("fail", f"Postgres at {where} failed a query: {exc}")]
    finally:
        await pg_probe.close_quietly(conn)
    findings.extend(await _check_pooling(settings))
    findings.append(_clock("Postgres", offset))
    return findings


async def _check_schema(conn: Any, database: str) -> Finding:
    try:
        state = await pg_probe.bounded(pg_probe.schema_state(conn))
    except MigrationError as exc:
        return Finding("fail", f"schema: {exc.detail}")
    except pg_probe.ProbeFailed as exc:
        return Finding("fail", f"schema: cannot be read: {exc}")
    total = len(state.shipped)
    if state.empty:
        return Finding(
            "fail",
            f"schema: database {database} has no claim-gateway schema: run `gateway migrate` "
            "(or start with `gateway serve --migrate`)",
        )
    if state.pending:
        names = ", ".join(m.name for m in state.pending)
        return Finding(
            "fail",
            f"schema: {len(state.pending)} of {total} migrations are not applied ({names}): "
            "run `gateway migrate`",
        )
    if state.newer:
        return Finding(
            "warn",
            f"schema: newer than this gateway: {', '.join(state.newer)} came from a later "
            f"release (this one knows {total} migrations)",
            ["an older gateway runs on a newer schema, as during a rollback; upgrade to match"],
        )
    return Finding("ok", f"schema: current, {total} migrations applied (last {state.applied[-1]})")


async def _check_pooling(settings: Settings) -> list[Finding]:
    assert settings.database_url is not None
    try:
        pooled = await pg_probe.pooling(settings.database_url)
    except pg_probe.ProbeFailed as exc:
        return [Finding("warn", f"pooler: could not tell whether one is in between: {exc}")]
    if not pooled.shares_backends:
        if pooled.proxied:
            return [
                Finding(
                    "ok",
                    "pooler: a proxy or session pooler sits in front of Postgres; each "
                    "connection keeps its own server session, so nothing needs setting",
                )
            ]
        return [Finding("ok", "pooler: none; DATABASE_URL reaches Postgres directly")]
    problems = []
    if settings.db_statement_cache_size:
        problems.append(
            "prepared statements do not survive from one transaction to the next: "
            "set GATEWAY_DB_STATEMENT_CACHE_SIZE=0"
        )
    if not settings.direct_database_url:
        problems.append(
            "migrations and the janitor's leadership hold session locks, which need a "
            "connection of their own: set GATEWAY_DIRECT_DATABASE_URL to a URL that reaches "
            "Postgres directly"
        )
    findings = [
        Finding(
            "fail" if problems else "ok",
            "pooler: DATABASE_URL goes through a transaction pooler (such as PgBouncer in "
            "pool_mode=transaction)" + ("" if problems else "; the gateway is set for it"),
            problems,
        )
    ]
    if settings.direct_database_url:
        try:
            direct = await pg_probe.pooling(settings.direct_database_url)
        except pg_probe.ProbeFailed as exc:
            where = pg_startup.server(settings.direct_database_url).removeprefix("Postgres at ")
            findings.append(
                Finding("fail", f"GATEWAY_DIRECT_DATABASE_URL at {where} cannot be reached: {exc}")
            )
        else:
            if direct.shares_backends:
                findings.append(
                    Finding(
                        "fail",
                        "GATEWAY_DIRECT_DATABASE_URL goes through a transaction pooler too: "
                        "point it at Postgres itself",
                    )
                )
    return findings


async def check_redis(settings: Settings) -> list[Finding]:
    """Reachable in its mode, a publish seen back on pub/sub, memory policy, clock."""
    if not settings.cache_enabled:
        return [
            Finding(
                "warn",
                "Redis: the cache is off (GATEWAY_CACHE=off): every poll, empty or not, "
                "reads Postgres",
            )
        ]
    if not settings.redis_url:
        return [
            Finding(
                "fail",
                "Redis: REDIS_URL is not set: point it at Redis (redis://host:6379/0)",
            )
        ]
    where = _where(settings.redis_url)
    mode = f"{settings.redis_mode} mode"
    try:
        facts = await redis_probe.probe(settings)
    except (redis_probe.ProbeFailed, ConfigError) as exc:
        reason = exc.detail if isinstance(exc, ConfigError) else str(exc)
        return [
            Finding(
                "fail",
                f"Redis at {where} ({mode}) cannot be reached: {reason}",
                [
                    "the gateway still starts and serves, but every empty poll then reads "
                    "Postgres, and new tasks wake parked polls late"
                ],
            )
        ]
    findings = [
        Finding("ok", f"Redis {facts.version} at {where}, {mode} ({facts.round_trip_ms:.0f} ms)"),
        _pubsub(facts),
        _memory(facts, settings),
        _clock("Redis", facts.clock_offset_seconds),
    ]
    return findings


def _pubsub(facts: redis_probe.RedisFacts) -> Finding:
    if facts.pubsub_ms is not None:
        return Finding("ok", f"Redis pub/sub: a publish came back in {facts.pubsub_ms:.0f} ms")
    return Finding(
        "fail",
        f"Redis pub/sub: a publish did not come back: {facts.pubsub_error}",
        [
            "new tasks then do not wake parked polls at once; check that PUBLISH and "
            "SUBSCRIBE are allowed to this user"
        ],
    )


def _memory(facts: redis_probe.RedisFacts, settings: Settings) -> Finding:
    if facts.config_refused is not None:
        return Finding(
            "warn",
            f"Redis memory: cannot read maxmemory ({facts.config_refused})",
            [
                "check in your provider's settings that a full Redis evicts keys "
                "(an allkeys-* or volatile-* policy) rather than refusing writes"
            ],
        )
    policy = facts.maxmemory_policy or "noeviction"
    if not facts.maxmemory_bytes:
        return Finding(
            "ok",
            f"Redis memory: no maxmemory limit (policy {policy}); the gateway keeps a few "
            "small keys per runtime",
        )
    limit = _bytes(facts.maxmemory_bytes)
    if policy == "noeviction":
        return Finding(
            "warn",
            f"Redis memory: maxmemory {limit} with policy noeviction: once full, Redis "
            "refuses writes",
            [
                "a task enqueued then can stay hidden from empty polls for up to "
                f"GATEWAY_EMPTY_TTL_SECONDS ({settings.empty_ttl_seconds:g} s); prefer "
                "allkeys-lru, since an evicted gateway key costs one Postgres read and never "
                "loses or hides a task"
            ],
        )
    return Finding(
        "ok",
        f"Redis memory: maxmemory {limit}, policy {policy}: when full, Redis evicts; an "
        "evicted gateway key costs one Postgres read, never a lost or hidden task",
    )


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _clock(server: str, offset: float) -> Finding:
    ahead = "ahead of" if offset > 0 else "behind"
    text = f"clock: {server} is {abs(offset) * 1000:.0f} ms {ahead} this host"
    if abs(offset) < SKEW_WARN_SECONDS:
        return Finding("ok", text)
    why = [
        "pause ends, result waits and the parked-poll counts instances share compare one "
        "server's clock with another's: run NTP (chrony, systemd-timesyncd) on every host"
    ]
    return Finding("fail" if abs(offset) >= SKEW_FAIL_SECONDS else "warn", text, why)


def check_admin_token(settings: Settings) -> Finding:
    """Auth off, or an admin token that looks typed rather than generated."""
    if not settings.auth_enabled:
        return Finding(
            "warn",
            "admin token: auth is off (GATEWAY_AUTH=off): anyone who reaches the port can "
            "enqueue, claim and administer; for local development only",
        )
    token = settings.admin_token or ""
    if not token:
        return Finding("fail", "admin token: GATEWAY_ADMIN_TOKEN is not set")
    bits = token_bits(token)
    distinct = len(set(token))
    text = f"admin token: {len(token)} characters, about {bits} bits"
    if bits < TOKEN_MIN_BITS or distinct < TOKEN_MIN_DISTINCT_CHARS:
        return Finding(
            "warn",
            f"{text}, from {distinct} distinct characters: it looks chosen, not generated",
            ["generate one: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"],
        )
    return Finding("ok", text)


def token_bits(token: str) -> int:
    """An upper bound on the entropy of `token`, in bits: its length times log2 of the
    alphabet its character classes span (lowercase, uppercase, digits, the rest)."""
    classes = [
        (string.ascii_lowercase, 26),
        (string.ascii_uppercase, 26),
        (string.digits, 10),
    ]
    alphabet = sum(size for chars, size in classes if any(c in chars for c in token))
    if any(not c.isascii() or not c.isalnum() for c in token):
        alphabet += 32
    return int(len(token) * math.log2(max(alphabet, 2)))


async def diagnose(env: Mapping[str, str]) -> list[Finding]:
    settings_finding, settings = check_settings(env)
    postgres, redis = await asyncio.gather(
        _unbroken("Postgres", check_postgres(settings)),
        _unbroken("Redis", check_redis(settings)),
    )
    return [settings_finding, *postgres, *redis, check_admin_token(settings)]


async def _unbroken(name: str, check: Awaitable[list[Finding]]) -> list[Finding]:
    """A check's findings; should the check itself fail unexpectedly, one ✗ naming the
    error, so that the other checks are still reported."""
    try:
        return await check
    except Exception as exc:
        return [Finding("fail", f"{name}: the check itself failed: {type(exc).__name__}: {exc}")]


def render(findings: list[Finding], ascii_only: bool = False) -> str:
    marks = ASCII_MARKS if ascii_only else MARKS
    lines = []
    for finding in findings:
        lines.append(f"{marks[finding.status]} {finding.text}")
        lines.extend(f"    {detail}" for detail in finding.details)
    failed = sum(f.status == "fail" for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    lines.append(
        f"{failed} problem{'s' * (failed != 1)}, {warned} warning{'s' * (warned != 1)}"
        if failed or warned
        else "every check passed"
    )
    return "\n".join(lines)


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing failed, warnings or not; 1 otherwise."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def cmd_doctor(args: object) -> int:
    findings = asyncio.run(diagnose(os.environ))
    encoding = (sys.stdout.encoding or "").lower()
    print(render(findings, ascii_only="utf" not in encoding))
    return exit_code(findings)
