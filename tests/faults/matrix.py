"""Runs rows of the fault matrix and prints their table.

A row: fresh servers, steady load for `warmup` s, the fault injected, held and healed,
load for `after` s more, producers stopped, workers kept polling until every task is
finished in Postgres (or `drain` s passed), then the check against the tasks table;
for a row with schedules, also the check of their ticks against the tick record.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import os
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field, replace

import asyncpg

from gateway.janitor import LOCK_KEY
from tests.faults import patroni
from tests.faults.checker import History, Row, ScheduleVerdict, Verdict, check
from tests.faults.faults import FAULTS, LEADER_METRIC, Fault, counters, grown, proof_before
from tests.faults.haproxy import haproxy_binary
from tests.faults.load import Load, LoadShape
from tests.faults.rig import (
    JANITOR_INTERVAL_SECONDS,
    Rig,
    repair_bound_seconds,
    rig,
)
from tests.faults.servers import log
from tests.faults.ticks import row_schedules, settled_verdict
from tests.support.ci import IN_CI


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
    unavailable_seconds: float | None = None  # see unavailability(); None: no write failed
    # The longest stretch (s) in which two gateways reported themselves the janitor's
    # leader at once, sampled every LEADER_SAMPLE_SECONDS; see watch_leaders().
    leaders_overlap_seconds: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)
    loss_allowed: bool = False  # acknowledged-lost and resurrected are reported, not failed
    # Answers with a 5xx other than 503, by status: on a failover row each is a failure
    # (a failover may make the gateway refuse, 503, but never err).
    unexpected_5xx: dict[int, int] = field(default_factory=dict)
    skipped: str = ""  # why the row did not run (a server it needs is missing), or ''
    schedules: ScheduleVerdict | None = None  # the schedules class, for a row with schedules

    @property
    def verdict_clean(self) -> bool:
        v = self.verdict
        if not self.loss_allowed:
            return v.clean
        return not (v.lost or v.duplicated or v.unresolved or v.stale_empty)

    @property
    def clean(self) -> bool:
        if self.skipped:
            return True
        return (
            self.verdict_clean
            and self.tasks > 0
            and self.recovery_seconds is not None
            and not self.unproven
            and not self.unexpected_5xx
            and (self.schedules is None or (self.schedules.clean and self.schedules.due > 0))
        )

    def problems(self) -> list[str]:
        if self.skipped:
            return []
        lines = self.verdict.problems()
        if self.recovery_seconds is None:
            lines.append("no task was delivered after the fault was healed")
        if self.unproven:
            lines.append(self.unproven)
        if self.unexpected_5xx:
            lines.append(f"5xx answers other than 503 (status: count): {self.unexpected_5xx}")
        if self.schedules is not None:
            lines += self.schedules.problems()
            if not self.schedules.due:
                lines.append("no schedule tick came due: the schedules class checked nothing")
        return lines


READ_ATTEMPTS = 10


async def sql_retrying(rig: Rig, query: str) -> list[asyncpg.Record]:
    """rig.sql, tried again (once a second, READ_ATTEMPTS in all) on a failure, on the
    leader directly: a node rejoining after a failover (pg_rewind) may refuse a
    connection with an error other than a network one, which the driver does not pass
    over to the next host."""
    with contextlib.suppress(OSError, asyncpg.PostgresError):
        return await rig.sql(query)
    for _ in range(READ_ATTEMPTS - 2):
        with contextlib.suppress(OSError, asyncpg.PostgresError, RuntimeError):
            return await rig.sql(query, direct=True)
        await asyncio.sleep(1.0)
    return await rig.sql(query, direct=True)


async def read_rows(rig: Rig) -> tuple[list[Row], float, int]:
    records = await sql_retrying(
        rig,
        "SELECT id::text AS id, runtime_id, status, attempts, schedule, "
        "extract(epoch FROM lease_expires_at)::float8 AS lease_end, "
        "extract(epoch FROM clock_timestamp())::float8 AS now FROM tasks",
    )
    rows = [
        Row(r["id"], r["runtime_id"], r["status"], r["lease_end"], r["schedule"]) for r in records
    ]
    now = records[0]["now"] if records else time.time()
    # The producers' tasks: a schedule's are counted by the schedules class.
    released = sum(1 for r in records if r["attempts"] > 1 and r["schedule"] is None)
    return rows, now, released


async def counter(rig: Rig, name: str) -> float:
    """Counter `name` summed over the gateways that answer."""
    return sum([await g.metric(name) or 0.0 for g in rig.gateways])


async def drain(rig: Rig, seconds: float) -> None:
    """Until no producer's task is left unfinished (completed, or cancelled by its
    producer), or `seconds` passed. Schedules go on making tasks until the rig stops:
    theirs are the schedules class's, which asks nothing of their status."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            left = await rig.sql(
                "SELECT 1 FROM tasks WHERE status NOT IN ('completed', 'cancelled') "
                "AND schedule IS NULL LIMIT 1"
            )
        except (OSError, asyncpg.PostgresError):  # a failover node mid-rewind, say
            left = [None]
        if not left:
            return
        await asyncio.sleep(0.25)


