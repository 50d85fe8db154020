"""The performance and scale targets, evaluated on one run's results.

Every target is a ratio to a peer measured in the same run, or a bound that does not
depend on the machine's speed (Postgres statements per poll, bytes per parked poll).
A target whose inputs are missing (a scenario not run, an endpoint not built) is
reported as "n/a", never as PASS.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bulk_insert import linear_bound
from .overload import CLAIM_COMPLETE, ENQUEUE, OFF, ON, PROBE_ONSET_SECONDS, WITH_PARKED
from .stats import Result, table

# Scale: how much an operation may grow from the smallest loaded size to the largest
# and still count as flat.
FLAT_RATIO = 1.5
# A bounded janitor pass may grow this much from the runtimes one pass's repair walk
# visits to the most runtimes loaded.
JANITOR_BOUND_RATIO = 2.0
# Empty polls against the bare Starlette floor (neither writes an access log), and with
# the gateway's default access log against the same gateway without it.
FLOOR_RATIO = 0.8
ACCESS_LOG_RATIO = 0.9
# The empty-polls variant served as `gateway serve` starts by default, access log on.
ACCESS_LOG_LABEL = "cache on, access log"
# After a burst of completions of one runtime (the scale scenario's burst step), its
# claims and its stats, 90 s later, against the same operations on a quiet runtime.
BURST_CLAIM_RATIO = 2.0
BURST_STATS_RATIO = 3.0
# The schedules scenario's targets hold at this many schedules (issue 27's "on time").
SCHEDULES_TARGETED = 10_000


@dataclass
class Row:
    """One target: the measured value, the bound, and how they compare."""

    target: str
    value: float | None
    op: str  # ">=" or "<="
    bound: float
    shown: str  # the value as printed, with its inputs
    unit: str = ""

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        compare: Callable[[float, float], bool] = operator.ge if self.op == ">=" else operator.le
        return "PASS" if compare(self.value, self.bound) else "MISS"

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "value": self.value,
            "bound": f"{self.op} {self.bound:g}{self.unit}",
            "shown": self.shown,
            "verdict": self.verdict,
        }


def find(results: list[Result], scenario: str, label: str) -> Result | None:
    for r in results:
        if r.scenario == scenario and r.cache == label:
            return r
    return None


def number(results: list[Result], scenario: str, label: str, *path: str) -> float | None:
    """A number from a result's numbers (nested keys allowed); None when missing."""
    r = find(results, scenario, label)
    if r is None:
        return None
    value: Any = r.numbers
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _ratio_row(
    target: str, a: float | None, b: float | None, names: tuple[str, str], bound: float, unit: str
) -> Row:
    value = _div(a, b)
    shown = (
        f"{_fmt(value, 2)}x ({names[0]} {_fmt(a)} vs {names[1]} {_fmt(b)} {unit})"
        if value is not None
        else f"not measured ({names[0]} {_fmt(a)}, {names[1]} {_fmt(b)})"
    )
    return Row(target, value, ">=", bound, shown, "x")


def _capacity_row(
    results: list[Result],
    target: str,
    labels: tuple[str, str],
    names: tuple[str, str],
    bound: float,
) -> Row:
    """Empty polls of `labels[0]` against `labels[1]`, judged by what an answer costs
    the server in CPU (the peer's over this one's: the ratio of answers per core), not
    by requests per second. The load generator is one Python process on the same 2
    cores, and the slower side more often than not: both sides then answer about as
    fast as it asks, and a ratio of their rates says more about it than about them.
    The req/s ratio is shown beside it. A run without the CPU figures (an older JSON)
    is judged by req/s."""
    ep = "empty-polls"
    mine, peer = (number(results, ep, label, "server_cpu_us_per_request") for label in labels)
    rates = [number(results, ep, label, "requests_per_second") for label in labels]
    rate_ratio = _div(rates[0], rates[1])
    if mine is None or peer is None:
        return _ratio_row(target, rates[0], rates[1], names, bound, "req/s")
    value = _div(peer, mine)
    shown = (
        f"{_fmt(value, 2)}x by CPU per answer ({names[0]} {_fmt(mine)} vs {names[1]} "
        f"{_fmt(peer)} us); req/s {_fmt(rate_ratio, 2)}x ({_fmt(rates[0])} vs {_fmt(rates[1])})"
    )
    return Row(target, value, ">=", bound, shown, "x")


