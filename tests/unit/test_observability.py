"""deploy/observability: the Grafana dashboard is valid JSON, the PrometheusRule valid
YAML, and every metric they name exists in the gateway's registry, so that a renamed
metric cannot leave a silent panel or an alert that never fires."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.metrics import Metrics

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "observability"
DASHBOARD = FOLDER / "grafana-dashboard.json"
RULES = FOLDER / "prometheus-rules.yaml"
METRIC_NAME = re.compile(r"\bgateway_[a-z0-9_]+")

# The series names prometheus-client writes for each kind of metric family.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
}


def exported_names() -> set[str]:
    """Every series name the gateway's registry can export, sampled or not yet."""
    names = set()
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        for value in node.values():
            yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from dashboard_exprs(value)


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert document["kind"] == "PrometheusRule"
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    return [rule for group in document["spec"]["groups"] for rule in group["rules"]]


def test_the_dashboard_is_grafana_json_with_a_query_per_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_rules_alert_on_what_the_issue_asks() -> None:
    found = rules()
    for rule in found:
        assert rule["alert"] and rule["expr"] and rule["for"], rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"], rule
    exprs = " ".join(rule["expr"] for rule in found)
    for metric in (
        "gateway_verdict_repairs_total",
        "gateway_redis_breaker_open",
        "gateway_oldest_queued_age_seconds",
        'gateway_http_requests_total{status_class="5xx"}',
    ):
        assert metric in exprs


def test_every_metric_they_name_is_exported() -> None:
    exported = exported_names()
    used = set()
    exprs = [*dashboard_exprs(json.loads(DASHBOARD.read_text())), *(r["expr"] for r in rules())]
    for expr in exprs:
        used.update(METRIC_NAME.findall(expr))
    for rule in rules():  # descriptions name metrics to look at, too
        used.update(METRIC_NAME.findall(rule["annotations"].get("description", "")))
    assert used, "no metric found: the pattern is wrong"
    assert sorted(used - exported) == []


def test_the_check_knows_the_exported_names() -> None:
    exported = exported_names()
    assert "gateway_http_requests_total" in exported  # labelled, no sample yet
    assert "gateway_claim_delay_seconds_bucket" in exported
    assert "gateway_parked_polls" in exported
    assert "gateway_parked_polls_total" not in exported


def test_the_metrics_page_lists_every_metric_once() -> None:
    page = (FOLDER.parents[1] / "docs" / "operations" / "metrics.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `gateway_")]
    listed = [METRIC_NAME.findall(row)[0] for row in rows]
    expected = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in Metrics().registry.collect()
    }
    assert sorted(listed) == sorted(expected)
