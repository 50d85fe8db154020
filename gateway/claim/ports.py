"""The claim path's seams: what the Claimer needs from Postgres, Redis and pub/sub.

The concrete Store, VerdictCache and Subscriber satisfy these structurally (mypy
checks it where instance.py wires them), so tests can run the real Claimer over
in-memory fakes with a virtual clock (tests/sim/).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from ..redis.keys import Keys
from ..redis.verdict import Verdict
from ..rows import CarriedCompletes, ItemResult, Leased


class ClaimStore(Protocol):
    """The statements of the claim path (Store)."""

    async def claim(
        self, runtime_id: str, worker_ids: Sequence[str], lease_seconds: Sequence[float]
    ) -> tuple[list[Leased], float | None]:
        """Lease up to len(worker_ids) claimable tasks, oldest slot first; rows sorted
        by slot. When fewer were found, also the seconds until the runtime's next
        delayed task comes due (None if none), for the verdict's TTL (I4)."""
        ...

    async def claim_acked(
        self,
        runtime_id: str,
        worker_ids: Sequence[str],
        lease_seconds: Sequence[float],
        completes: CarriedCompletes,
    ) -> tuple[list[Leased], float | None, list[ItemResult]]:
        """`claim`, also applying `completes` in the same statement (one commit for
        both), and their outcomes in order. With no worker ids it only applies them.
        StoreUnavailable: nothing was applied."""
        ...

    async def unclaim(
        self, task_ids: Sequence[uuid.UUID], lease_ids: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        """Give back leases that were never delivered, not as an attempt, each task only
        while `lease_ids` still holds it; idempotent. Returns the ids given back."""
        ...

    def client_gone(self, claims: int) -> None:
        """Count `claims` not claimed for because their client left."""
        ...

    def crowded(self) -> bool:
        """True when a claim arriving now would be refused for the database's line
        (gateway/admission.py)."""
        ...

    def connection_free(self) -> bool:
        """True when a statement would not wait for a connection (a hint: sync match
        holds a parked poll for the enqueue's statement only when it is)."""
        ...


class TraceContexts(Protocol):
    """The stored trace contexts of tasks (Store), for the spans of their leases."""

    async def trace_contexts(
        self, task_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[str, str | None]]:
        """(traceparent, tracestate) of those of `task_ids` that have a context."""
        ...


class ClaimCache(Protocol):
    """The versioned empty verdict (VerdictCache). Every failure is CacheUnavailable,
    which callers treat as a miss (I5)."""

    @property
    def healthy(self) -> bool:
        """False after a failed call until one succeeds: wake-ups may be getting lost."""
        ...

    def keys(self, runtime_id: str) -> Keys:
        """The runtime's key and channel names."""
        ...

    async def read(self, runtime_id: str) -> Verdict:
        """The version and whether the verdict under it says empty."""
        ...

    async def write_empty(self, runtime_id: str, version: str, ttl_seconds: float) -> None:
        """Record that a scan begun under `version` found nothing (I2)."""
        ...

    async def renew_empty(self, runtime_id: str, version: str, ttl_seconds: float) -> bool:
        """Write the verdict under `version` again, for `ttl_seconds`, if no bump landed
        since; False if one did."""
        ...

    async def bump(self, runtime_id: str) -> str:
        """Invalidate the verdict and publish a wake-up; after commit (I1)."""
        ...

    async def bump_many(self, runtime_ids: Sequence[str]) -> list[str | None]:
        """`bump` for each, in one round trip: each new version, None where lost."""
        ...

    async def ping(self) -> bool:
        """One round trip; False (never an error) when Redis did not answer."""
        ...


class WakeChannels(Protocol):
    """The process's pub/sub subscriptions (Subscriber). Wake-ups themselves arrive
    through callbacks given to it: a runtime's (Claimer.wake) and, after a reconnect,
    everyone's (Claimer.wake_all, I8)."""

    async def subscribe(self, channel: str) -> bool:
        """Subscribe and wait for confirmation; False if that did not happen in time."""
        ...

    def unsubscribe(self, channel: str) -> None:
        """Stop wanting `channel`."""
        ...

    def confirmed(self, channel: str) -> bool:
        """True when a wake-up published on `channel` now will reach this process."""
        ...