def _scale_ratio(results: list[Result], op: str, *, first_loaded: bool) -> tuple[float | None, str]:
    """p50 at the largest table over the baseline (0 rows) or the smallest loaded table."""
    r = find(results, "scale", op)
    if r is None:
        return None, "not measured"
    sizes = r.numbers.get("sizes") or []
    p50 = r.numbers.get("p50_ms") or []
    by = dict(zip(sizes, p50, strict=False))
    loaded = [s for s in sizes if s > 0]
    if not loaded or by.get(loaded[-1]) is None:
        return None, "not measured"
    ref = loaded[0] if first_loaded else 0
    value = _div(by.get(loaded[-1]), by.get(ref))
    return value, f"{_fmt(value, 2)}x ({_steps(sizes, by)})"


def _janitor_ratio(results: list[Result]) -> tuple[float | None, str]:
    """The pass at the most runtimes against the pass at the first step whose runtimes
    fill one pass's repair walk (a bounded pass stops growing there), or at the smallest
    loaded table when no earlier step does. Later steps (history added, retention
    deleting) are shown but not judged."""
    r = find(results, "scale", "janitor pass")
    if r is None:
        return None, "not measured"
    sizes = r.numbers.get("sizes") or []
    runtimes = r.numbers.get("runtimes") or []
    walk = r.numbers.get("walk_runtimes") or 0
    if len(runtimes) != len(sizes) or not any(runtimes):
        return _scale_ratio(results, "janitor pass", first_loaded=True)
    by = dict(zip(sizes, r.numbers.get("p50_ms") or [], strict=False))
    steps = list(zip(sizes, runtimes, strict=True))
    most = max(runtimes)
    top = next(s for s, n in steps if n == most)
    full = [s for s, n in steps if walk and n >= walk and s < top]
    ref = full[0] if full else next(s for s, n in steps if n > 0)
    if ref == top or by.get(top) is None:
        return None, f"not measured: one loaded step ({_steps(sizes, by)})"
    value = _div(by.get(top), by.get(ref))
    why = f"{ref:,} rows hold {walk:,}+ runtimes, one pass's walk" if full else "smallest loaded"
    return value, f"{_fmt(value, 2)}x ({_steps(sizes, by)}; {why}; {top:,} rows hold {most:,})"


def _steps(sizes: list[int], by: dict[int, float | None]) -> str:
    return ", ".join(f"{s:,}: {_fmt(by.get(s), 2)} ms" for s in sizes)


