"""Runtime controls: pause, max_in_flight and claims_per_second per runtime
(docs/design.md section 5.2).

Postgres holds them (`runtime_controls`, migration 0006) and enforces the limits
exactly: a limited runtime's claim locks its control row, so its claims run one at a
time across every instance, and leases at most what the limits leave. Each process
keeps a copy of every runtime's controls (`RuntimeControls`), so that the claim path
knows whether a runtime is paused or limited without a statement per poll. The copy is
refreshed when a change is announced on the process-wide control channel, after a
pub/sub reconnect, and on a timer as a fallback.

A pause may carry a reason and an end (`paused_until`): once that time has passed the
pause counts as resumed wherever it is read (this copy, the limited claim's SQL), and
each process wakes the runtime's parked polls at that time from a timer of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

from ..background import stop_task
from ..errors import CacheUnavailable, GatewayError
from ..rows import Controls, ControlsChange, LimitedClaim

log = logging.getLogger("gateway.controls")

# How often each process reloads every runtime's controls, in seconds, when no change
# message arrived: the bound on how long a lost message keeps a change from a process.
REFRESH_SECONDS = 5.0
# What a control-channel message starts with: the rest is the runtime id.
MESSAGE_PREFIX = "controls:"


class ControlsStore(Protocol):
    """What RuntimeControls needs from Postgres (Store)."""

    async def all_controls(self) -> list[Controls]: ...

    async def get_controls(self, runtime_id: str) -> Controls | None: ...

    async def set_controls(self, runtime_id: str, change: ControlsChange) -> Controls: ...

    async def claim_limited(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> LimitedClaim: ...


class ClaimControls(Protocol):
    """What the claim path asks of the controls (RuntimeControls): memory reads, and the
    limited claim."""

    def get(self, runtime_id: str) -> Controls: ...

    def paused(self, runtime_id: str) -> bool: ...

    def limited(self, runtime_id: str) -> bool: ...

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> LimitedClaim: ...


class ControlsCache(Protocol):
    """What RuntimeControls needs from Redis (VerdictCache)."""

    async def publish_control(self, message: str) -> None: ...

    async def wake(self, runtime_ids: list[str]) -> None: ...


class RuntimeControls:
    """This process's copy of every runtime's controls, and the claim path's view of
    them. Owned by the Gateway; `start()`/`stop()` belong to the lifespan. `on_change`
    is called with a runtime id whose controls changed here (the claimer's wake)."""

    def __init__(
        self,
        store: ControlsStore,
        cache: ControlsCache,
        on_change: Callable[[str], None],
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self._store = store
        self._cache = cache
        self._on_change = on_change
        self._refresh_seconds = refresh_seconds
        self._known: dict[str, Controls] = {}
        self._task: asyncio.Task[None] | None = None
        self._refresh_now = asyncio.Event()
        self._background: set[asyncio.Future[None]] = set()
        # Per runtime whose pause has an end: that end, and the timer that wakes the
        # runtime's parked polls then (one timer per runtime, not per poll).
        self._ends: dict[str, tuple[datetime, asyncio.TimerHandle]] = {}

    # -- the claim path's view (memory only) --

    def get(self, runtime_id: str) -> Controls:
        return self._known.get(runtime_id) or Controls(runtime_id)

    def paused(self, runtime_id: str) -> bool:
        """Paused now: a pause past its paused_until counts as resumed at once."""
        controls = self._known.get(runtime_id)
        return controls is not None and controls.paused_now()

    def limited(self, runtime_id: str) -> bool:
        controls = self._known.get(runtime_id)
        return controls is not None and controls.limited

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> LimitedClaim:
        """The limited claim (Postgres enforces the limits under the row lock)."""
        return await self._store.claim_limited(runtime_id, worker_ids, lease_seconds)

    async def slot_freed(self, runtime_ids: Sequence[str]) -> None:
        """Tasks of these runtimes left the claimed state (complete, fail, release,
        lease reclaim): wake the parked polls of those with a max_in_flight, on every
        instance. A no-op, without a round trip, for runtimes without one."""
        limited = sorted({r for r in runtime_ids if (c := self._known.get(r)) and c.max_in_flight})
        if not limited:
            return
        try:
            await self._cache.wake(limited)
        except CacheUnavailable as exc:
            # The held pump claims again within HELD_RECHECK_SECONDS anyway.
            log.warning("wake-up for a freed slot lost: %s", exc.detail)
        for runtime_id in limited:
            self._on_change(runtime_id)

    # -- changes --

    async def change(self, runtime_id: str, change: ControlsChange) -> Controls:
        """Store a change, apply it here, and tell every other instance."""
        controls = await self._store.set_controls(runtime_id, change)
        self._apply(controls)
        try:
            await self._cache.publish_control(MESSAGE_PREFIX + runtime_id)
        except CacheUnavailable as exc:
            log.warning(
                "the change of runtime %s's controls reaches other instances within "
                "%.0f s only (Redis: %s)",
                runtime_id,
                self._refresh_seconds,
                exc.detail,
            )
        return controls

    def on_message(self, message: str) -> None:
        """A message on the control channel (Subscriber callback)."""
        if message.startswith(MESSAGE_PREFIX):
            runtime_id = message[len(MESSAGE_PREFIX) :]
            self._background.add(task := asyncio.ensure_future(self._reload(runtime_id)))
            task.add_done_callback(self._background.discard)

    def refresh_soon(self) -> None:
        """Reload everything now (after a pub/sub reconnect: messages may be lost)."""
        self._refresh_now.set()

    async def _reload(self, runtime_id: str) -> None:
        try:
            controls = await self._store.get_controls(runtime_id)
        except GatewayError as exc:
            log.warning("could not read runtime %s's controls: %s", runtime_id, exc.detail)
            self.refresh_soon()
            return
        self._apply(controls or Controls(runtime_id))

    def _apply(self, controls: Controls) -> None:
        old = self.get(controls.runtime_id)
        if (
            old.updated_at is not None
            and controls.updated_at is not None
            and controls.updated_at < old.updated_at
        ):
            # Two reloads of one runtime raced, and the older read came back last.
            return
        self._known[controls.runtime_id] = controls
        self._schedule_end(controls)
        if replace(old, updated_at=None) != replace(controls, updated_at=None):
            self._on_change(controls.runtime_id)

    def _schedule_end(self, controls: Controls) -> None:
        """Keep one timer for the end of the runtime's pause, if it has one."""
        runtime_id, until = controls.runtime_id, controls.paused_until
        current = self._ends.get(runtime_id)
        if current is not None and until is not None and current[0] == until:
            return
        if current is not None:
            current[1].cancel()
            del self._ends[runtime_id]
        if until is not None and controls.paused_now():
            delay = (until - datetime.now(UTC)).total_seconds()
            handle = asyncio.get_running_loop().call_later(
                max(delay, 0.0), self._pause_ended, runtime_id
            )
            self._ends[runtime_id] = (until, handle)

    def _pause_ended(self, runtime_id: str) -> None:
        """The timer of a pause's end: wake the runtime's parked polls here. Every
        process runs its own, so no message is needed and none is lost."""
        del self._ends[runtime_id]
        controls = self.get(runtime_id)
        if controls.paused_now():
            # The loop's clock ran ahead of the wall clock: wait for the rest.
            self._schedule_end(controls)
            return
        self._on_change(runtime_id)

    async def refresh(self) -> None:
        """Reload every runtime's controls (one statement)."""
        rows = await self._store.all_controls()
        seen = {c.runtime_id for c in rows}
        for controls in rows:
            self._apply(controls)
        for runtime_id in [r for r in self._known if r not in seen]:
            self._apply(Controls(runtime_id))

    async def start(self) -> None:
        try:
            await self.refresh()
        except GatewayError as exc:
            log.warning("runtime controls not loaded yet: %s", exc.detail)
        self._task = asyncio.create_task(self._run(), name="controls-refresh")

    async def stop(self) -> None:
        for _, handle in self._ends.values():
            handle.cancel()
        self._ends.clear()
        if self._task is not None:
            await stop_task(self._task, "controls refresh")
            self._task = None

    async def _run(self) -> None:
        while True:
            self._refresh_now.clear()
            try:
                async with asyncio.timeout(self._refresh_seconds):
                    await self._refresh_now.wait()
            except TimeoutError:
                pass
            try:
                await self.refresh()
            except GatewayError as exc:
                log.warning("could not reload runtime controls: %s", exc.detail)
