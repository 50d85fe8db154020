"""A claim store for the claimer's unit tests of the claim slots and of claims whose client
left (tests/unit/test_claim_slots.py, test_claim_slot_edges.py,
test_claims_whose_client_left.py): each claim statement waits for its runtime's gate, so
that a test decides when claim slots come free, and every statement is recorded.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from gateway.api.requests import ClaimRequest
from gateway.claim.claimer import Claimer
from gateway.metrics import Metrics
from gateway.rows import ItemResult, Leased
from gateway.settings import Settings
from tests.sim.fakes import FakeWakeChannels, NoCache


def leased_task() -> Any:
    """A task row as a claim statement returns it, leased."""
    return SimpleNamespace(id=uuid.uuid4(), lease_id=uuid.uuid4(), lease_expires_at=None)


class GatedClaimStore:
    """`claims`: each claim statement's runtime and the slots it asked for (a statement
    that only applies completes asks for 0); `acked`: the completes each applied;
    `unclaims`: each give-back's tasks, sent once `unclaim_gate` is set; `gone_claims`:
    claims counted as not claimed for. `lease`: a claim leases a task per slot, else
    finds none."""

    def __init__(self, lease: bool = False) -> None:
        self.lease = lease
        self.gates: dict[str, asyncio.Event] = {}
        self.claims: list[tuple[str, int]] = []
        self.acked: list[list[uuid.UUID]] = []
        self.unclaims: list[list[uuid.UUID]] = []
        self.unclaim_gate = asyncio.Event()
        self.unclaim_gate.set()
        self.gone_claims = 0

    def open(self, runtime_id: str) -> None:
        """Let the runtime's claim statements, waiting or to come, end."""
        self.gates.setdefault(runtime_id, asyncio.Event()).set()

    def runtimes_claimed(self) -> list[str]:
        return [runtime for runtime, _ in self.claims]

    def client_gone(self, claims: int) -> None:
        self.gone_claims += claims

    def crowded(self) -> bool:
        return False

    def connection_free(self) -> bool:
        return True

    async def claim(self, runtime_id: str, workers: Any, leases: Any) -> Any:
        self.claims.append((runtime_id, len(workers)))
        await self.gates.setdefault(runtime_id, asyncio.Event()).wait()
        if not self.lease:
            return [], None
        return [Leased(k + 1, leased_task()) for k in range(len(workers))], None

    async def claim_acked(self, runtime_id: str, workers: Any, leases: Any, completes: Any) -> Any:
        self.acked.append(list(completes.task_ids))
        rows, due_in = await self.claim(runtime_id, workers, leases)
        return rows, due_in, [ItemResult(t, runtime_id, "completed") for t in completes.task_ids]

    async def unclaim(self, task_ids: Any, lease_ids: Any) -> list[uuid.UUID]:
        await self.unclaim_gate.wait()
        self.unclaims.append(list(task_ids))
        return list(task_ids)


def make_claimer(store: GatedClaimStore, **settings: Any) -> tuple[Claimer, Metrics]:
    """A Claimer over `store`, without Redis, with one claim slot unless `settings` say
    otherwise."""
    metrics = Metrics()
    cfg = Settings(**{"cache_enabled": False, "max_concurrent_claims": 1, **settings})
    claimer = Claimer(store, NoCache(), FakeWakeChannels("t"), cfg, metrics)  # type: ignore[arg-type]
    return claimer, metrics


def claim_request(wait: float = 0.0, max_tasks: int = 1) -> ClaimRequest:
    return ClaimRequest(worker_id="w", max_tasks=max_tasks, wait_seconds=wait, lease_seconds=60)


async def settle() -> None:
    """Let every ready task run until it waits."""
    for _ in range(20):
        await asyncio.sleep(0)