def evaluate(results: list[Result]) -> list[Row]:
    rows: list[Row] = []
    ep = "empty-polls"
    on = number(results, ep, "cache on", "requests_per_second")
    rows.append(
        _capacity_row(
            results,
            "empty polls, cache on vs the bare Starlette floor",
            ("cache on", "floor"),
            ("gateway", "floor"),
            FLOOR_RATIO,
        )
    )
    rows.append(
        _capacity_row(
            results,
            "empty polls, access log on (the default) vs off",
            (ACCESS_LOG_LABEL, "cache on"),
            ("on", "off"),
            ACCESS_LOG_RATIO,
        )
    )
    rows.append(
        _ratio_row(
            "empty polls, cache on vs cache off",
            on,
            number(results, ep, "cache off", "requests_per_second"),
            ("on", "off"),
            2.5,
            "req/s",
        )
    )
    per_poll = number(results, ep, "cache on", "pg_claims_per_poll")
    rows.append(
        Row(
            "empty polls, Postgres transactions per poll (cache on)",
            per_poll,
            "<=",
            0.001,
            "-" if per_poll is None else f"{per_poll:.5f}",
        )
    )
    pgq = number(results, "pgqueuer", _pgq_label(results), "drain", "jobs_per_second")
    # Batch acknowledgement is the gateway's own advantage (one complete per claim of
    # ten), so it is held to more than parity: 1.2x.
    for label, bound in (("single ack", 1.0), ("batch ack", 1.2)):
        rows.append(
            _ratio_row(
                f"drain, {label} vs pgqueuer",
                number(results, "drain", label, "tasks_per_second"),
                pgq,
                ("gateway", "pgqueuer"),
                bound,
                "tasks/s",
            )
        )
        measured = find(results, "drain", label)
        if measured is not None and measured.numbers.get("available") is False:
            rows[-1].shown = "not available (POST /v1/tasks:complete answered 404)"
    rows.append(_one_at_a_time_row(results, pgq))
    # Like for like: pgqueuer's batch enqueue answers its jobs' ids, and so does the
    # gateway's when asked (Prefer: return=minimal). The ratio with whole tasks
    # answered (each payload sent back) is shown beside it.
    pgq_enqueue = number(
        results, "pgqueuer", _pgq_label(results), "batch_enqueue", "jobs_per_second"
    )
    whole = _div(number(results, "enqueue", "gateway batch 1000", "tasks_per_second"), pgq_enqueue)
    rows.append(
        _ratio_row(
            "batch enqueue (1,000 per request, ids answered) vs pgqueuer",
            number(results, "enqueue", "gateway batch 1000, ids only", "tasks_per_second"),
            pgq_enqueue,
            ("gateway", "pgqueuer"),
            1.0,
            "tasks/s",
        )
    )
    rows[-1].shown += f"; whole tasks answered: {_fmt(whole, 2)}x"
    ids_only = find(results, "enqueue", "gateway batch 1000, ids only")
    if ids_only is not None and ids_only.numbers.get("available") is False:
        rows[
            -1
        ].shown = f"not available (Prefer: return=minimal ignored); whole tasks: {_fmt(whole, 2)}x"
    rows.append(_round_trips_row(results))
    wake = next((r for r in results if r.scenario == "wake-latency"), None)
    for pct, bound in (("p50", 2.0), ("p99", 5.0)):
        v = None if wake is None else wake.numbers.get(f"{pct}_ms")
        label = "" if wake is None else f" ({wake.cache} runtimes)"
        rows.append(Row(f"wake latency {pct}{label}", v, "<=", bound, f"{_fmt(v, 2)} ms", " ms"))
    for r in results:
        if r.scenario != "parked-polls" or r.numbers.get("parked", 0) < 10_000:
            continue
        kib = r.numbers.get("kib_per_parked_poll")
        rows.append(
            Row(
                f"parked {r.cache}: memory per poll", kib, "<=", 15.0, f"{_fmt(kib, 2)} KiB", " KiB"
            )
        )
        rate = r.numbers.get("pg_claims_per_second")
        pg = r.numbers.get("pg_stat_xacts_per_second")
        rows.append(
            Row(
                f"parked {r.cache}: Postgres statements/s while waiting",
                rate,
                "<=",
                0.0,
                f"{_fmt(rate, 3)} claims/s (app); pg_stat_database {_fmt(pg, 2)} xacts/s "
                "incl. janitor",
                "/s",
            )
        )
    for op, bound, first in (
        ("claim after enqueue, delayed ahead", 2.0, False),
        ("stats, finished tasks", 5.0, False),
        ("enqueue", FLAT_RATIO, True),
        ("claim", FLAT_RATIO, True),
    ):
        value, shown = _scale_ratio(results, op, first_loaded=first)
        against = "smallest loaded table" if first else "small-runtime baseline"
        rows.append(Row(f"scale: {op}, largest table vs {against}", value, "<=", bound, shown, "x"))
    value, shown = _janitor_ratio(results)
    rows.append(
        Row(
            "scale: janitor pass, most runtimes vs one repair walk's worth",
            value,
            "<=",
            JANITOR_BOUND_RATIO,
            shown,
            "x",
        )
    )
    rows += _burst_rows(results)
    rows.append(_bulk_insert_row(results))
    rows += _overload_rows(results)
    rows += _schedule_rows(results)
    return rows


def _schedule_rows(results: list[Result]) -> list[Row]:
    """The schedules scenario: its ticks' lag at the p99 (task created vs its tick's
    time, read from Postgres), and that no tick made a second task. Measured only at
    the full 10,000 schedules (a smaller --schedules run shows its figures in its own
    table)."""
    r = next((r for r in results if r.scenario == "schedules"), None)
    n: dict[str, Any] = {} if r is None else r.numbers
    full = (n.get("schedules") or 0) >= SCHEDULES_TARGETED
    lag, dup = (n.get("lag_p99_ms"), n.get("duplicate_ticks")) if full else (None, None)
    lag_s = None if lag is None else lag / 1000.0
    shown = (
        "not measured"
        if lag_s is None
        else f"{_fmt(lag_s, 3)} s (p50 {_fmt(n.get('lag_p50_ms'), 0)} ms, max "
        f"{_fmt(n.get('lag_max_ms'), 0)} ms; {n.get('ticks_made') or 0:,} of "
        f"{n.get('ticks_expected') or 0:,} ticks)"
    )
    title = f"schedules: tick lag p99 ({SCHEDULES_TARGETED:,} schedules)"
    rows = [Row(title, lag_s, "<=", 1.0, shown, " s")]
    shown = "not measured" if dup is None else f"{dup:,} ({n.get('silent_gaps')} silent gaps)"
    rows.append(Row("schedules: duplicate ticks", dup, "<=", 0.0, shown))
    return rows


