"""The fault matrix's checker: a pure function over what the clients saw (a `History`)
and the tasks table at the end (`Row`s), sorting every task into completed once,
cancelled, acknowledged-lost, resurrected, lost, duplicated or unresolved, and every
empty claim answer into fine or stale-empty. Tasks that schedules made are the
schedules class's (`check_schedules`): every due tick has exactly one task or a
recorded skip, read from the schedules' tick record.

Times are wall-clock seconds (`time.time()`), the clock Postgres uses on the same
machine. Every verdict is conservative: a request's effect happened somewhere between
its send and its answer, and an operation with no answer (timeout, connection error,
5xx) may or may not have taken effect, so it is only ever used to excuse, never to
accuse.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from gateway.timing import Timing


@dataclass(frozen=True)
class Enqueue:
    """A `201` to an enqueue (or a `200` to its retry with the same idempotency key):
    the task was committed claimable by `answered`. `sent`: when the request that got
    this answer was sent (None when unknown); `replayed`: a 200, the stored task handed
    back, which commits nothing."""

    task_id: str
    runtime: str
    answered: float
    sent: float | None = None
    replayed: bool = False


@dataclass(frozen=True)
class Lease:
    task_id: str
    lease_id: str


@dataclass(frozen=True)
class Claim:
    """A `200` to a claim; `leases` empty means an empty answer."""

    runtime: str
    sent: float
    answered: float
    lease_seconds: float
    leases: tuple[Lease, ...] = ()


@dataclass(frozen=True)
class Complete:
    """A `200` to a complete of `lease_id`, sent at `sent`."""

    task_id: str
    lease_id: str
    sent: float
    answered: float


@dataclass(frozen=True)
class Fail:
    """A `200` to a fail (or a release) of `lease_id`, sent at `sent`: that lease ended
    there, the task not completed (it is queued again, or dead, or cancelled)."""

    task_id: str
    lease_id: str
    sent: float
    answered: float


@dataclass(frozen=True)
class Cancel:
    """A `200` to the producer's cancel of `task_id`: the task may end `cancelled`."""

    task_id: str
    sent: float
    answered: float


@dataclass(frozen=True)
class Unknown:
    """A request with no usable answer (timeout, connection error, 5xx): it may have
    taken effect at any time in [sent, gave_up]. `kind` is enqueue, claim, complete,
    fail or cancel; `task_id` names the task of a cancel (else '')."""

    kind: str
    runtime: str
    sent: float
    gave_up: float
    task_id: str = ""


@dataclass
class History:
    enqueues: list[Enqueue] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    completes: list[Complete] = field(default_factory=list)
    fails: list[Fail] = field(default_factory=list)
    cancels: list[Cancel] = field(default_factory=list)
    unknown: list[Unknown] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One row of the tasks table at check time; `lease_expires_at` in epoch seconds;
    `schedule`: the name of the schedule that made it (None for a producer's task)."""

    task_id: str
    runtime: str
    status: str
    lease_expires_at: float | None = None
    schedule: str | None = None


@dataclass
class Verdict:
    """Task ids per category, and the empty claim answers found stale, with why."""

    completed_once: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)  # ended cancelled by a cancel sent
    # A 2xx whose effect is gone at the end: an enqueue answered 201 whose row is
    # missing, a complete answered 200 whose task did not end completed (a commit
    # acknowledged by a primary and lost with it).
    acknowledged_lost: dict[str, str] = field(default_factory=dict)
    # Completed (a complete answered 200), then handed out again by a claim sent after
    # that answer: the completion was undone.
    resurrected: dict[str, str] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    duplicated: dict[str, str] = field(default_factory=dict)
    unresolved: dict[str, str] = field(default_factory=dict)
    stale_empty: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.acknowledged_lost
            or self.resurrected
            or self.lost
            or self.duplicated
            or self.unresolved
            or self.stale_empty
        )

    def problems(self) -> list[str]:
        """One line per task (or empty answer) in a failing category."""
        kinds = (
            ("acknowledged-lost", self.acknowledged_lost),
            ("resurrected", self.resurrected),
            ("lost", self.lost),
            ("unresolved", self.unresolved),
            ("duplicated", self.duplicated),
        )
        lines = [f"{kind} {task}: {why}" for kind, found in kinds for task, why in found.items()]
        return lines + self.stale_empty


