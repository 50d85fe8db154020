"""Schemathesis on the batch lease operations with items naming live claimed tasks, so
that the answers checked against the document are successes (completed, queued, dead,
extended) and lease problems rather than not_found only (tests/e2e/test_schemathesis.py
fuzzes them with random ids)."""

from __future__ import annotations

import secrets
from typing import Any

import requests
import schemathesis

from tests.support.gateways import Served
from tests.support.openapi import AUTH, CHECKS, fuzz_settings, schema


def live_tasks(base: str, n: int) -> list[dict[str, Any]]:
    """n tasks of a fresh runtime, claimed; a cancel requested on every third one."""
    runtime = f"{base}/v1/runtimes/live-{secrets.token_hex(6)}"
    body = {"tasks": [{"payload": i, "max_attempts": 1 + i % 2} for i in range(n)]}
    requests.post(f"{runtime}/tasks:batch", json=body, headers=AUTH, timeout=10)
    claim = {"worker_id": "fuzz", "max_tasks": n}
    resp = requests.post(f"{runtime}/claim", json=claim, headers=AUTH, timeout=10)
    tasks: list[dict[str, Any]] = resp.json()["tasks"]
    for task in tasks[::3]:
        requests.post(f"{base}/v1/tasks/{task['id']}/cancel", headers=AUTH, timeout=10)
    return tasks


@schema.include(path_regex=r"^/v1/tasks:").parametrize()
@fuzz_settings
def test_batch_operations_on_live_tasks(case: schemathesis.Case, served: Served) -> None:
    items = case.body.get("tasks") if isinstance(case.body, dict) else None
    if isinstance(items, list) and items:
        live = live_tasks(served.url, min(len(items), 10))
        for item, task in zip(items, live, strict=False):
            if isinstance(item, dict):
                item["id"] = task["id"]
                if "lease_id" in item:
                    item["lease_id"] = task["lease_id"]
    case.call_and_validate(base_url=served.url, checks=CHECKS, timeout=30)
