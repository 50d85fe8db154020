"""Percentiles, the per-run result record, and the tables printed at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Latency samples (seconds) by "scenario/variant", for the plots; not written to JSON.
SAMPLES: dict[str, list[float]] = {}


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile of unsorted values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 2)


def ratio(part: float | None, whole: float) -> float | None:
    return None if part is None or whole <= 0 else part / whole


@dataclass
class Result:
    """One scenario run against one gateway process."""

    scenario: str
    cache: str
    numbers: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 0.01:
            return f"{value:.5f}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    rule = "-+-".join("-" * w for w in widths)
    body = [
        " | ".join(
            (c.ljust(w) if i < 2 else c.rjust(w))
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    return "\n".join([line, rule, *body])


def claim_throughput_table(results: list[Result]) -> str:
    headers = [
        "scenario",
        "cache",
        "enqueued",
        "completed",
        "tasks/s",
        "claim→done p50/p99 ms",
        "enqueue→done p50/p99 ms",
        "pg claims",
        "pg claims/task",
        "duplicates",
        "gw cpu %",
        "bench cpu %",
        "errors",
        "checks",
    ]
    rows = []
    for r in results:
        n = r.numbers
        rows.append(
            [
                r.scenario,
                r.cache,
                _cell(n.get("enqueued")),
                _cell(n.get("completed")),
                _cell(n.get("tasks_per_second")),
                f"{_cell(n.get('claim_to_done_p50_ms'), 1)} / "
                f"{_cell(n.get('claim_to_done_p99_ms'), 1)}",
                f"{_cell(n.get('enqueue_to_done_p50_ms'), 0)} / "
                f"{_cell(n.get('enqueue_to_done_p99_ms'), 0)}",
                _cell(n.get("pg_claims")),
                _cell(n.get("pg_claims_per_task"), 3),
                _cell(n.get("duplicates")),
                _cell(n.get("gateway_cpu_percent"), 0),
                _cell(n.get("bench_cpu_percent"), 0),
                _cell(n.get("errors")),
                "ok" if r.ok else "FAIL",
            ]
        )
    return table(headers, rows)