def check(
    history: History,
    rows: list[Row],
    *,
    checked_at: float,
    janitor_interval: float,
    repair_bound: float,
) -> Verdict:
    """Sort every task of `rows` (and every task an answered enqueue names) into one
    category; list the stale-empty answers. `checked_at` is when `rows` were read;
    `repair_bound` is how long (s) a committed claimable task may stay hidden. Rows a
    schedule made are left to `check_schedules`: no producer's answer names them, and
    their schedules keep making them until the check."""
    verdict = Verdict()
    by_id = {row.task_id: row for row in rows if row.schedule is None}
    leases: dict[str, list[tuple[Claim, Lease]]] = defaultdict(list)
    for claim in history.claims:
        for lease in claim.leases:
            leases[lease.task_id].append((claim, lease))
    completes: dict[str, list[Complete]] = defaultdict(list)
    for done in history.completes:
        completes[done.task_id].append(done)
    fails: dict[str, list[Fail]] = defaultdict(list)
    for failed in history.fails:
        fails[failed.task_id].append(failed)
    # A cancel with no answer may have taken effect too: it excuses a cancelled row.
    cancel_sent = {c.task_id for c in history.cancels}
    cancel_sent |= {u.task_id for u in history.unknown if u.kind == "cancel"}

    for task_id in sorted(set(by_id) | {e.task_id for e in history.enqueues}):
        why = _duplicated(leases[task_id], completes[task_id], fails[task_id])
        row = by_id.get(task_id)
        completed_at = min((c.answered for c in completes[task_id]), default=None)
        # A claim sent after a complete's 200 cannot have raced it: the task was done.
        again = [
            c.sent for c, _ in leases[task_id] if completed_at is not None and c.sent > completed_at
        ]
        if again:
            verdict.resurrected[task_id] = (
                f"completed (answered {completed_at:.3f}), handed out again by a claim sent at "
                f"{min(again):.3f}"
            )
        elif row is None:
            verdict.acknowledged_lost[task_id] = "enqueue answered 201 but the row is gone"
        elif completed_at is not None and row.status != "completed":
            verdict.acknowledged_lost[task_id] = (
                f"complete answered 200 at {completed_at:.3f} but the row ended {row.status}"
            )
        elif why:
            verdict.duplicated[task_id] = why
        elif row.status == "completed":
            verdict.completed_once.add(task_id)
        elif row.status == "cancelled" and task_id in cancel_sent:
            verdict.cancelled.add(task_id)
        elif row.status == "claimed":
            expires = row.lease_expires_at or 0.0
            if expires + janitor_interval < checked_at:
                verdict.lost[task_id] = f"stuck claimed {checked_at - expires:.1f}s past its lease"
            else:
                verdict.unresolved[task_id] = "claimed, its lease still running at check time"
        else:
            verdict.lost[task_id] = f"ended {row.status}, never completed"

    verdict.stale_empty = _stale_empty(history, leases, repair_bound)
    return verdict


def _duplicated(held: list[tuple[Claim, Lease]], done: list[Complete], failed: list[Fail]) -> str:
    """Why this task was held twice at once or completed twice, or ''. A fail ends its
    lease as a complete does, but completes nothing: the task may be claimed again."""
    if len({c.lease_id for c in done}) > 1:
        return "completed under two different leases"
    # A lease is surely live from its claim's answer until the earliest of its complete
    # or fail being sent and the earliest moment it could have run out (granted no
    # sooner than the claim was sent).
    ends = [(c.lease_id, c.sent) for c in done] + [(f.lease_id, f.sent) for f in failed]
    spans: list[tuple[float, float, str]] = []
    for claim, lease in held:
        end = claim.sent + claim.lease_seconds
        for lease_id, sent in ends:
            if lease_id == lease.lease_id:
                end = min(end, sent)
        spans.append((claim.answered, end, lease.lease_id))
    spans.sort()
    for i, (start_a, end_a, id_a) in enumerate(spans):
        for start_b, end_b, id_b in spans[i + 1 :]:
            if id_b != id_a and max(start_a, start_b) < min(end_a, end_b):
                return f"leases {id_a} and {id_b} both live at {start_b:.3f}"
    return ""