def _overload_rows(results: list[Result]) -> list[Row]:
    """The overload scenario's targets, for each load with shedding on; the
    enqueue load's run with it off is shown beside its rows (it shows what the targets
    catch). With parked polls, every poll must be answered by its deadline."""
    specs = [
        ("goodput_x_before", "work done/s under 2,000 connections vs before", ">=", 0.9),
        ("accepted_p99_x_before", "accepted p99 vs before", "<=", 5.0),
        ("timeout_share", "share of requests reaching the 2 s timeout", "<=", 0.01),
        ("after_p99_x_before", "p99 after the overload vs before", "<=", 1.5),
    ]
    rows = []
    for load in (ENQUEUE, CLAIM_COMPLETE, WITH_PARKED):
        on = find(results, "overload", f"{load}, {ON}")
        off = find(results, "overload", f"{load}, {OFF}")
        for key, title, op, bound in specs:
            value = None if on is None else on.numbers.get(key)
            shown = "not measured" if value is None else f"{_fmt(value, 3)}"
            if key == "accepted_p99_x_before" and on is not None and value is not None:
                shown += _onset(on.numbers)
            if off is not None and off.numbers.get(key) is not None:
                shown += f"; shedding off: {_fmt(off.numbers[key], 3)}"
            rows.append(Row(f"overload ({load}): {title}", value, op, bound, shown))
    parked = find(results, "overload", f"{WITH_PARKED}, {ON}")
    late = None if parked is None else parked.numbers.get("parked_late_share")
    summary = {} if parked is None else parked.numbers.get("parked") or {}
    shown = "not measured" if late is None else f"{_fmt(late, 4)} of {summary.get('answers')}"
    rows.append(Row("overload: parked polls answered after their deadline", late, "<=", 0.0, shown))
    return rows


def _onset(numbers: dict[str, Any]) -> str:
    """The accepted p99s in ms, and the answers left out of them: those to requests
    sent in the overload's first PROBE_ONSET_SECONDS, while its connections were being
    opened (bench/overload.py)."""
    before = (numbers.get("before") or {}).get("probe") or {}
    over = (numbers.get("overload") or {}).get("probe") or {}
    onset = over.get("onset") or {}
    if over.get("p99_ms") is None:
        return ""
    text = f" ({_fmt(over.get('p99_ms'))} vs {_fmt(before.get('p99_ms'))} ms"
    if onset.get("ok"):
        text += (
            f"; first {PROBE_ONSET_SECONDS:g} s apart: {onset['ok']} let in, "
            f"largest {_fmt(onset.get('max_ms'))} ms"
        )
    return text + ")"


def _burst_rows(results: list[Result]) -> list[Row]:
    """The burst step's claims and stats on the burst runtime against a quiet runtime:
    the medians over the last part of the watch (about 90 s after the burst), with the
    first of each after the burst shown beside them."""
    r = find(results, "scale", "burst")
    n: dict[str, Any] = {} if r is None else r.numbers
    watch, judge = n.get("watch_seconds") or 0, n.get("judge_seconds") or 0
    out = []
    for op, key, bound in (
        ("claim", "claim", BURST_CLAIM_RATIO),
        ("stats", "stats", BURST_STATS_RATIO),
    ):
        title = f"scale: {op}, {watch or 90:g} s after a burst on its runtime vs a quiet runtime"
        a, b = n.get(f"end_{key}_p50_ms"), n.get(f"end_quiet_{key}_p50_ms")
        value = _div(a, b)
        if value is None:
            out.append(Row(title, None, "<=", bound, "not measured"))
            continue
        fa, fb = n.get(f"first_{key}_ms"), n.get(f"first_quiet_{key}_ms")
        shown = (
            f"{_fmt(value, 2)}x ({_fmt(a, 2)} vs {_fmt(b, 2)} ms, medians of the last "
            f"{judge:g} s); first after the burst: {_fmt(_div(fa, fb), 1)}x ({_fmt(fa, 1)} vs "
            f"{_fmt(fb, 1)} ms); {n.get('burst_tasks') or 0:,} completed in "
            f"{_fmt(n.get('burst_seconds'))} s on {n.get('table_rows') or 0:,} rows; "
            f"VACUUMs began at {n.get('vacuum_started_at_s')} s"
        )
        out.append(Row(title, value, "<=", bound, shown, "x"))
    return out


