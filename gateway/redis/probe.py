"""Questions `gateway doctor` asks Redis, in the gateway's mode and through the
gateway's own clients (gateway/redis/clients.py): its version, whether a publish comes
back on pub/sub, its memory limit and eviction policy, and its clock. Writes nothing but
one message on a channel of its own."""

from __future__ import annotations

import asyncio
import errno
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..settings import Settings
from .clients import REDIS_ERRORS, CommandClient, command_client, pubsub_client

# What one probe waits, in seconds: a Redis that takes longer than this would be useless
# to the claim path anyway, whose budget is GATEWAY_REDIS_TIMEOUT_MS.
PROBE_TIMEOUT_SECONDS = 3.0


class ProbeFailed(Exception):
    """Redis could not be reached or refused a command; the text says why."""


@dataclass(frozen=True)
class RedisFacts:
    version: str
    round_trip_ms: float
    clock_offset_seconds: float  # Redis's clock minus this host's
    # None when CONFIG GET is refused (managed services often rename or forbid it):
    maxmemory_bytes: int | None
    maxmemory_policy: str | None
    config_refused: str | None  # Redis's answer when CONFIG GET was refused
    pubsub_ms: float | None  # a publish's way back to a subscriber; None: it never came
    pubsub_error: str | None


def _first(answer: Any) -> Any:
    """A cluster client may answer with one value per node: take any one."""
    if isinstance(answer, Mapping) and answer and all(":" in str(k) for k in answer):
        return next(iter(answer.values()))
    return answer


async def probe(settings: Settings) -> RedisFacts:
    """Connects in GATEWAY_REDIS_MODE with the gateway's clients; raises ProbeFailed
    when Redis cannot be reached at all."""
    assert settings.redis_url is not None
    try:
        client = command_client(
            settings.redis_mode,
            settings.redis_url,
            PROBE_TIMEOUT_SECONDS,
            settings.redis_sentinel_master,
            max_connections=4,
        )
    except ValueError as exc:  # a URL redis-py cannot read (a port that is not a number)
        raise ProbeFailed(f"REDIS_URL cannot be read: {exc}") from exc
    try:
        try:
            started = time.monotonic()
            await client.ping()
            round_trip_ms = (time.monotonic() - started) * 1000
            info = _first(await client.info("server"))
            before = time.time()
            seconds, micros = _first(await client.time())
            after = time.time()
        except REDIS_ERRORS as exc:
            raise ProbeFailed(_reason(exc)) from exc
        maxmemory: int | None = None
        policy: str | None = None
        refused: str | None = None
        try:
            config = _first(await client.config_get("maxmemory*"))
            maxmemory = int(config.get("maxmemory", 0))
            policy = str(config.get("maxmemory-policy", "")) or None
        except REDIS_ERRORS as exc:  # refused (ACL, renamed) or no answer in time
            refused = _reason(exc)
        pubsub_ms, pubsub_error = await _pubsub_round_trip(settings, client)
        return RedisFacts(
            version=str(info.get("redis_version", "unknown")),
            round_trip_ms=round_trip_ms,
            clock_offset_seconds=(int(seconds) + int(micros) / 1e6) - (before + after) / 2,
            maxmemory_bytes=maxmemory,
            maxmemory_policy=policy,
            config_refused=refused,
            pubsub_ms=pubsub_ms,
            pubsub_error=pubsub_error,
        )
    finally:
        await _close(client)


async def _pubsub_round_trip(
    settings: Settings, client: CommandClient
) -> tuple[float | None, str | None]:
    """Subscribes as the gateway's subscriber does, publishes through the command
    client as the claim path does, and times the message's way back."""
    assert settings.redis_url is not None
    channel = f"{settings.redis_prefix}:doctor:{secrets.token_hex(8)}"
    source = pubsub_client(
        settings.redis_mode,
        settings.redis_url,
        PROBE_TIMEOUT_SECONDS,
        client,
        settings.redis_sentinel_master,
    )
    pubsub = source.pubsub()
    try:
        await asyncio.wait_for(pubsub.subscribe(channel), PROBE_TIMEOUT_SECONDS)
        started = time.monotonic()
        await client.publish(channel, "doctor")
        deadline = started + PROBE_TIMEOUT_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left)
            if message is not None and message.get("type") == "message":
                return (time.monotonic() - started) * 1000, None
        return None, f"nothing came back within {PROBE_TIMEOUT_SECONDS:g} s"
    except REDIS_ERRORS as exc:
        return None, _reason(exc)
    finally:
        try:
            await asyncio.wait_for(pubsub.aclose(), PROBE_TIMEOUT_SECONDS)
        except REDIS_ERRORS:
            pass
        await _close(source)


async def _close(client: Any) -> None:
    try:
        await asyncio.wait_for(client.aclose(), PROBE_TIMEOUT_SECONDS)
    except REDIS_ERRORS:
        pass


def _reason(exc: BaseException) -> str:
    """Why a call failed, in a few words."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return f"no answer within {PROBE_TIMEOUT_SECONDS:g} s"
    text = str(exc).strip() or type(exc).__name__
    # redis-py words a refused connection "Error 111 connecting to host:port. ..."
    if f"Error {errno.ECONNREFUSED} " in text or isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return text.splitlines()[0]