def _stale_empty(
    history: History, leases: dict[str, list[tuple[Claim, Lease]]], bound: float
) -> list[str]:
    """Empty answers given while a task of the runtime had surely been claimable for
    longer than `bound`. A task is surely claimable from its enqueue's answer until the
    first claim that could have taken it was sent (one that returned it, or one with no
    answer on its runtime), or a cancel of it was sent."""
    lost_claims: dict[str, list[Unknown]] = defaultdict(list)
    cancelled_at: dict[str, float] = {}
    for u in history.unknown:
        if u.kind == "claim":
            lost_claims[u.runtime].append(u)
        elif u.kind == "cancel":
            cancelled_at[u.task_id] = min(cancelled_at.get(u.task_id, u.sent), u.sent)
    for c in history.cancels:
        cancelled_at[c.task_id] = min(cancelled_at.get(c.task_id, c.sent), c.sent)
    windows: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in history.enqueues:
        until = min((c.sent for c, _ in leases[e.task_id]), default=float("inf"))
        until = min(until, cancelled_at.get(e.task_id, until))
        for u in lost_claims[e.runtime]:
            if u.gave_up > e.answered:
                until = min(until, max(u.sent, e.answered))
        windows[e.runtime].append((e.answered, until, e.task_id))
    found = []
    for claim in history.claims:
        if claim.leases:
            continue
        for since, until, task_id in windows[claim.runtime]:
            if claim.answered - since > bound and until > claim.answered:
                found.append(
                    f"claim on {claim.runtime} answered empty at {claim.answered:.3f} while "
                    f"task {task_id} had been claimable for {claim.answered - since:.1f}s"
                )
                break
    return found


# -- the schedules class -------------------------------------------------------------
#
# Times here are the database's aware datetimes (UTC), the clock every tick is computed
# against, not the clients' epoch seconds.

# The most ticks of one schedule counted up to the cut-off: a row's minute of
# every-second ticks is far below it.
MAX_TICKS_PER_SCHEDULE = 100_000


@dataclass(frozen=True)
class Schedule:
    """One schedule of the row: its row's id, runtime and name, its timing as stored,
    and `first_tick`, its first due tick (the `next_run_at` its PUT answered)."""

    schedule_id: int
    runtime: str
    name: str
    first_tick: datetime
    every_seconds: int | None = None
    cron: str | None = None
    timezone: str = "UTC"

    def due(self, until: datetime) -> list[datetime]:
        """Its ticks from the first to `until`, as the gateway computes them."""
        if self.first_tick > until:
            return []
        timing = Timing(self.cron, self.every_seconds, self.timezone)
        ticks = timing.ticks_between(self.first_tick, until, MAX_TICKS_PER_SCHEDULE)
        return [self.first_tick, *ticks]


@dataclass(frozen=True)
class Tick:
    """One row of the tick record (`schedule_ticks`): a tick decided, its outcome
    (enqueued, skipped_overlap, skipped_late, failed) and, when enqueued, its task."""

    schedule_id: int
    tick_at: datetime
    outcome: str
    task_id: str | None = None


@dataclass(frozen=True)
class ScheduledTask:
    """A task a schedule made: its runtime, `schedule` (the schedule's name) and
    `scheduled_for` (its tick's time), as the tasks table holds them."""

    task_id: str
    runtime: str
    schedule: str
    scheduled_for: datetime