def _one_at_a_time_row(results: list[Result], pgq: float | None) -> Row:
    """A worker running one task at a time whose claims carry the last task's complete
    (one request per task), against pgqueuer's drain as it runs (its batch size is the
    drain's max_tasks); the same worker sending its complete on its own (two requests
    per task) is shown beside it."""
    row = _ratio_row(
        "drain, one at a time (acks carried) vs pgqueuer",
        number(results, "drain", "one at a time, acks carried", "tasks_per_second"),
        pgq,
        ("gateway", "pgqueuer"),
        1.0,
        "tasks/s",
    )
    carried = find(results, "drain", "one at a time, acks carried")
    if carried is not None and carried.numbers.get("available") is False:
        row.shown = "not available (a claim's complete was refused or not acknowledged)"
    separate = _div(
        number(results, "drain", "one at a time, separate complete", "tasks_per_second"), pgq
    )
    row.shown += "; separate complete: " + (
        "not measured" if separate is None else f"{_fmt(separate, 2)}x"
    )
    # The like-for-like peer, shown beside the target (which stays against pgqueuer's
    # drain as it runs, ten jobs a fetch): pgqueuer fetching one job at a time.
    one = number(results, "drain", "pgqueuer, one job at a time", "tasks_per_second")
    if one is not None:
        like = _div(
            number(results, "drain", "one at a time, acks carried", "tasks_per_second"), one
        )
        row.shown += f"; pgqueuer one job at a time {_fmt(one)} tasks/s: {_fmt(like, 2)}x"
    return row


def _bulk_insert_row(results: list[Result]) -> Row:
    """The largest INSERT of finished tasks against the smallest: at most LINEAR_SLACK
    times its share of the rows (15x for 10x the rows)."""
    title = "bulk insert of finished tasks: largest vs smallest, in one statement"
    r = find(results, "bulk-insert", "all")
    rows = [] if r is None else r.numbers.get("rows") or []
    seconds = [] if r is None else r.numbers.get("seconds") or []
    if len(rows) < 2 or len(seconds) != len(rows):
        return Row(title, None, "<=", 15.0, "not measured")
    bound = linear_bound(rows)
    value = _div(seconds[-1], seconds[0])
    steps = ", ".join(f"{n:,}: {_fmt(s, 2)} s" for n, s in zip(rows, seconds, strict=True))
    shown = f"{_fmt(value, 2)}x for {rows[-1] / rows[0]:g}x the rows ({steps})"
    return Row(title, value, "<=", bound, shown, "x")


def _round_trips_row(results: list[Result]) -> Row:
    """A claim's Postgres round trips, counted on the wire: the most of a claim that
    takes a task (cache on and off) and of an empty claim with the cache off (with it
    on, an empty claim is answered from Redis)."""

    def trips(label: str, key: str) -> float | None:
        r = find(results, "round-trips", label)
        value = None if r is None else r.numbers.get(key)
        return float(value) if isinstance(value, (int, float)) else None

    seen = {
        "empty, cache off": trips("cache off", "empty_claim_round_trips"),
        "with a task, cache off": trips("cache off", "claim_round_trips"),
        "with a task, cache on": trips("cache on", "claim_round_trips"),
    }
    title = "claim: Postgres round trips per claim (counted on the wire)"
    values = [v for v in seen.values() if v is not None]
    if len(values) < len(seen):
        return Row(title, None, "<=", 1.0, "not measured")
    detail = ", ".join(f"{k}: {_fmt(v, 2)}" for k, v in seen.items())
    return Row(title, max(values), "<=", 1.0, f"{_fmt(max(values), 2)} ({detail})")


def _pgq_label(results: list[Result]) -> str:
    r = next((r for r in results if r.scenario == "pgqueuer"), None)
    return r.cache if r is not None else "pgqueuer"


def targets_table(rows: list[Row]) -> str:
    body = [[r.target, r.shown, f"{r.op} {r.bound:g}{r.unit}", r.verdict] for r in rows]
    return table(["target", "measured", "target", "verdict"], body)
