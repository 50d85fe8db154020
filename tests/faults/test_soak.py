"""The soak's pure parts: the RSS slope, the last half, and the bounds' verdict (the
soak itself is `make soak`, not part of `make test`)."""

from __future__ import annotations

import pytest

from tests.faults.soak import Bounds, Sample, failures, figures, last_half, slope_per_minute


def _samples(rss_per_minute: float = 0.0, pg: int = 10, due: float = 0.5) -> list[Sample]:
    """Ten minutes sampled every 10 s; gateway 1 grows `rss_per_minute` MiB/min."""
    return [
        Sample(t, (100.0, 100.0 + rss_per_minute * t / 60), pg + (t // 10) % 2, 8, due, t)
        for t in range(0, 601, 10)
    ]


def test_the_slope_of_a_line_is_its_rate_per_minute() -> None:
    assert slope_per_minute([(0.0, 5.0), (60.0, 7.0), (120.0, 9.0)]) == pytest.approx(2.0)


def test_the_slope_of_noise_around_a_level_is_about_zero() -> None:
    points = [(float(t), 50.0 + (1 if t % 20 else -1)) for t in range(0, 600, 10)]
    assert abs(slope_per_minute(points)) < 0.05


def test_a_slope_needs_two_distinct_times() -> None:
    assert slope_per_minute([(3.0, 1.0), (3.0, 9.0)]) == 0.0


def test_the_last_half_starts_at_the_middle_of_the_sampled_time() -> None:
    half = last_half(_samples())
    assert half[0].at == 300 and half[-1].at == 600


def test_a_steady_run_holds_its_bounds() -> None:
    assert failures(figures(_samples()), 61, Bounds()) == []


def test_a_growing_gateway_fails_the_rss_bound() -> None:
    found = failures(figures(_samples(rss_per_minute=3.0)), 61, Bounds())
    assert len(found) == 1 and "gateway 1 RSS grew 3.00 MiB/min" in found[0]


def test_connections_that_keep_climbing_fail_the_spread_bound() -> None:
    samples = [Sample(s.at, s.rss_mib, int(s.at // 10), 8, 0.5, 0) for s in _samples()]
    found = failures(figures(samples), len(samples), Bounds())
    assert found == ["Postgres connections ranged 30..60 over the last half, spread > 6"]


def test_a_janitor_falling_behind_fails() -> None:
    found = failures(figures(_samples(due=12.0)), 61, Bounds())
    assert found == ["a due task waited 12.0s queued > 8.0s"]


def test_too_few_samples_cannot_pass() -> None:
    assert failures(figures(_samples()[:3]), 3, Bounds())
