"""A gateway's Prometheus samples, read through prometheus-client's public API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gateway.metrics import Metrics

if TYPE_CHECKING:
    from tests.support.gateways import Instance


def sample(source: Instance | Metrics | CollectorRegistry, name: str, **labels: str) -> float:
    """The value of the sample `name` (a counter's with its `_total` suffix) with these
    labels. A labelled child that was never touched has no sample yet and reads 0; a
    name the registry does not know fails the test, so a typo cannot read as 0."""
    if isinstance(source, CollectorRegistry):
        registry = source
    elif isinstance(source, Metrics):
        registry = source.registry
    else:
        registry = source.gateway.metrics.registry
    value = registry.get_sample_value(name, labels)
    if value is not None:
        return value
    families = {family.name: family for family in registry.collect()}
    family = families.get(name) or families.get(name.removesuffix("_total"))
    assert family is not None, f"no metric named {name}"
    assert family.type != "counter" or name.endswith("_total"), f"{name}: a counter's is _total"
    assert labels, f"{name} has no sample"
    for found in family.samples:
        if found.name == name:
            assert set(found.labels) == set(labels), (name, sorted(found.labels), labels)
    return 0.0
