"""Runs rows of the fault matrix and prints their table.

A row: fresh servers, steady load for `warmup` s, the fault injected, held and healed,
load for `after` s more, producers stopped, workers kept polling until every task is
finished in Postgres (or `drain` s passed), then the check against the tasks table.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass

from tests.faults.checker import History, Row, Verdict, check
from tests.faults.faults import FAULTS, Fault
from tests.faults.load import Load, LoadShape
from tests.faults.rig import (
    JANITOR_INTERVAL_SECONDS,
    Rig,
    repair_bound_seconds,
    rig,
)
from tests.faults.servers import log


@dataclass(frozen=True)
class Timing:
    """Seconds."""

    warmup: float = 2.0
    after: float = 3.0
    drain: float = 20.0


@dataclass
class RowResult:
    fault: str
    tasks: int
    verdict: Verdict
    recovery_seconds: float | None  # see recovery(); None: nothing delivered after the heal
    server_errors: int
    released: int  # tasks handed out more than once (a lease lost to the fault, reclaimed)
    unproven: str  # why the fault may have had no effect, or ''
    seconds: float

    @property
    def clean(self) -> bool:
        return (
            self.verdict.clean
            and self.tasks > 0
            and self.recovery_seconds is not None
            and not self.unproven
        )

    def problems(self) -> list[str]:
        v = self.verdict
        lines = [f"lost {t}: {why}" for t, why in v.lost.items()]
        lines += [f"unresolved {t}: {why}" for t, why in v.unresolved.items()]
        lines += [f"duplicated {t}: {why}" for t, why in v.duplicated.items()]
        lines += v.stale_empty
        if self.recovery_seconds is None:
            lines.append("no task was delivered after the fault was healed")
        if self.unproven:
            lines.append(self.unproven)
        return lines


async def read_rows(rig: Rig) -> tuple[list[Row], float, int]:
    records = await rig.sql(
        "SELECT id::text AS id, runtime_id, status, attempts, "
        "extract(epoch FROM lease_expires_at)::float8 AS lease_end, "
        "extract(epoch FROM clock_timestamp())::float8 AS now FROM tasks"
    )
    rows = [Row(r["id"], r["runtime_id"], r["status"], r["lease_end"]) for r in records]
    now = records[0]["now"] if records else time.time()
    return rows, now, sum(1 for r in records if r["attempts"] > 1)


async def counter(rig: Rig, name: str) -> float:
    """Counter `name` summed over the gateways that answer."""
    return sum([await g.metric(name) or 0.0 for g in rig.gateways])


async def drain(rig: Rig, seconds: float) -> None:
    """Until no task is left unfinished (completed, or cancelled by its producer), or
    `seconds` passed."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            left = await rig.sql(
                "SELECT 1 FROM tasks WHERE status NOT IN ('completed', 'cancelled') LIMIT 1"
            )
        except OSError:
            left = [None]
        if not left:
            return
        await asyncio.sleep(0.25)


async def run_row(fault: Fault, admin_url: str | None, timing: Timing) -> RowResult:
    started = time.monotonic()
    slug = re.sub(r"[^a-z0-9]+", "-", fault.name.lower()).strip("-")[:40]
    shape = LoadShape(runtimes=(f"{slug}-0", f"{slug}-1", f"{slug}-2", f"{slug}-sparse"))
    async with rig(admin_url, private_postgres=fault.private_postgres, proxy=fault.proxy) as r:
        load = Load(r.urls, r.token, shape)
        await load.start()
        try:
            await asyncio.sleep(timing.warmup)
            before = await counter(r, fault.proof) if fault.proof else 0.0
            await fault.inject(r)
            await asyncio.sleep(fault.hold_seconds)
            await fault.heal(r)
            healed = time.time()
            await asyncio.sleep(timing.after)
            unproven = ""
            if fault.proof and await counter(r, fault.proof) <= before:
                unproven = f"{fault.proof} did not grow: the fault left no trace"
            await load.stop_producing()
            await drain(r, timing.drain)
        finally:
            await load.stop()
        rows, checked_at, released = await read_rows(r)
    verdict = check(
        load.history, rows, checked_at=checked_at,
        janitor_interval=JANITOR_INTERVAL_SECONDS,
        repair_bound=repair_bound_seconds(len(load.shape.runtimes)),
    )  # fmt: skip
    tasks = len({row.task_id for row in rows} | {e.task_id for e in load.history.enqueues})
    return RowResult(
        fault.name, tasks, verdict, recovery(load.history, healed),
        load.server_errors, released, unproven, time.monotonic() - started,
    )  # fmt: skip


def recovery(history: History, healed: float) -> float | None:
    """The longest a task waited after the heal (s): from the later of the heal and its
    enqueue's answer to the first answer that handed it out, over the tasks first handed
    out after the heal. None when no task was handed out after the heal."""
    first: dict[str, float] = {}
    for claim in history.claims:
        for lease in claim.leases:
            first[lease.task_id] = min(first.get(lease.task_id, claim.answered), claim.answered)
    waits = [
        first[e.task_id] - max(e.answered, healed)
        for e in history.enqueues
        if first.get(e.task_id, 0.0) >= healed
    ]
    return max(waits) if waits else None


async def run_matrix(
    names: list[str], admin_url: str | None, timing: Timing | None = None
) -> list[RowResult]:
    results = []
    for name in names:
        log(f"{name} ...")
        started = time.monotonic()
        try:
            result = await run_row(FAULTS[name], admin_url, timing or Timing())
        except Exception as exc:  # one broken row must not hide the others' figures
            log(f"{name}: the row failed: {exc!r}")
            seconds = time.monotonic() - started
            result = RowResult(name, 0, Verdict(), None, 0, 0, f"row failed: {exc!r}", seconds)
        log(f"{name}: {'clean' if result.clean else 'NOT CLEAN'} in {result.seconds:.1f}s")
        results.append(result)
    return results


def table(results: list[RowResult]) -> str:
    lines = [
        "| fault | tasks | lost | duplicated | stale-empty | worst recovery | 5xx | re-leased |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        v = r.verdict
        waited = f"{r.recovery_seconds:.2f} s" if r.recovery_seconds is not None else "none"
        lines.append(
            f"| {r.fault} | {r.tasks} | {len(v.lost) + len(v.unresolved)} | "
            f"{len(v.duplicated)} | {len(v.stale_empty)} | {waited} | {r.server_errors} | "
            f"{r.released} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Every row (or those named in FAULTS_ROWS, comma-separated); exit 1 if any row is
    not clean. Uses FAULTS_DATABASE_URL or TEST_DATABASE_URL for the rows that need no
    private Postgres, else a private cluster."""
    admin_url = os.environ.get("FAULTS_DATABASE_URL") or os.environ.get("TEST_DATABASE_URL")
    chosen = os.environ.get("FAULTS_ROWS")
    names = [n.strip() for n in chosen.split(",")] if chosen else list(FAULTS)
    results = asyncio.run(run_matrix(names, admin_url))
    print(table(results))
    for r in results:
        for line in r.problems()[:20]:
            print(f"- {r.fault}: {line}")
    return 0 if all(r.clean for r in results) else 1
