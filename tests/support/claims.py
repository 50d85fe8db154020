"""The claim path as its tests watch it (tests/integration/test_claim_*.py and the Redis
deployment tests): the app's own counters of claims and verdict reads, waiting for a
runtime's parked polls and pump to settle, timed claim requests, and a runtime's task
rows straight from Postgres.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import asyncpg

from tests.support.databases import fetch
from tests.support.gateways import Instance
from tests.support.metrics import sample
from tests.support.waiting import wait_until


def pg_claims(inst: Instance) -> float:
    return sample(inst, "gateway_postgres_claims_total")


def verdict_hits(inst: Instance) -> float:
    """Verdict checks that skipped Postgres: read in Redis, or from the near-cache."""
    return sample(inst, "gateway_verdict_checks_total", outcome="hit") + sample(
        inst, "gateway_verdict_local_hits_total"
    )


def activity(inst: Instance) -> tuple[float, ...]:
    """Everything that moves while a pump is working: claims and verdict reads (in
    Redis, or from the process's near-cache)."""
    return (
        pg_claims(inst),
        sample(inst, "gateway_verdict_local_hits_total"),
        *(
            sample(inst, "gateway_verdict_checks_total", outcome=o)
            for o in ("hit", "miss", "error")
        ),
    )


async def wait_quiet(inst: Instance, quiet: float = 0.3, within: float = 5.0) -> None:
    """Wait until the instance's claim activity has not moved for `quiet` seconds:
    every parked poll has been checked and the runtime's pump is asleep."""
    deadline = time.monotonic() + within
    last = activity(inst)
    since = time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f"claim activity did not settle within {within:.1f}s")
        await asyncio.sleep(0.02)
        now = activity(inst)
        if now != last:
            last, since = now, time.monotonic()


async def wait_parked(inst: Instance, runtime: str, n: int, within: float = 5.0) -> None:
    """Wait until `n` polls are parked for `runtime` on `inst` and the pump is idle."""
    claimer = inst.gateway.claimer
    await wait_until(lambda: claimer.parked(runtime) == n, within, f"{n} parked polls")
    await wait_quiet(inst, within=within)
    assert claimer.parked(runtime) == n


@dataclass
class Poll:
    """One timed claim request."""

    status: int
    body: Any
    started: float
    answered: float

    @property
    def tasks(self) -> list[dict[str, Any]]:
        assert self.status == 200, self.body
        return list(self.body["tasks"])

    @property
    def elapsed(self) -> float:
        return self.answered - self.started


async def poll(inst: Instance, runtime: str, worker: str = "w", **fields: Any) -> Poll:
    """POST /claim and time it (monotonic clock)."""
    started = time.monotonic()
    status, body = await inst.call(
        "POST", f"/v1/runtimes/{runtime}/claim", {"worker_id": worker, **fields}
    )
    return Poll(status, body, started, time.monotonic())


async def timed_enqueue(inst: Instance, runtime: str, payload: Any = None) -> tuple[dict, float]:
    """Enqueue through the HTTP API; returns (task, monotonic time the request was sent)."""
    sent = time.monotonic()
    task = await inst.enqueue(runtime, payload)
    return task, sent


async def task_rows(database_url: str, runtime: str) -> list[asyncpg.Record]:
    """Every task row of a runtime, straight from Postgres."""
    return await fetch(
        database_url,
        "SELECT id, status, attempts, lease_id FROM tasks WHERE runtime_id = $1",
        runtime,
    )


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel client requests (the server sees the disconnect) and wait for them."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