LEADER_SAMPLE_SECONDS = 0.1
# Producers on a failover row retry an enqueue this long (s): beyond a promotion, which
# waits for the dead primary's leader key to expire (patroni.TTL_SECONDS).
FAILOVER_RETRY_SECONDS = 30.0


async def watch_leaders(rig: Rig, overlaps: list[float]) -> None:
    """Samples every gateway's gateway_janitor_leader until cancelled, appending to
    `overlaps` the length (s) of each stretch in which two or more reported 1 at once.
    A gauge, not the lock itself: it shows how long a gateway believes it leads."""
    since: float | None = None
    while True:
        values = await asyncio.gather(*(g.metric(LEADER_METRIC) for g in rig.gateways))
        now = time.monotonic()
        if sum(1 for v in values if v == 1.0) > 1:
            since = now if since is None else since
        elif since is not None:
            overlaps.append(now - since)
            since = None
        await asyncio.sleep(LEADER_SAMPLE_SECONDS)


# A new leader takes the lock at its next pass (JANITOR_INTERVAL_SECONDS); a leader
# whose connection hangs rather than fails waits for its timeout (5 s) first.
LEADER_WAIT_SECONDS = 20.0


async def one_leader(rig: Rig, seconds: float) -> float | None:
    """When (time.time()) exactly one gateway reported itself the janitor's leader,
    waiting at most `seconds`; None if none did in time."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        values = await asyncio.gather(*(g.metric(LEADER_METRIC) for g in rig.gateways))
        if sum(1 for v in values if v == 1.0) == 1:
            return time.time()
        await asyncio.sleep(LEADER_SAMPLE_SECONDS)
    return None


async def lock_taken(rig: Rig, seconds: float) -> float | None:
    """When (time.time()) the row's database first showed the janitor's advisory lock
    held, polling every LEADER_SAMPLE_SECONDS for at most `seconds`; None if not in
    time. Read on the current primary: after a failover, the lock seen is a new one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            held = await rig.sql(
                "SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND l.granted AND l.objid = $1::bigint::oid "
                "AND d.datname = current_database()",
                LOCK_KEY,
            )
            if held:
                return time.time()
        await asyncio.sleep(LEADER_SAMPLE_SECONDS)
    return None


