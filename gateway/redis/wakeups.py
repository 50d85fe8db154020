"""One pub/sub connection per process, shared by every parked poll (I5, I8).

A runtime's channel is subscribed when its first local waiter arrives, and the
subscription is confirmed by Redis *before* the waiter reads the verdict, so a bump
published after that read always reaches us. The connection is pinged
periodically; when it fails it is replaced, every channel is subscribed again, and
once that is confirmed every local waiter is woken to re-check (I8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..background import stop_task
from ..flag import Flag
from ..metrics import Metrics
from .keys import runtime_of_channel

if TYPE_CHECKING:
    from .clients import PubSubSource

log = logging.getLogger("gateway.wakeups")

CONTROL_CHANNEL_SUFFIX = ":__gateway__"


class Subscriber:
    """Owns the process's pub/sub connection and `client` (a Redis client, or in
    cluster mode `clients.ClusterNodes`). `start()`/`stop()` belong to the lifespan."""

    def __init__(
        self,
        client: PubSubSource,
        prefix: str,
        metrics: Metrics,
        *,
        on_wake: Callable[[str], None],
        on_reset: Callable[[], None],
        timeout_seconds: float,
        on_control: Callable[[str], None] | None = None,
        ping_interval_seconds: float = 1.0,
        on_message: Callable[[str], None] | None = None,
    ) -> None:
        """`on_message(channel)`: a message on a channel that is no runtime's wake
        channel (a task's result channel, results.py)."""
        self._client = client
        self._on_message = on_message
        self._prefix = prefix
        self._metrics = metrics
        self._on_wake = on_wake
        self._on_reset = on_reset
        self._on_control = on_control  # messages on the control channel (controls.py)
        # Bound on one pub/sub send or confirmation: a few Redis command budgets.
        self._budget = timeout_seconds * 4
        self._ping_interval = ping_interval_seconds
        self._control = prefix + CONTROL_CHANNEL_SUFFIX
        self._wanted: dict[str, Flag] = {}  # channel -> confirmed (one per runtime)
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._stopping = False
        self._ever_connected = False
        self._background: set[asyncio.Future[None]] = set()

    @property
    def healthy(self) -> bool:
        """True while the connection is up and confirmed; parked polls may then rely on it."""
        return self._connected.is_set()

    def confirmed(self, channel: str) -> bool:
        """True when Redis has confirmed our subscription to `channel` on the live
        connection: a wake-up published now will reach us."""
        event = self._wanted.get(channel)
        return self.healthy and event is not None and event.is_set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-pubsub")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task, "pub/sub reader")
            self._task = None
        await self._close_pubsub()
        await self._client.aclose()

    async def subscribe(self, channel: str) -> bool:
        """Subscribe and wait for Redis to confirm. False when that did not happen in
        time: the caller must then not rely on wake-ups and should poll."""
        event = self._wanted.get(channel)
        if event is None:
            event = self._wanted[channel] = Flag()
        if event.is_set():
            return True
        if not self.healthy or self._pubsub is None:
            # Down or reconnecting: do not make the poll wait. The reconnect subscribes
            # every wanted channel; meanwhile the runtime's pump polls Postgres.
            return False
        try:
            # Bounded: sending can hang on a server that accepts but never answers.
            async with asyncio.timeout(self._budget):
                await self._pubsub.subscribe(channel)
        except Exception as exc:  # the reader notices and reconnects
            log.debug("subscribe to %s failed: %r", channel, exc)
            return False
        try:
            async with asyncio.timeout(self._budget):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def unsubscribe(self, channel: str) -> None:
        """Stop wanting `channel` now; the UNSUBSCRIBE is sent in the background. If a
        new poll wants it again before that lands, the reader subscribes once more."""
        if self._wanted.pop(channel, None) is None or self._pubsub is None:
            return
        pubsub = self._pubsub

        async def send() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._budget):
                    await pubsub.unsubscribe(channel)

        self._background.add(task := asyncio.ensure_future(send()))
        task.add_done_callback(self._background.discard)

    async def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._budget):
                    await pubsub.aclose()

    async def _run(self) -> None:
        delay = 0.05
        while not self._stopping:
            try:
                await self._serve()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._connected.is_set():
                    log.warning("pub/sub connection lost (%r); reconnecting", exc)
                self._metrics.subscriber_reconnects.inc()
            was_connected = self._connected.is_set()
            self._connected.clear()
            for event in self._wanted.values():
                event.clear()
            if was_connected:
                # Parked polls were relying on wake-ups that can no longer arrive: wake
                # them so that they re-check and switch to polling Postgres (I5).
                self._on_reset()
            await self._close_pubsub()
            # Back off while it keeps failing; a connection that came up starts over.
            delay = 0.05 if was_connected else min(delay * 2, 2.0)
            await asyncio.sleep(delay)
        # not reached while running; cancellation ends the loop

    async def _serve(self) -> None:
        """One connection's life: subscribe everything, confirm, then read until it fails."""
        self._pubsub = self._client.pubsub()
        channels = [self._control, *self._wanted]
        async with asyncio.timeout(self._budget):
            await self._pubsub.subscribe(*channels)
        pending = set(channels)
        last_ping = last_pong = time.monotonic()
        ping_outstanding = False
        while not self._stopping:
            message = await self._pubsub.get_message(timeout=min(0.5, self._ping_interval))
            now = time.monotonic()
            if message is not None:
                kind = message["type"]
                channel = message.get("channel")
                if isinstance(channel, bytes):
                    channel = channel.decode()
                if kind == "message":
                    runtime = runtime_of_channel(self._prefix, channel)
                    if runtime is not None:
                        self._metrics.wakeups_received.inc()
                        self._on_wake(runtime)
                    elif channel == self._control and self._on_control is not None:
                        data = message.get("data")
                        if isinstance(data, bytes):
                            data = data.decode(errors="replace")
                        self._on_control(str(data))
                    elif self._on_message is not None:
                        self._on_message(channel)
                elif kind == "subscribe":
                    event = self._wanted.get(channel)
                    if event is not None:
                        event.set()
                    if pending:
                        pending.discard(channel)
                        if not pending:
                            self._connected.set()
                            late = [c for c, e in self._wanted.items() if not e.is_set()]
                            if late:  # wanted while this connection was coming up
                                async with asyncio.timeout(self._budget):
                                    await self._pubsub.subscribe(*late)
                            if self._ever_connected:
                                log.info("pub/sub connection restored; waking every waiter")
                            self._ever_connected = True
                            # Bumps may have been published while we were not
                            # subscribed: every waiter re-checks (I8).
                            self._on_reset()
                elif kind == "unsubscribe" and channel in self._wanted:
                    # An unsubscribe for a runtime that was forgotten raced a new poll
                    # that wants it again: subscribe once more.
                    self._wanted[channel].clear()
                    async with asyncio.timeout(self._budget):
                        await self._pubsub.subscribe(channel)
                elif kind == "pong":
                    last_pong = now
                    ping_outstanding = False
            if ping_outstanding and now - last_ping > max(self._budget, 1.0):
                raise ConnectionError(f"no answer to PING within {now - last_ping:.1f}s")
            if not ping_outstanding and now - last_pong >= self._ping_interval:
                async with asyncio.timeout(self._budget):
                    await self._pubsub.ping()
                last_ping = now
                ping_outstanding = True
