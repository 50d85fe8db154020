"""The targets table: ratios to peers of the same run, bounds, and n/a when unmeasured."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from bench.cli import _details, _park_sizes, _scenarios, _sizes
from bench.stats import Result
from bench.targets import Row, evaluate, targets_table


def _r(scenario: str, label: str, **numbers: Any) -> Result:
    return Result(scenario, label, numbers=numbers)


def _by_target(rows: list[Row]) -> dict[str, Row]:
    return {r.target: r for r in rows}


def test_empty_polls_are_judged_against_the_floor_and_cache_off() -> None:
    rows = _by_target(
        evaluate(
            [
                _r("empty-polls", "cache on", requests_per_second=1000.0, pg_claims_per_poll=0.0),
                _r("empty-polls", "cache off", requests_per_second=500.0),
                _r("empty-polls", "floor", requests_per_second=1200.0),
                _r("empty-polls", "cache on, access log", requests_per_second=880.0),
            ]
        )
    )
    floor = rows["empty polls, cache on vs the bare Starlette floor"]
    assert (floor.value, floor.verdict) == (pytest.approx(1000 / 1200), "PASS")
    assert floor.bound == 0.8
    logged = rows["empty polls, access log on (the default) vs off"]
    assert (logged.value, logged.bound, logged.verdict) == (pytest.approx(0.88), 0.9, "MISS")
    off = rows["empty polls, cache on vs cache off"]
    assert (off.value, off.verdict) == (2.0, "MISS")  # needs 2.5x
    per_poll = rows["empty polls, Postgres transactions per poll (cache on)"]
    assert per_poll.verdict == "PASS"


def test_empty_polls_are_judged_by_cpu_per_answer_when_measured() -> None:
    """Both sides answered as fast as the load generator asked (the same req/s): what
    tells them apart is the server's CPU per answer."""
    rows = _by_target(
        evaluate(
            [
                _r(
                    "empty-polls",
                    "cache on",
                    requests_per_second=4000.0,
                    server_cpu_us_per_request=60.0,
                ),
                _r(
                    "empty-polls",
                    "cache on, access log",
                    requests_per_second=4000.0,
                    server_cpu_us_per_request=70.0,
                ),
                _r(
                    "empty-polls",
                    "floor",
                    requests_per_second=4000.0,
                    server_cpu_us_per_request=45.0,
                ),
            ]
        )
    )
    floor = rows["empty polls, cache on vs the bare Starlette floor"]
    assert (floor.value, floor.verdict) == (pytest.approx(0.75), "MISS")
    assert "req/s 1.00x" in floor.shown
    logged = rows["empty polls, access log on (the default) vs off"]
    assert (logged.value, logged.verdict) == (pytest.approx(60 / 70), "MISS")


def test_a_target_without_its_peer_is_not_available_never_pass() -> None:
    rows = _by_target(evaluate([_r("drain", "single ack", tasks_per_second=900.0)]))
    assert rows["drain, single ack vs pgqueuer"].verdict == "n/a"
    assert rows["wake latency p50"].verdict == "n/a"


def test_drain_and_enqueue_against_pgqueuer_and_a_missing_batch_ack() -> None:
    pgq = _r(
        "pgqueuer",
        "pgqueuer 1.6.0",
        drain={"jobs_per_second": 1000.0},
        batch_enqueue={"jobs_per_second": 4000.0},
    )
    rows = _by_target(
        evaluate(
            [
                _r("drain", "single ack", tasks_per_second=1200.0),
                _r("drain", "batch ack", available=False),
                _r("enqueue", "gateway batch 1000", tasks_per_second=3000.0),
                _r("enqueue", "gateway batch 1000, ids only", tasks_per_second=4400.0),
                pgq,
            ]
        )
    )
    assert rows["drain, single ack vs pgqueuer"].verdict == "PASS"
    batch = rows["drain, batch ack vs pgqueuer"]
    assert batch.verdict == "n/a"
    assert "not available" in batch.shown
    enqueue = rows["batch enqueue (1,000 per request, ids answered) vs pgqueuer"]
    assert enqueue.verdict == "PASS"
    assert enqueue.value == 1.1
    assert "whole tasks answered: 0.75x" in enqueue.shown


