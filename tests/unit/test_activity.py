"""The per-instance sliding minute of tasks handed out (gateway/claim/activity.py), on a fake
clock."""

from __future__ import annotations

from gateway.claim.activity import BUCKET_SECONDS, BUCKETS, ClaimActivity
from tests.support.clocks import FakeClock


def test_counts_sum_over_the_last_minute_per_runtime() -> None:
    clock = FakeClock()
    act = ClaimActivity(clock)
    act.add("a", 3)
    clock.now += 20
    act.add("a", 2)
    act.add("b", 1)
    act.add("c", 0)  # nothing handed out: not a runtime with activity
    assert (act.last_minute("a"), act.last_minute("b"), act.last_minute("c")) == (5, 1, 0)
    assert act.counts() == {"a": 5, "b": 1}


def test_a_bucket_leaves_the_window_after_a_minute_and_is_dropped() -> None:
    clock = FakeClock()  # 1000 s: the start of a 5 s bucket
    act = ClaimActivity(clock)
    act.add("a", 4)
    clock.now += BUCKET_SECONDS * (BUCKETS - 1) + 4.9  # the last moment of the minute
    act.add("a", 1)
    assert act.last_minute("a") == 5
    assert act.counts() == {"a": 5}
    clock.now += 0.1  # the first bucket is now a minute old
    assert act.last_minute("a") == 1
    assert act.counts() == {"a": 1}
    clock.now += BUCKET_SECONDS * BUCKETS
    assert act.last_minute("a") == 0
    assert act.counts() == {}
    assert act._buckets == {}  # an idle runtime costs nothing
