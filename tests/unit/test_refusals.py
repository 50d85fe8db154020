"""The refusals per reason over the last minutes (gateway/refusals.py), on a clock the
test moves: the last minute slides in 10 s steps, each minute of the clock is summed,
and what is older than the window is forgotten."""

from __future__ import annotations

from gateway.refusals import WINDOW_MINUTES, Refusals


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_counts_by_reason_and_minute_slide_and_expire() -> None:
    clock = Clock(600.0)  # 00:10:00 of the epoch
    tally = Refusals(clock)
    assert tally.last_minute() == {}
    minutes = tally.per_minute()
    assert len(minutes) == WINDOW_MINUTES
    assert [m.start for m in minutes] == [60 * n for n in range(1, 11)]
    assert all(m.counts == {} for m in minutes)

    tally.add("database_queue")
    tally.add("database_queue")
    clock.now = 655.0  # the same minute, a later bucket
    tally.add("client_gone")
    assert tally.last_minute() == {"database_queue": 2, "client_gone": 1}
    assert tally.per_minute()[-1].counts == {"database_queue": 2, "client_gone": 1}

    clock.now = 665.0  # the first bucket is more than 60 s behind the current one
    assert tally.last_minute() == {"client_gone": 1}
    tally.add("database_queue")
    minutes = tally.per_minute()
    assert minutes[-1].start == 660 and minutes[-1].counts == {"database_queue": 1}
    assert minutes[-2].start == 600
    assert minutes[-2].counts == {"database_queue": 2, "client_gone": 1}

    clock.now = 665.0 + 60 * WINDOW_MINUTES  # ten minutes on: all out of the window
    assert tally.last_minute() == {}
    assert all(m.counts == {} for m in tally.per_minute())
    tally.add("client_gone")  # a new bucket drops the old ones
    assert len(tally._buckets) == 1