def test_batch_enqueue_without_the_ids_only_answer_is_not_available() -> None:
    pgq = _r("pgqueuer", "pgqueuer 1.6.0", batch_enqueue={"jobs_per_second": 4000.0})
    rows = _by_target(
        evaluate(
            [
                _r("enqueue", "gateway batch 1000", tasks_per_second=4400.0),
                _r("enqueue", "gateway batch 1000, ids only", available=False),
                pgq,
            ]
        )
    )
    enqueue = rows["batch enqueue (1,000 per request, ids answered) vs pgqueuer"]
    assert enqueue.verdict == "n/a"
    assert enqueue.shown.startswith("not available") and "1.10x" in enqueue.shown


def test_parked_polls_memory_and_statements() -> None:
    rows = evaluate(
        [
            _r(
                "parked-polls",
                "10000 over 1000",
                parked=10_000,
                kib_per_parked_poll=12.0,
                pg_claims_per_second=0.2,
            ),
            _r("parked-polls", "2000 over 200", parked=2000, kib_per_parked_poll=99.0),
        ]
    )
    parked = [r for r in rows if r.target.startswith("parked")]
    assert [(r.target, r.verdict) for r in parked] == [
        ("parked 10000 over 1000: memory per poll", "PASS"),
        ("parked 10000 over 1000: Postgres statements/s while waiting", "MISS"),
    ]


def test_scale_ratios_use_the_baseline_or_the_smallest_loaded_size() -> None:
    sizes = [0, 10_000, 1_000_000]
    rows = _by_target(
        evaluate(
            [
                _r(
                    "scale",
                    "claim after enqueue, delayed ahead",
                    sizes=sizes,
                    p50_ms=[2.0, 3.0, 5.0],
                ),
                _r("scale", "enqueue", sizes=sizes, p50_ms=[1.0, 4.0, 5.0]),
            ]
        )
    )
    delayed = rows[
        "scale: claim after enqueue, delayed ahead, largest table vs small-runtime baseline"
    ]
    assert (delayed.value, delayed.verdict) == (2.5, "MISS")
    flat = rows["scale: enqueue, largest table vs smallest loaded table"]
    assert (flat.value, flat.verdict) == (1.25, "PASS")


def test_the_janitor_pass_is_compared_from_one_repair_walk_of_runtimes() -> None:
    # Steps: baseline, 1,000 runtimes (less than a walk), 10,000 and 100,000 runtimes,
    # then the same runtimes with history added: the pass grows until the runtimes fill
    # a walk, and must not grow from there to the most runtimes.
    numbers = {
        "sizes": [0, 30_000, 300_000, 3_000_000, 10_000_000],
        "runtimes": [0, 1_000, 10_000, 100_000, 100_000],
        "walk_runtimes": 2_000,
    }
    bounded = _r("scale", "janitor pass", p50_ms=[3.0, 18.0, 90.0, 116.0, 400.0], **numbers)
    [row] = [r for r in evaluate([bounded]) if r.target.startswith("scale: janitor")]
    assert row.value is not None and round(row.value, 2) == 1.29 and row.verdict == "PASS"
    assert "300,000 rows hold 2,000+ runtimes" in row.shown
    growing = _r("scale", "janitor pass", p50_ms=[3.0, 18.0, 90.0, 900.0, 950.0], **numbers)
    [row] = [r for r in evaluate([growing]) if r.target.startswith("scale: janitor")]
    assert (row.value, row.verdict) == (10.0, "MISS")
    # No step fills a walk: the most runtimes against the smallest loaded table; the
    # history step after it (retention deleting) is not judged.
    small = {"sizes": [0, 3_000, 30_000, 100_000], "runtimes": [0, 100, 1_000, 1_000]}
    few = _r("scale", "janitor pass", p50_ms=[5.0, 5.0, 50.0, 500.0], walk_runtimes=2_000, **small)
    [row] = [r for r in evaluate([few]) if r.target.startswith("scale: janitor")]
    assert (row.value, row.verdict) == (10.0, "MISS") and "smallest loaded" in row.shown