async def run_row(fault: Fault, admin_url: str | None, timing: Timing) -> RowResult:
    started = time.monotonic()
    slug = re.sub(r"[^a-z0-9]+", "-", fault.name.lower()).strip("-")[:40]
    shape = LoadShape(runtimes=(f"{slug}-0", f"{slug}-1", f"{slug}-2", f"{slug}-sparse"))
    if fault.replication:
        shape = replace(shape, enqueue_retry_seconds=FAILOVER_RETRY_SECONDS)
    if fault.schedules:
        shape = replace(shape, schedules=row_schedules(slug),
                        backfill_every_seconds=BACKFILL_EVERY_SECONDS)  # fmt: skip
    schedules: ScheduleVerdict | None = None
    overlaps: list[float] = []
    async with rig(
        admin_url, private_postgres=fault.private_postgres, proxy=fault.proxy,
        replication=fault.replication, partition=fault.partition, sentinel=fault.sentinel,
        haproxy=fault.haproxy,
    ) as r:  # fmt: skip
        load = Load(r.urls, r.token, shape)
        await load.start()
        r.background.append(asyncio.create_task(watch_leaders(r, overlaps)))
        try:
            await asyncio.sleep(timing.warmup)
            before, unproven = await proof_before(r, fault) if fault.proof else ({}, "")
            injected = time.time()
            await fault.inject(r)
            await asyncio.sleep(fault.hold_seconds)
            await fault.heal(r)
            healed = time.time()
            relocked = asyncio.create_task(lock_taken(r, LEADER_WAIT_SECONDS))
            settling = asyncio.create_task(fault.settled(r)) if fault.settled else None
            if settling is not None:
                r.background.append(settling)  # cancelled with the rig if the row fails
            await asyncio.sleep(timing.after)
            unproven = unproven or (await settling if settling is not None else "")
            if fault.proof and grown(before, await counters(r, fault.proof)) <= 0:
                unproven = unproven or f"{fault.proof} did not grow: the fault left no trace"
            if fault.replication:
                # The lock lived on the old primary: a gateway must take it again on the
                # new one, through the same URL (multi-host, or HAProxy's).
                taken = await relocked
                if taken is None or await one_leader(r, LEADER_WAIT_SECONDS) is None:
                    unproven = unproven or (
                        f"no single janitor leader {LEADER_WAIT_SECONDS:.0f} s after the heal"
                    )
                else:
                    r.notes["janitor lock taken on the new primary"] = (
                        f"{taken - healed:.2f} s after the heal"
                    )
            else:
                relocked.cancel()
            await load.stop_producing()
            await drain(r, timing.drain)
        finally:
            await load.stop()
        rows, checked_at, released = await read_rows(r)
        if fault.schedules:
            schedules = await settled_verdict(r.database_url, load.first_ticks)
            r.notes["schedule ticks"] = schedules.summary()
            r.notes["backfills"] = ", ".join(f"{n} {k}" for k, n in sorted(load.backfills.items()))
        if fault.replication:
            # A retried enqueue carries its first attempt's idempotency key: one
            # producer's enqueue n must be one row, however often it was sent.
            twice = await sql_retrying(
                r, "SELECT payload->>'n' AS n FROM tasks GROUP BY 1 HAVING count(*) > 1"
            )
            replays = sum(1 for e in load.history.enqueues if e.replayed)
            r.notes["enqueues answered by a replay (200)"] = str(replays)
            if twice:
                unproven = f"enqueues stored twice despite their key: n = {[t['n'] for t in twice]}"
        if r.rejoin is not None:
            unproven = unproven or served_through(load.history, *r.rejoin, r.notes)
    verdict = check(
        load.history, rows, checked_at=checked_at,
        janitor_interval=JANITOR_INTERVAL_SECONDS,
        repair_bound=repair_bound_seconds(len(load.shape.runtimes)),
    )  # fmt: skip
    produced = {row.task_id for row in rows if row.schedule is None}
    tasks = len(produced | {e.task_id for e in load.history.enqueues})
    unexpected = {s: n for s, n in load.statuses.items() if s >= 500 and s != 503}
    notes = {k: v for k, v in r.notes.items() if k not in STEP_NOTES}
    return RowResult(
        fault.name, tasks, verdict, recovery(load.history, healed),
        load.server_errors, released, unproven, time.monotonic() - started,
        unavailability(load.history, injected), max(overlaps, default=0.0), notes,
        fault.loss_allowed, unexpected if fault.failover else {}, schedules=schedules,
    )  # fmt: skip


# A row with schedules backfills one of them this often (s), racing the tick passes.
BACKFILL_EVERY_SECONDS = 0.5
# What a fault's steps tell each other through Rig.notes, not figures for the table.
STEP_NOTES = ("old primary's log from", "healed at")


# The longest the gateways may go without committing a write while the old primary
# rejoins (s). A rejoin needs no write to wait: the new primary serves throughout. Tens
# of times what was measured (0.2 to 0.4 s at 40 enqueues/s), well under a failover's
# ttl: a stall this long is an outage, not a slow request.
REJOIN_GAP_SECONDS = 3.0


def served_through(history: History, start: float, end: float, notes: dict[str, str]) -> str:
    """Whether the gateways kept committing writes from `start` to `end` (time.time()),
    while the old primary rejoined: never REJOIN_GAP_SECONDS without a commit answered
    (an enqueue's 201, a complete's 200). Notes the commits, the writes sent in the span
    that got no usable answer, and the longest stretch without a commit; returns the
    problem, or ''."""
    answers = sorted(
        [e.answered for e in history.enqueues if not e.replayed]
        + [c.answered for c in history.completes]
    )
    inside = [a for a in answers if start <= a <= end]
    failed = [u for u in history.unknown if u.kind in WRITES and start <= u.sent <= end]
    longest = max(b - a for a, b in itertools.pairwise([start, *inside, end]))
    notes["while the old primary rejoined"] = (
        f"{len(inside)} writes committed, {len(failed)} got no usable answer, "
        f"longest without a commit {longest:.2f} s"
    )
    if longest > REJOIN_GAP_SECONDS:
        return (
            f"no write committed for {longest:.2f} s while the old primary rejoined "
            f"(bound {REJOIN_GAP_SECONDS:.0f} s)"
        )
    return ""