@dataclass
class ScheduleVerdict:
    """The schedules class. Keys name a tick as `runtime/schedule@tick time`."""

    due: int = 0  # ticks due by the cut-off, over every schedule
    # The due ticks by the outcome recorded for them ("no tick row" for a task without).
    outcomes: Counter[str] = field(default_factory=Counter)
    # A tick with more than one task, or more than one row in the tick record.
    duplicated: dict[str, str] = field(default_factory=dict)
    # A due tick with neither a task nor a recorded skip: it was silently passed over.
    gaps: dict[str, str] = field(default_factory=dict)
    # The record and the tasks disagree: a tick recorded enqueued whose task is missing,
    # a task whose tick has no row, a tick recorded skipped that made a task anyway.
    unmatched: dict[str, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.duplicated or self.gaps or self.unmatched)

    @property
    def skipped(self) -> int:
        return sum(n for outcome, n in self.outcomes.items() if outcome.startswith("skipped"))

    def summary(self) -> str:
        """The due ticks by outcome, in one line."""
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes.items()))
        return f"{self.due} due ({counts or 'none decided'})"

    def problems(self) -> list[str]:
        kinds = (
            ("duplicated tick", self.duplicated),
            ("silent gap", self.gaps),
            ("tick record and tasks disagree", self.unmatched),
        )
        return [f"{kind} {key}: {why}" for kind, found in kinds for key, why in found.items()]


def check_schedules(
    schedules: list[Schedule],
    ticks: list[Tick],
    tasks: list[ScheduledTask],
    *,
    until: datetime,
) -> ScheduleVerdict:
    """Every tick of `schedules` due by `until` must have exactly one task or a recorded
    skip; every tick recorded or with a task (due or not yet) at most one of each, the
    record and the task agreeing. `ticks` and `tasks` must come from one snapshot (a
    tick's row and its task commit together). `until` is a cut-off by which a live tick
    pass must have decided every tick due."""
    verdict = ScheduleVerdict()
    by_id = {s.schedule_id: s for s in schedules}
    by_name = {(s.runtime, s.name): s.schedule_id for s in schedules}
    recorded: dict[tuple[int, datetime], list[Tick]] = defaultdict(list)
    for tick in ticks:
        recorded[(tick.schedule_id, tick.tick_at)].append(tick)
    made: dict[tuple[int, datetime], list[ScheduledTask]] = defaultdict(list)
    for task in tasks:
        schedule_id = by_name.get((task.runtime, task.schedule))
        if schedule_id is None:
            named = f"{task.runtime}/{task.schedule}@{task.scheduled_for.isoformat()}"
            verdict.unmatched[named] = f"task {task.task_id} names no schedule of the row"
            continue
        made[(schedule_id, task.scheduled_for)].append(task)

    def label(schedule_id: int, tick_at: datetime) -> str:
        s = by_id.get(schedule_id)
        name = f"{s.runtime}/{s.name}" if s is not None else f"schedule {schedule_id}"
        return f"{name}@{tick_at.isoformat()}"

    for key in sorted(set(recorded) | set(made)):
        rows, its_tasks = recorded.get(key, []), made.get(key, [])
        if len(rows) > 1 or len(its_tasks) > 1:
            verdict.duplicated[label(*key)] = (
                f"{len(its_tasks)} tasks ({', '.join(t.task_id for t in its_tasks)}), "
                f"{len(rows)} tick rows"
            )
        elif not rows:
            verdict.unmatched[label(*key)] = f"task {its_tasks[0].task_id} has no tick row"
        elif rows[0].outcome == "enqueued":
            if not its_tasks or its_tasks[0].task_id != rows[0].task_id:
                verdict.unmatched[label(*key)] = (
                    f"recorded enqueued with task {rows[0].task_id}, which is missing"
                )
        elif its_tasks:
            verdict.unmatched[label(*key)] = (
                f"recorded {rows[0].outcome}, yet task {its_tasks[0].task_id} was made"
            )

    for schedule in schedules:
        for tick_at in schedule.due(until):
            key = (schedule.schedule_id, tick_at)
            verdict.due += 1
            if key in recorded:
                verdict.outcomes[recorded[key][0].outcome] += 1
            elif key in made:
                verdict.outcomes["no tick row"] += 1
            else:
                verdict.gaps[label(*key)] = (
                    f"due, and neither a task nor a recorded skip by {until.isoformat()}"
                )
    return verdict