def test_the_table_shows_every_row_with_its_verdict() -> None:
    rows = [Row("a target", 1.0, ">=", 2.0, "1.00x", "x"), Row("another", None, "<=", 1.0, "-")]
    text = targets_table(rows)
    assert "a target" in text and "MISS" in text and "n/a" in text


def test_scenario_and_size_options() -> None:
    assert _scenarios("drain,scale") == ["drain", "scale"]
    assert "workers" in _scenarios("all")
    assert _sizes("10000,1_000_000") == [10_000, 1_000_000]
    assert _park_sizes("2000x200,10000x1000") == [(2000, 200), (10_000, 1000)]
    for bad, parse in (("nope", _scenarios), ("0", _sizes), ("2000", _park_sizes)):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)


def test_a_claim_is_judged_by_its_round_trips_on_the_wire() -> None:
    title = "claim: Postgres round trips per claim (counted on the wire)"
    one = {"empty_claim_round_trips": 1.0, "claim_round_trips": 1.0}
    rows = _by_target(
        evaluate(
            [
                _r("round-trips", "cache off", **one),
                _r("round-trips", "cache on", empty_claim_round_trips=0.0, claim_round_trips=1.0),
            ]
        )
    )
    assert (rows[title].value, rows[title].verdict) == (1.0, "PASS")
    # BEGIN, CLAIM, NEXT_DUE, COMMIT: four.
    rows = _by_target(
        evaluate(
            [
                _r("round-trips", "cache off", empty_claim_round_trips=4.0, claim_round_trips=4.0),
                _r("round-trips", "cache on", empty_claim_round_trips=0.0, claim_round_trips=1.0),
            ]
        )
    )
    assert (rows[title].value, rows[title].verdict) == (4.0, "MISS")
    # One variant missing: not measured, never PASS.
    rows = _by_target(evaluate([_r("round-trips", "cache off", **one)]))
    assert rows[title].verdict == "n/a"


def test_a_bulk_insert_is_judged_by_its_rows() -> None:
    def row(seconds: list[float], rows: list[int] | None = None) -> Row:
        result = _r("bulk-insert", "all", rows=rows or [100_000, 1_000_000], seconds=seconds)
        title = "bulk insert of finished tasks: largest vs smallest, in one statement"
        return _by_target(evaluate([result]))[title]

    linear = row([1.0, 9.5])
    assert (linear.value, linear.bound, linear.verdict) == (9.5, 15.0, "PASS")
    assert "for 10x the rows" in linear.shown
    assert row([1.0, 40.0]).verdict == "MISS"  # quadratic: 100x for 10x the rows
    assert row([1.0, 4.0], [10_000, 20_000]).bound == 3.0  # 1.5 times the rows' ratio
    assert row([1.0]).verdict == "n/a"


def test_the_one_at_a_time_drain_with_acks_carried_against_pgqueuer() -> None:
    pgq = _r("pgqueuer", "pgqueuer 1.6.0", drain={"jobs_per_second": 1000.0})
    title = "drain, one at a time (acks carried) vs pgqueuer"
    rows = _by_target(
        evaluate(
            [
                _r("drain", "one at a time, acks carried", tasks_per_second=800.0),
                _r("drain", "one at a time, separate complete", tasks_per_second=500.0),
                pgq,
            ]
        )
    )
    row = rows[title]
    assert (row.value, row.verdict, row.bound) == (0.8, "MISS", 1.0)
    assert row.shown.startswith("0.80x") and "separate complete: 0.50x" in row.shown
    assert title in targets_table(list(rows.values()))
    fast = _by_target(
        evaluate([_r("drain", "one at a time, acks carried", tasks_per_second=1000.0), pgq])
    )[title]
    assert fast.verdict == "PASS" and "separate complete: not measured" in fast.shown
    missing = _by_target(
        evaluate([_r("drain", "one at a time, acks carried", available=False), pgq])
    )[title]
    assert missing.verdict == "n/a" and missing.shown.startswith("not available")
    assert _by_target(evaluate([pgq]))[title].verdict == "n/a"


