"""CircuitBreaker alone, on an injected clock (I5)."""

from __future__ import annotations

import pytest

from gateway.redis.breaker import CircuitBreaker
from tests.support.clocks import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    # 500 s, as these tests were written: their boundaries are float sums from it.
    return FakeClock(500.0)


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(3, 5.0, clock=clock)


def trip(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        assert breaker.allow()
        breaker.record_failure()


def test_starts_closed(breaker: CircuitBreaker) -> None:
    assert not breaker.is_open
    assert all(breaker.allow() for _ in range(10))


def test_stays_closed_below_threshold(breaker: CircuitBreaker) -> None:
    trip(breaker, 2)
    assert not breaker.is_open
    assert breaker.allow()


def test_opens_at_threshold(breaker: CircuitBreaker) -> None:
    trip(breaker, 3)
    assert breaker.is_open
    assert not breaker.allow()
    assert not breaker.allow()


def test_success_resets_the_consecutive_count(breaker: CircuitBreaker) -> None:
    trip(breaker, 2)
    breaker.record_success()
    trip(breaker, 2)
    assert not breaker.is_open
    assert breaker.allow()
    breaker.record_failure()
    assert breaker.is_open


def test_refuses_until_open_seconds_pass(breaker: CircuitBreaker, clock: FakeClock) -> None:
    trip(breaker, 3)
    clock.now += 4.999
    assert breaker.is_open
    assert not breaker.allow()
    clock.now += 0.001
    assert not breaker.is_open
    assert breaker.allow()  # the probe


def test_half_open_lets_exactly_one_probe_through(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    trip(breaker, 3)
    clock.now += 5.0
    assert breaker.allow()
    # While the probe is in flight, everyone else is still refused.
    assert breaker.is_open
    assert not breaker.allow()
    clock.now += 1.0
    assert not breaker.allow()


def test_probe_success_closes(breaker: CircuitBreaker, clock: FakeClock) -> None:
    trip(breaker, 3)
    clock.now += 5.0
    assert breaker.allow()
    breaker.record_success()
    assert not breaker.is_open
    assert all(breaker.allow() for _ in range(5))
    # Closed again means a fresh count: it takes the full threshold to re-open.
    trip(breaker, 2)
    assert not breaker.is_open


def test_probe_failure_reopens_for_a_full_period(breaker: CircuitBreaker, clock: FakeClock) -> None:
    trip(breaker, 3)
    clock.now += 5.0
    assert breaker.allow()
    clock.now += 0.5  # the probe takes a while, then fails
    breaker.record_failure()
    assert breaker.is_open
    assert not breaker.allow()
    clock.now += 4.9
    assert not breaker.allow()
    clock.now += 0.1
    assert breaker.allow()


def test_threshold_and_period_are_the_constructor_arguments(clock: FakeClock) -> None:
    b = CircuitBreaker(1, 0.5, clock=clock)
    b.record_failure()
    assert b.is_open and not b.allow()
    clock.now += 0.5
    assert b.allow()


def test_default_clock_is_monotonic() -> None:
    b = CircuitBreaker(1, 60.0)
    b.record_failure()
    assert b.is_open
    assert not b.allow()
