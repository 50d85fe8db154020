"""tests.support.metrics.sample: the suite's one way to read a metric, strict about names."""

from __future__ import annotations

import pytest

from gateway.metrics import Metrics
from tests.support.metrics import sample


def test_reads_counters_gauges_and_labelled_children() -> None:
    metrics = Metrics()
    metrics.repairs.inc(2)
    metrics.janitor_leader.set(1)
    metrics.verdict_checks.labels("hit").inc()
    assert sample(metrics, "gateway_verdict_repairs_total") == 2
    assert sample(metrics.registry, "gateway_janitor_leader") == 1
    assert sample(metrics, "gateway_verdict_checks_total", outcome="hit") == 1


def test_a_labelled_child_never_touched_reads_zero() -> None:
    assert sample(Metrics(), "gateway_leases_reclaimed_total", outcome="queued") == 0


@pytest.mark.parametrize(
    ("name", "labels"),
    [
        ("gateway_no_such_metric_total", {}),
        ("gateway_no_such_metric_total", {"outcome": "hit"}),
        ("gateway_verdict_repairs", {}),  # a counter's sample is _total
        ("gateway_verdict_checks", {"outcome": "hit"}),
    ],
)
def test_a_name_the_registry_does_not_have_fails(name: str, labels: dict[str, str]) -> None:
    with pytest.raises(AssertionError):
        sample(Metrics(), name, **labels)


def test_a_wrong_label_name_fails_once_the_metric_has_children() -> None:
    metrics = Metrics()
    metrics.verdict_checks.labels("hit").inc()
    with pytest.raises(AssertionError):
        sample(metrics, "gateway_verdict_checks_total", reason="hit")