def test_overload_is_judged_with_admission_control_on_and_off_is_shown_beside() -> None:
    from bench.overload import ENQUEUE, OFF, ON, _ratios

    def phase(ok_per_second: float, p99_ms: float, probe_p99_ms: float | None) -> dict[str, Any]:
        return {
            "ok_per_second": ok_per_second,
            "p99_ms": p99_ms,
            "timeout_share": 0.0,
            "probe": {"p99_ms": probe_p99_ms},
        }

    on = {
        "before": phase(800, 40, 30),
        "overload": phase(760, 900, 120),
        "after": phase(790, 50, 31),
    }
    on["overload"]["timeout_share"] = 0.002
    on["overload"]["probe"]["onset"] = {"ok": 9, "max_ms": 900.0}
    off = {
        "before": phase(800, 40, 30),
        "overload": phase(400, 1990, None),
        "after": phase(500, 900, 700),
    }
    off["overload"]["timeout_share"] = 0.4
    rows = _by_target(
        evaluate(
            [
                _r("overload", f"{ENQUEUE}, {ON}", **on, **_ratios(on)),
                _r("overload", f"{ENQUEUE}, {OFF}", **_ratios(off)),
            ]
        )
    )
    goodput = rows["overload (enqueue): work done/s under 2,000 connections vs before"]
    assert (goodput.value, goodput.verdict) == (0.95, "PASS")
    assert "shedding off: 0.500" in goodput.shown
    accepted = rows["overload (enqueue): accepted p99 vs before"]
    assert accepted.verdict == "PASS"  # 4x
    assert accepted.shown == "4.000 (120.0 vs 30.0 ms; first 1 s apart: 9 let in, largest 900.0 ms)"
    assert rows["overload (enqueue): share of requests reaching the 2 s timeout"].verdict == "PASS"
    after = rows["overload (enqueue): p99 after the overload vs before"]
    assert (after.value, after.verdict) == (1.25, "PASS")
    # Too few accepted answers to know a p99: not measured, never a PASS.
    assert _ratios(off)["accepted_p99_x_before"] is None
    missing = _by_target(evaluate([]))
    assert missing["overload (claim and complete): accepted p99 vs before"].verdict == "n/a"
    assert missing["overload: parked polls answered after their deadline"].verdict == "n/a"


def test_a_burst_is_judged_at_the_end_of_its_watch_against_quiet_runtimes() -> None:
    numbers = {
        "watch_seconds": 90.0,
        "judge_seconds": 15.0,
        "burst_tasks": 1_000_000,
        "burst_seconds": 104.4,
        "table_rows": 11_000_000,
        "vacuum_started_at_s": [0.0],
        "first_claim_ms": 52.9,
        "first_quiet_claim_ms": 4.1,
        "end_claim_p50_ms": 7.2,
        "end_quiet_claim_p50_ms": 4.0,
        "first_stats_ms": 313.0,
        "first_quiet_stats_ms": 75.2,
        "end_stats_p50_ms": 6.8,
        "end_quiet_stats_p50_ms": 1.7,
    }
    rows = _by_target(evaluate([_r("scale", "burst", **numbers)]))
    claim = rows["scale: claim, 90 s after a burst on its runtime vs a quiet runtime"]
    assert claim.value is not None and round(claim.value, 2) == 1.8 and claim.verdict == "PASS"
    assert "first after the burst: 12.9x (52.9 vs 4.1 ms)" in claim.shown
    stats = rows["scale: stats, 90 s after a burst on its runtime vs a quiet runtime"]
    assert (stats.value, stats.bound, stats.verdict) == (4.0, 3.0, "MISS")
    # Not run (--scale-burst 0, or another scenario): not available, never PASS.
    missing = _by_target(evaluate([]))
    assert (
        missing["scale: claim, 90 s after a burst on its runtime vs a quiet runtime"].verdict
        == "n/a"
    )


def test_a_scenario_with_several_variants_shows_each_column_once() -> None:
    """Each variant of a scenario (the overload loads) has the same numbers: its details
    table named every column once per variant."""
    group = [
        Result("overload", f"load {k}", numbers={"goodput_x_before": 1.0, "timeout_share": 0.0})
        for k in range(3)
    ]
    header = _details(group)[2].splitlines()[0]
    names = [h.strip() for h in header.split("|")]
    assert names == ["scenario", "variant", "goodput_x_before", "timeout_share", "checks"]
