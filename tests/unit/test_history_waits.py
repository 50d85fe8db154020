"""The claim wait's percentiles as the history answers them (store/history.py): read
from the counts of fixed wait buckets, the upper bound of the bucket the rank falls in,
the last bucket's lower bound for the open one, and None with nothing counted."""

from __future__ import annotations

import pytest

from gateway.store.history import WAIT_BOUNDS_SECONDS, wait_percentile
from gateway.store.sql.history import WAIT_BUCKETS


def counts(**at_bound: int) -> list[int]:
    """Wait-bucket counts, given as {upper bound in tenths of a second: count}."""
    out = [0] * WAIT_BUCKETS
    for key, n in at_bound.items():
        out[WAIT_BOUNDS_SECONDS.index(int(key.removeprefix("b")) / 10)] = n
    return out


def test_one_count_per_bound_and_one_for_longer_waits() -> None:
    assert WAIT_BUCKETS == len(WAIT_BOUNDS_SECONDS) + 1


def test_nothing_counted_has_no_percentile() -> None:
    assert wait_percentile([0] * WAIT_BUCKETS, 0.5) is None


@pytest.mark.parametrize(
    ("waits", "p50", "p95"),
    [
        (counts(b1=1), 0.1, 0.1),
        (counts(b10=10, b300=9, b1200=1), 1.0, 30.0),
        (counts(b50=19, b36000=1), 5.0, 5.0),
        (counts(b50=18, b36000=2), 5.0, 3600.0),
    ],
)
def test_the_bound_of_the_bucket_the_rank_falls_in(
    waits: list[int], p50: float, p95: float
) -> None:
    assert (wait_percentile(waits, 0.5), wait_percentile(waits, 0.95)) == (p50, p95)


def test_waits_past_the_last_bound_read_as_it() -> None:
    waits = [0] * WAIT_BUCKETS
    waits[-1] = 3
    assert wait_percentile(waits, 0.5) == WAIT_BOUNDS_SECONDS[-1]