WRITES = ("enqueue", "complete", "fail", "cancel")


def unavailability(history: History, injected: float) -> float | None:
    """How long (s) writes failed: the longest span from the send of a write that got
    no usable answer (a timeout, a connection error, a 5xx) and was given up after the
    fault was injected (a send before the injection counts from the injection), to the
    answer of the first write sent since then that committed (an enqueue answered 201,
    a complete answered 200). The longest, not the first: a switchover may cut a
    connection or two before the old primary stops, and a write sent again at once
    still succeeds there. Only commits: an empty claim answer may come from the Redis
    verdict without Postgres, and a retried enqueue's 200 hands back the stored task,
    which a primary waiting for its synchronous standby still does at once. None when
    no write failed; infinite when no write committed after one failed."""
    failed = [max(u.sent, injected) for u in history.unknown
              if u.kind in WRITES and u.gave_up >= injected]  # fmt: skip
    if not failed:
        return None
    commits = sorted(
        [(e.sent, e.answered) for e in history.enqueues if e.sent is not None and not e.replayed]
        + [(c.sent, c.answered) for c in history.completes]
    )
    sends = [sent for sent, _ in commits]
    # For each send, the earliest answer among the commits sent at or after it.
    earliest = [float("inf")] * (len(commits) + 1)
    for i in range(len(commits) - 1, -1, -1):
        earliest[i] = min(commits[i][1], earliest[i + 1])
    return max(earliest[bisect.bisect_left(sends, start)] - start for start in failed)


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
        lacking = missing(FAULTS[name])
        if lacking and not IN_CI:
            log(f"{name}: skipped, {lacking} not installed")
            results.append(RowResult(name, 0, Verdict(), None, 0, 0, "", 0.0,
                                     skipped=f"{lacking} not installed"))  # fmt: skip
            continue
        log(f"{name} ...")
        started = time.monotonic()
        if lacking:
            why = f"{lacking} not installed, and CI=true forbids skipping"
            results.append(RowResult(name, 0, Verdict(), None, 0, 0, why, 0.0))
            log(f"{name}: NOT CLEAN, {why}")
            continue
        try:
            result = await run_row(FAULTS[name], admin_url, timing or Timing())
        except Exception as exc:  # one broken row must not hide the others' figures
            log(f"{name}: the row failed: {exc!r}\n{traceback.format_exc()}")
            seconds = time.monotonic() - started
            result = RowResult(name, 0, Verdict(), None, 0, 0, f"row failed: {exc!r}", seconds)
        log(f"{name}: {'clean' if result.clean else 'NOT CLEAN'} in {result.seconds:.1f}s")
        results.append(result)
    return results


def missing(fault: Fault) -> str:
    """What the row needs and this machine lacks, or ''."""
    if fault.replication is not None:
        lacking = [patroni.missing(), "" if not fault.haproxy or haproxy_binary() else "haproxy"]
        return ", ".join(x for x in lacking if x)
    if fault.sentinel and not shutil.which("redis-cli"):
        return "redis-cli"
    return ""


def table(results: list[RowResult]) -> str:
    lines = [
        "| fault | tasks | lost | acknowledged-lost | duplicated | resurrected | stale-empty "
        "| worst recovery | unavailable | 5xx | re-leased | ticks due (duplicated / gaps) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.skipped:
            lines.append(f"| {r.fault} | skipped: {r.skipped} |" + " |" * 10)
            continue
        s = r.schedules
        ticks = "-" if s is None else f"{s.due} ({len(s.duplicated)} / {len(s.gaps)})"
        v = r.verdict
        waited = f"{r.recovery_seconds:.2f} s" if r.recovery_seconds is not None else "none"
        down = f"{r.unavailable_seconds:.2f} s" if r.unavailable_seconds is not None else "none"
        lines.append(
            f"| {r.fault} | {r.tasks} | {len(v.lost) + len(v.unresolved)} | "
            f"{len(v.acknowledged_lost)} | {len(v.duplicated)} | {len(v.resurrected)} | "
            f"{len(v.stale_empty)} | {waited} | {down} | {r.server_errors} | {r.released} "
            f"| {ticks} |"
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
        for what, note in r.notes.items():
            print(f"- {r.fault}: {what}: {note}")
        if r.leaders_overlap_seconds:
            print(f"- {r.fault}: two gateways reported themselves the janitor's leader for "
                  f"up to {r.leaders_overlap_seconds:.2f} s")  # fmt: skip
        for line in r.problems()[:20]:
            print(f"- {r.fault}: {line}")
    return 0 if all(r.clean for r in results) else 1
